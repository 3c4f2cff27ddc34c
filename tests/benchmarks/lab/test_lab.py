"""EnvACE-Lab (`benchmarks.lab`): the warehouse rules, the tasks, the replay verifier, and the suite on the same
code paths as BFCL (the registered envs, the vector env, demonstrations, budgets, fidelity, test-time rehearsal)."""

from __future__ import annotations

import json
import re

import gymnasium as gym
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import envace_gym  # noqa: F401
from benchmarks.lab import LabConfig, LabSuite
from benchmarks.lab.world import DISTRACTOR_TOOLS, TOOLS, LabBackend, Warehouse
from envace_gym.parsing import format_tool_calls
from envace_gym.suites import make_suite, register_suite
from envace_gym.types import ToolCall


def _play(env, task_id: str, turns: list[list[ToolCall]], replies: list[str] | None = None):
    """Play `turns` (one call per ACT message, then a closing reply per turn); returns (reward, last info)."""
    env.reset(options={"task_id": task_id})
    reward, info = 0.0, {}
    for t, calls in enumerate(turns):
        for call in calls:
            _, _, terminated, truncated, info = env.step(format_tool_calls([call], "hermes"))
            assert not (terminated or truncated)
        _, reward, terminated, truncated, info = env.step(replies[t] if replies else "Done.")
    assert terminated
    return reward, info


@pytest.fixture(scope="module")
def suite():
    return make_suite("lab-stated")


@pytest.fixture(scope="module")
def tool_env():
    return gym.make("EnvACE-Tool-v0", suite="lab-stated", categories=None, split="all", max_steps_per_turn=8).unwrapped


def test_every_reference_solution_scores_one_through_the_registered_env(suite, tool_env):
    for task in tool_env.tasks:
        turns = suite.ground_truth(task)
        replies = [suite.reference_reply(task, t) or "Done." for t in range(len(turns))]
        reward, info = _play(tool_env, task.id, turns, replies)
        assert reward == 1.0, (task.id, info["verifier"])
        assert info["verifier"]["details"]["failed_calls"] == 0, task.id  # every reference call runs
        changed = tool_env.backend.state.to_dict() != task.metadata["initial_state"]
        assert changed == (task.metadata["category"] != "count"), task.id  # and does the job
    assert len(tool_env.tasks) == 6 * 120


def test_tasks_are_a_function_of_the_config_and_the_splits_are_disjoint(suite):
    again = LabSuite(LabConfig(rules="stated"))
    assert [t.to_dict() for t in suite.tasks(None, "all")] == [t.to_dict() for t in again.tasks(None, "all")]
    other = LabSuite(LabConfig(rules="stated", seed=1))
    assert [t.turns[0][0].content for t in other.tasks(["relocate"])] != [
        t.turns[0][0].content for t in suite.tasks(["relocate"])
    ]

    def content(t):
        return json.dumps([[m.content for m in turn] for turn in t.turns])

    train, test = {content(t) for t in suite.tasks(None, "train")}, {content(t) for t in suite.tasks(None, "test")}
    assert len(train) == 6 * 96 and len(test) == 6 * 24 and not train & test  # no task is in both splits
    answers = [t.metadata["answer"] for t in suite.tasks(["count"], "all")]
    assert set(answers) == {"0", "1", "2"}  # shelves are filled at random: no answer fits every task
    full = [len(suite.ground_truth(t)[0]) == 3 for t in suite.tasks(["make_room"], "all")]
    assert 0.3 < sum(full) / len(full) < 0.7  # the shelf to make room on is full about half the time
    with pytest.raises(ValueError, match="unknown lab categories"):
        suite.tasks(["multi_turn_base"])


def _layout_from_prompt(text: str, capacity: int) -> Warehouse:
    shelves = {}
    for letter, items in re.findall(r"Shelf ([A-Z]): ([^.]*)\.", text):
        shelves[letter] = [] if items == "empty" else items.split(", ")
    return Warehouse(capacity=capacity, shelves=shelves)


def test_the_prompt_states_everything_the_outputs_depend_on(suite):
    """A world model can be exact: the state rebuilt from the prompt's text alone gives every reference output."""
    for task in suite.tasks(None, "all")[::7]:
        system = task.turns[0][0].content
        capacity = int(re.search(r"at most (\d+) items", system).group(1))
        from_prompt = LabBackend(_layout_from_prompt(system, capacity))
        real = suite.make_backend(task)
        for call in (c for turn in suite.ground_truth(task) for c in turn):
            assert from_prompt.execute(call) == real.execute(call)


