"""`LabSuite.checklist`: the checklist derived from the reference solution names exactly the state-changing reference
calls (what the verifier checks), the no-error rule and a count answer; and the ``judge`` reward's replay: a
trajectory whose tool outputs were imagined is judged on the real outputs once replayed on a fresh lab backend."""

from __future__ import annotations

import copy

import pytest

from agents.judges import LocalJudge
from agents.policy import Policy
from agents.training.demonstrations import demonstration_env, demonstration_for_task
from benchmarks.lab import LabSuite
from benchmarks.lab.suite import stated_suite
from envace_gym.judging import score_with_judge, with_real_observations


@pytest.mark.parametrize("suite", [LabSuite(), stated_suite()], ids=["hidden", "stated"])
def test_checklists_name_the_state_changing_reference_calls(suite):
    for category in suite.categories:
        task = suite.tasks([category], "test")[0]
        checklist = suite.checklist(task)
        assert checklist.task_id == task.id and len(checklist.turns) == task.num_turns
        for turn, items in zip(suite.ground_truth(task), checklist.turns):
            named = [i.item for i in items if i.item.startswith("The assistant called ")]
            writes = [c for c in turn if c.name in ("move", "pack", "ship")]
            assert [n.split("(")[0].removeprefix("The assistant called ") for n in named] == [c.name for c in writes]
            assert items[len(named)].item.startswith("None of the assistant's tool calls")
        if task.metadata.get("answer") is not None:
            assert f"gives {task.metadata['answer']} as the number" in checklist.turns[-1][-1].item


@pytest.fixture(scope="module")
def played(smol_tokenizer):
    suite = stated_suite()
    task = suite.tasks(["ship"], "test")[0]
    env = demonstration_env(smol_tokenizer, "lab-stated", tasks=[task])
    trajectory, reward = demonstration_for_task(env, task)
    assert reward == 1.0
    return suite, task, trajectory


def test_imagined_outputs_are_replaced_by_the_real_ones(played):
    suite, task, real = played
    imagined = copy.deepcopy(real)
    for m in imagined.messages:
        if m.role == "tool":
            m.content = '{"box": "box-99"}'  # a rehearsal that got the packing label wrong
    replayed = with_real_observations(imagined, suite.make_backend(task))
    assert [m.content for m in replayed.messages] == [m.content for m in real.messages]
    assert any(m.content == '{"box": "box-99"}' for m in imagined.messages)  # untouched


def test_the_judge_reward_judges_the_replayed_conversation(played, smol_tokenizer, tiny_model):
    suite, task, real = played
    judge = LocalJudge(policy=Policy(tiny_model, smol_tokenizer, kv_cache=False), max_new_tokens=2)
    imagined = copy.deepcopy(real)
    for m in imagined.messages:
        if m.role == "tool":
            m.content = "imagined"
    checklist = suite.checklist(task)
    score_with_judge(real, checklist, judge)
    asked = judge.stats.generated
    score_with_judge(imagined, checklist, judge, backend=suite.make_backend(task))  # "judge": the real outputs
    assert judge.stats.generated == asked and judge.stats.cache_hits == asked  # the very prompts of the real run
    score_with_judge(imagined, checklist, judge)  # "judge_imagined": what the policy imagined is judged
    assert judge.stats.generated == 2 * asked
