"""τ²'s ``NL_ASSERTION`` reward through a judge (`benchmarks.tau2.nl_assertions`): the prompts are τ²'s own (compared
with the installed ``evaluator_nl_assertions.py``, read as a syntax tree since importing it needs litellm); a judged
suite includes NL tasks and multiplies their judged reward into R; an unreadable reply scores as configured and is
counted; a judge that cannot be reached is an error, not a reward of 0; τ² tasks give checklists.

The judges are real tiny Llamas (`tests.judge_models`: weights set to answer one text; ``tiny-random``: unreadable)."""

from __future__ import annotations

import ast
import copy
import json
import socket
from pathlib import Path

import pytest

from agents.judges import LocalJudge, OpenAIJudge
from agents.policy import Policy
from benchmarks.tau2 import Tau2Suite
from benchmarks.tau2.nl_assertions import NL_ASSERTIONS_SYSTEM_PROMPT, nl_assertions_user_prompt
from benchmarks.tau2.suite import _exclusion
from envace_gym.judging import JudgeError
from envace_gym.types import Message, Task, ToolCall, Trajectory
from tests.judge_models import fixed_reply_policy

MET = '{"results": [{ "metExpectation" : true }]}'  # spaced so that no token repeats (tests.judge_models)
NOT_MET = '{"results": [{ "metExpectation" : false }]}'


def tau2_source() -> ast.Module:
    import tau2

    path = Path(tau2.__file__).parent / "evaluator" / "evaluator_nl_assertions.py"
    return ast.parse(path.read_text(encoding="utf-8"))


def test_the_prompts_are_tau2s_own():
    assigned = {
        node.targets[0].id: node.value
        for node in ast.walk(tau2_source())
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
    }
    assert assigned["system_prompt"].value == NL_ASSERTIONS_SYSTEM_PROMPT
    values = {"trajectory_str": "user: hi\nassistant: hello", "nl_assertions": ["The agent greeted", "It's done"]}
    rebuilt = "".join(
        part.value if isinstance(part, ast.Constant) else str(values[part.value.id])
        for part in assigned["user_prompt"].values
    )
    assert rebuilt == nl_assertions_user_prompt(values["trajectory_str"], values["nl_assertions"])


def test_a_judge_lifts_only_the_nl_exclusion_and_the_counts_of_the_offered_domains_stay():
    from tau2.data_model.tasks import Task as TauTask

    plain, judged = Tau2Suite(), Tau2Suite(judge=OpenAIJudge("unused", "http://127.0.0.1:9/v1"))
    for domain in ("airline", "retail", "mock"):
        assert len(plain.tasks([domain], "all")) == len(judged.tasks([domain], "all"))
        assert plain.excluded[domain] == judged.excluded[domain]  # no offered task has an NL_ASSERTION reward
    raw = copy.deepcopy(plain.tasks(["mock"], "all")[0].metadata["tau2_task"])
    raw["evaluation_criteria"]["reward_basis"] = ["DB", "NL_ASSERTION"]
    tau = TauTask.model_validate(raw)
    assert _exclusion(tau) == "NL_ASSERTION reward (needs an LLM judge)"
    assert _exclusion(tau, judged=True) is None


def nl_task(suite: Tau2Suite) -> Task:
    """τ²'s mock ``create_task_1`` with an NL_ASSERTION reward (its own assertion: the agent confirmed the task was
    created), as a task with that basis would be built by the suite."""
    (task,) = [t for t in suite.tasks(["mock"], "all") if t.id == "mock_create_task_1"]
    task = copy.deepcopy(task)
    task.metadata["tau2_task"]["evaluation_criteria"]["reward_basis"] = ["DB", "NL_ASSERTION"]
    task.metadata["reward_basis"] = ["DB", "NL_ASSERTION"]
    return task


def reference_trajectory(task: Task, close: str = "I created the task 'Important Meeting' for you.") -> Trajectory:
    call = ToolCall("create_task", {"user_id": "user_1", "title": "Important Meeting"}, id="c1")
    return Trajectory(
        task=task,
        messages=[
            *task.turns[0],
            Message("assistant", "", tool_calls=[call]),
            Message("tool", "(recorded output)", tool_call_id="c1", name="create_task"),
            Message("assistant", close),
        ],
        terminated=True,
    )


@pytest.fixture(scope="module")
def judges(smol_tokenizer, tiny_model):
    return {
        "met": fixed_reply_policy(smol_tokenizer, MET),
        "not_met": fixed_reply_policy(smol_tokenizer, NOT_MET),
        "random": Policy(tiny_model, smol_tokenizer, kv_cache=False),
    }


def test_the_judged_nl_reward_multiplies_into_r(judges):
    met = LocalJudge(policy=judges["met"], max_new_tokens=24)
    suite = Tau2Suite(judge=met)
    task = nl_task(suite)
    result = suite.verify(reference_trajectory(task))
    assert result.reward == 1.0 and result.details["reward_breakdown"]["NL_ASSERTION"] == 1.0
    assert result.details["nl_assertions"][0]["met"] is True and met.stats.verdicts == 1
    no_call = Trajectory(task=task, messages=[*task.turns[0], Message("assistant", "Done.")], terminated=True)
    assert suite.verify(no_call).reward == 0.0  # the judge says met, but the DB check fails: R is the product
    not_met = Tau2Suite(judge=LocalJudge(policy=judges["not_met"], max_new_tokens=24))
    assert not_met.verify(reference_trajectory(task)).reward == 0.0


def test_an_unreadable_reply_scores_as_configured_and_is_counted(judges):
    judge = LocalJudge(policy=judges["random"], max_new_tokens=8)
    task = nl_task(Tau2Suite())
    zero = Tau2Suite(judge=judge).verify(reference_trajectory(task))
    assert zero.reward == 0.0 and zero.details["nl_parsed"] is False and judge.stats.unparseable == 1
    one = Tau2Suite(judge=judge, nl_unparseable_score=1.0).verify(reference_trajectory(task))
    assert one.reward == 1.0 and judge.stats.unparseable == 2 and judge.stats.cache_hits == 1  # the same prompt
    with pytest.raises(ValueError, match="nl_unparseable_score"):
        Tau2Suite(judge=judge, nl_unparseable_score=-1)


def test_without_a_judge_an_nl_task_scores_zero_with_the_reason():
    task = nl_task(Tau2Suite())
    result = Tau2Suite().verify(reference_trajectory(task))
    assert result.reward == 0.0 and "judge" in result.details["error"]


def test_an_unreachable_judge_is_an_error_not_a_zero():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    suite = Tau2Suite(judge=OpenAIJudge("m", f"http://127.0.0.1:{port}/v1", max_retries=0, timeout=2.0))
    with pytest.raises(JudgeError):
        suite.verify(reference_trajectory(nl_task(suite)))


def test_tau2_tasks_give_checklists_from_their_criteria():
    suite = Tau2Suite()
    (task,) = [t for t in suite.tasks(["mock"], "all") if t.id == "mock_create_task_1"]
    checklist = suite.checklist(task)
    assert checklist.task_id == task.id and len(checklist.turns) == 1
    items = [i.item for i in checklist.turns[0]]
    assert items == [
        "The agent called create_task with the arguments "
        + json.dumps({"title": "Important Meeting", "user_id": "user_1"})
        + ".",
        "The agent confirmed the task was created successfully",
    ]
    airline = suite.tasks(["airline"], "test")
    assert all(suite.checklist(t) is None or suite.checklist(t).num_items >= 1 for t in airline)