def test_a_wrong_label_an_unready_box_or_a_full_shelf_costs_the_reward(suite, tool_env):
    ship = suite.tasks(["ship"])[0]
    pack, send = suite.ground_truth(ship)[0]
    wrong = ToolCall("ship", {"box": "box-2", "dock": send.arguments["dock"]})  # what a bad rehearsal would say
    assert _play(tool_env, ship.id, [[pack, wrong]])[0] == 0.0
    assert _play(tool_env, ship.id, [[send, pack]])[0] == 0.0  # shipping before packing fails, changes nothing
    full = next(t for t in suite.tasks(["make_room"]) if len(suite.ground_truth(t)[0]) == 3)
    locate, make_room, move = suite.ground_truth(full)[0]
    tool_env.reset(options={"task_id": full.id})
    tool_env.step(format_tool_calls([locate], "hermes"))
    obs, *_ = tool_env.step(format_tool_calls([move], "hermes"))  # straight onto the full shelf
    assert "fell and broke" in obs
    _, reward, _, _, info = tool_env.step("Done.")
    assert reward == 0.0 and info["verifier"]["details"]["broken"] == [move.arguments["item"]]
    roomy = next(t for t in suite.tasks(["make_room"]) if len(suite.ground_truth(t)[0]) == 2)
    locate, move = suite.ground_truth(roomy)[0]
    assert _play(tool_env, roomy.id, [[locate, move]])[0] == 1.0


def test_a_failed_call_costs_the_reward_even_when_the_final_state_is_right(suite, tool_env):
    """Failed calls change nothing, but a policy that pads its episodes with them is not done right."""
    task = suite.tasks(["relocate"])[0]
    (calls,) = suite.ground_truth(task)
    no_shelf = ToolCall("move", {"item": calls[-1].arguments["item"]})  # a missing argument: an error, no change
    reward, info = _play(tool_env, task.id, [calls + [no_shelf]])
    assert reward == 0.0 and info["verifier"]["details"] == {
        "state_matches": True,
        "answer_matches": True,
        "failed_calls": 1,
        "broken": [],
    }
    assert _play(tool_env, task.id, [[no_shelf] + calls])[0] == 0.0
    assert _play(tool_env, task.id, [calls])[0] == 1.0


def test_a_count_task_is_scored_on_the_number_in_the_reply(suite, tool_env):
    task = suite.tasks(["count"])[0]
    answer = int(task.metadata["answer"])
    calls = suite.ground_truth(task)
    assert _play(tool_env, task.id, calls, [f"It has {answer} free slots."])[0] == 1.0
    assert _play(tool_env, task.id, calls, [f"It has {answer + 10} free slots."])[0] == 0.0
    assert _play(tool_env, task.id, calls, ["Done."])[0] == 0.0
    assert _play(tool_env, task.id, calls, [f"Either {answer} or {answer + 1}."])[0] == 0.0  # no hedging


def test_knobs_change_the_tasks_and_keep_them_solvable(tool_env):
    register_suite(
        "lab-knobs",
        lambda: LabSuite(
            LabConfig(
                rules="stated",
                seed=3,
                tasks_per_category=10,
                distractors=True,
                user_turns=2,
                num_shelves=5,
                capacity=4,
                num_items=9,
            )
        ),
    )
    suite = make_suite("lab-knobs")
    tasks = suite.tasks(None, "all")
    assert all(len(t.tools) == len(TOOLS) + len(DISTRACTOR_TOOLS) for t in tasks)
    assert all(t.num_turns == 2 for t in tasks if t.metadata["category"] in ("ship_two", "full_job"))
    assert all("at most 4 items" in t.turns[0][0].content and "Shelf E" in t.turns[0][0].content for t in tasks)
    env = gym.make("EnvACE-Tool-v0", suite="lab-knobs", categories=None, split="all", max_steps_per_turn=8).unwrapped
    for task in tasks:
        turns = suite.ground_truth(task)
        replies = [suite.reference_reply(task, t) or "Done." for t in range(len(turns))]
        assert _play(env, task.id, turns, replies)[0] == 1.0, task.id
    with pytest.raises(ValueError, match="num_items"):
        LabConfig(rules="stated", num_items=30)
    with pytest.raises(ValueError, match="user_turns"):
        LabConfig(rules="stated", user_turns=3)
    with pytest.raises(ValueError, match="no train task"):
        LabConfig(rules="stated", tasks_per_category=3, test_fraction=0.9)
    for odd in (
        LabConfig(rules="stated", num_shelves=3, capacity=4, num_items=5, tasks_per_category=40),
        LabConfig(rules="stated", num_shelves=3, capacity=8, num_items=9, tasks_per_category=40),
    ):
        LabSuite(odd)  # every family draws a fitting layout for every config LabConfig accepts


_names = st.sampled_from([*TOOLS, *DISTRACTOR_TOOLS, "exec", ""])
_junk = st.one_of(st.text(max_size=8), st.integers(), st.none(), st.lists(st.integers(), max_size=2))


def _mostly(*valid: str):
    """A valid argument four times in five, else junk (so calls reach the rules, not only the checks)."""
    return st.tuples(st.sampled_from(valid), st.integers(0, 4), _junk).map(lambda t: t[2] if t[1] == 0 else t[0])


_args = st.fixed_dictionaries(
    {
        "item": _mostly("apple", "bolt", "cable"),
        "shelf": _mostly("A", "B", "C"),
        "box": _mostly("box-1", "box-2", "box-3"),
        "dock": _mostly("north", "west"),
    }
)
_calls = st.builds(ToolCall, _names, st.one_of(_args, st.dictionaries(st.text(max_size=4), _junk, max_size=2)))


@settings(max_examples=300, deadline=None)
@given(st.lists(_calls, min_size=1, max_size=25))
def test_no_call_raises_and_every_item_stays_accounted_for(calls):
    start = Warehouse(capacity=2, shelves={"A": ["apple", "bolt"], "B": ["cable"], "C": []})
    backend = LabBackend(start)
    for call in calls:
        out = json.loads(backend.execute(call))
        assert isinstance(out, dict)
        s = backend.state
        placed = [i for items in s.shelves.values() for i in items] + list(s.boxes.values()) + s.broken
        assert sorted(placed) == ["apple", "bolt", "cable"]  # on a shelf, in a box or broken: never twice
        assert all(len(items) <= s.capacity for items in s.shelves.values())
        assert set(s.shipped) <= set(s.boxes)
    assert start.shelves["A"] == ["apple", "bolt"]  # the backend copied its initial state


def test_the_rehearse_env_vector_env_demonstrations_and_budgets_run_on_lab(smol_tokenizer):
    from agents.training.budgets import check_task_budgets
    from agents.training.demonstrations import build_demonstrations

    env = gym.make(
        "EnvACE-Rehearse-v0", suite="lab-stated", categories=["relocate"], model="tiny-random", max_new_tokens=6
    )
    obs, info = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(
        '<tool_call>{"name": "locate", "arguments": {"item": "x"}}</tool_call>'
    )
    assert len(info["rehearsals"]) == 1 and not (terminated or truncated)
    venv = gym.make_vec(
        "EnvACE-Rehearse-v0",
        num_envs=2,
        vectorization_mode="vector_entry_point",
        suite="lab-stated",
        categories=["ship"],
        model="tiny-random",
        max_new_tokens=4,
    )
    venv.reset(seed=0)
    _, _, terminated, _, infos = venv.step(
        ['<tool_call>{"name": "pack", "arguments": {"item": "x"}}</tool_call>', "Done."]
    )
    assert list(terminated) == [False, True] and len(infos["rehearsals"][0]) == 1  # ship has one user turn
    demos, stats = build_demonstrations(smol_tokenizer, "lab-stated", None, "train", progress=False)
    assert stats.kept == len(demos) == 6 * 96 and stats.skipped_reward == 0
    assert max(len(d.token_ids) for d in demos) < 1500  # short prompts: what makes the lab fast on a CPU
    report = check_task_budgets(
        make_suite("lab-stated").tasks(None, "train"),
        "lab-stated",
        smol_tokenizer,
        max_steps_per_turn=8,
        max_new_tokens=64,
        max_episode_tokens=None,
        min_fraction=0.0,
        command="test",
        log=None,
    )
    assert report.fraction == 1.0


def test_fidelity_and_test_time_rehearsal_wrap_a_lab_env_unchanged():
    from agents.policy import load_policy
    from wrappers import RealTools, RehearsalFidelity, TestTimeRehearsal

    env = RehearsalFidelity(
        gym.make("EnvACE-Rehearse-v0", suite="lab-stated", categories=["ship"], model="tiny-random", max_new_tokens=6)
    )
    env.reset(seed=0)
    _, _, _, _, info = env.step('<tool_call>{"name": "pack", "arguments": {"item": "x"}}</tool_call>')
    assert len(info["fidelity"]["calls"]) == 1 and info["fidelity"]["episode"]["num_calls"] == 1
    policy = load_policy("tiny-random")
    ttr = TestTimeRehearsal(
        RealTools(
            gym.make(
                "EnvACE-Rehearse-v0", suite="lab-stated", categories=["relocate"], model="tiny-random", max_new_tokens=4
            )
        ),
        policy,
        n=1,
        attempt_max_steps=1,
        critique_tokens=4,
    )
    _, info = ttr.reset(seed=0)
    assert len(info["rehearsal"]["attempts"]) == 1
