"""EnvACE-Lab v1, the hidden-rules world (`benchmarks.lab.hidden`): its rules, its splits, and the three
properties that make a world model matter (`benchmarks.lab.properties`)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import gymnasium as gym
import pytest

import envace_gym  # noqa: F401
from benchmarks.lab import LabConfig, LabSuite, hidden
from benchmarks.lab.hidden import HIDDEN_CATEGORIES, shelves_from_prompt, train_task
from benchmarks.lab.properties import measure, table
from benchmarks.lab.world import HIDDEN_TOOLS, LabBackend, Warehouse
from envace_gym.parsing import format_tool_calls
from envace_gym.suites import make_suite
from envace_gym.types import ToolCall


@pytest.fixture(scope="module")
def suite() -> LabSuite:
    return make_suite("lab")


def _state(**shelves: list[str]) -> Warehouse:
    full = {s: shelves.get(s, []) for s in "ABCD"}
    return Warehouse(capacity=4, shelves=full, rules="hidden")


def test_capacity_follows_the_letter_and_a_move_onto_a_full_shelf_breaks_the_item():
    backend = LabBackend(_state(A=["apple", "bolt"], B=["cable"], D=["drill"]))
    assert json.loads(backend.execute(ToolCall("list_shelf", {"shelf": "A"})))["free"] == 0  # A holds 2
    assert json.loads(backend.execute(ToolCall("list_shelf", {"shelf": "C"})))["free"] == 4  # C holds 4
    out = json.loads(backend.execute(ToolCall("move", {"item": "cable", "shelf": "A"})))
    assert "error" in out and backend.state.broken == ["cable"] and backend.state.shelf_of("cable") is None
    assert "error" in json.loads(backend.execute(ToolCall("move", {"item": "cable", "shelf": "C"})))  # gone for good


def test_box_labels_come_from_shelf_position_and_packing_order():
    backend = LabBackend(_state(B=["apple", "bolt", "cable"]))
    assert json.loads(backend.execute(ToolCall("pack", {"item": "bolt"})))["box"] == "B2-1"
    assert json.loads(backend.execute(ToolCall("pack", {"item": "cable"})))["box"] == "B2-2"  # moved up a slot
    assert "error" in json.loads(backend.execute(ToolCall("ship", {"box": "box-1", "dock": "north"})))
    shipped = json.loads(backend.execute(ToolCall("ship", {"box": "B2-2", "dock": "north"})))
    assert shipped == {"box": "B2-2", "dock": "north"}


def test_the_prompt_states_no_rule(suite):
    for task in suite.tasks(None, "test")[::50]:
        system = task.turns[0][0].content
        assert not re.search(r"\d|full|break|box|capacit|label|room|hold", system), system
    for spec in HIDDEN_TOOLS.values():
        assert not re.search(r"full|break|label|returns|free", spec.description), spec.description


def test_splits_are_large_fixed_and_disjoint(suite):
    test = suite.tasks(None, "test")
    assert len(test) == 6 * 100 and {t.metadata["category"] for t in test} == set(HIDDEN_CATEGORIES)
    keys = {
        json.dumps([t.metadata["initial_state"]["shelves"], [m.content for turn in t.turns for m in turn]])
        for t in test
    }
    assert len(keys) == len(test)  # no test pair twice
    stream = suite.train_stream(start=500)
    for _ in range(600):
        t = next(stream)
        shown = [t.metadata["initial_state"]["shelves"], [m.content for turn in t.turns for m in turn]]
        assert json.dumps(shown) not in keys
    assert [t.id for t in LabSuite().tasks(None, "test")] == [t.id for t in test]  # fixed: the same every time


def test_a_train_draw_equal_to_a_test_pair_is_drawn_again(monkeypatch):
    config = LabConfig(seed=7, test_tasks=1)
    first = train_task(config, "ship", 3)
    layout, slots = first.metadata["initial_state"]["shelves"], first.metadata["slots"]
    monkeypatch.setattr(hidden, "_test_keys", lambda _config: frozenset({hidden._key("ship", layout, slots)}))
    again = train_task(config, "ship", 3)
    assert (again.metadata["initial_state"]["shelves"], again.metadata["slots"]) != (layout, slots)


def _pair(task) -> str:
    return json.dumps([task.metadata["initial_state"]["shelves"], [m.content for turn in task.turns for m in turn]])


def test_the_validation_split_is_as_large_as_test_and_shares_no_pair_with_test_or_the_listed_train_tasks():
    config = LabConfig(train_tasks=300)
    suite = LabSuite(config)
    valid = suite.tasks(None, "valid")
    assert len(valid) == 6 * config.test_tasks and valid[0].id == "relocate_valid0"
    assert {t.metadata["split"] for t in valid} == {"valid"}
    seen = {_pair(t) for t in suite.tasks(None, "test")} | {_pair(t) for t in suite.tasks(None, "train")}
    assert not {_pair(t) for t in valid} & seen
    with pytest.raises(ValueError, match="no validation split"):
        LabSuite(LabConfig(rules="stated")).tasks(None, "valid")
    with pytest.raises(ValueError, match="valid index 100 outside"):
        hidden.make_hidden_task(config, "ship", 100, "valid")


@pytest.mark.parametrize("taken", ["_test_keys", "_listed_train_keys"])
def test_a_validation_draw_equal_to_a_test_or_listed_train_pair_is_drawn_again(monkeypatch, taken):
    config = LabConfig(seed=7, test_tasks=2, train_tasks=1)
    first = hidden.make_hidden_task(config, "ship", 1, "valid")
    layout, slots = first.metadata["initial_state"]["shelves"], first.metadata["slots"]
    monkeypatch.setattr(hidden, taken, lambda _c: frozenset({hidden._key("ship", layout, slots)}))
    again = hidden.make_hidden_task(config, "ship", 1, "valid")
    assert (again.metadata["initial_state"]["shelves"], again.metadata["slots"]) != (layout, slots)


def test_the_prompt_shows_the_whole_initial_state(suite):
    for task in suite.tasks(None, "test"):
        assert shelves_from_prompt(task) == task.metadata["initial_state"]["shelves"]


def test_defining_properties_on_the_test_split():
    """Reference 1.0; a solver that knows the rules but reads no output 1.0, one that reads every output but knows
    no rule 1.0; one that knows no rule and reads no output <= 0.25; one
    that knows no rule but reads the told facts (suite lab-told) 1.0 where the initial state decides every value."""
    result = measure(LabConfig(), train_tasks=2000)  # the script's default
    assert result["reference"]["overall"] == 1.0
    assert result["rules_no_outputs"]["overall"] == 1.0
    assert result["outputs_no_rules"]["overall"] == 1.0  # every value can be looked up in time
    assert result["no_rules"]["overall"] <= 0.25
    assert result["no_rules"]["ship_two"] < 0.1  # two labels guessed at once
    told = result["told_no_rules"]
    assert all(told[f] == 1.0 for f in ("relocate", "ship", "fill", "make_room"))
    # a second item packed from the shelf of the first moved up a position since the prompt's state
    assert 0.5 < told["ship_two"] < 1.0 and 0.5 < told["full_job"] < 1.0
    assert measure(LabConfig(told=True), train_tasks=2000) == result  # the told world's own tasks: the same numbers
    # the docs page shows the table as the script prints it: a changed world must change the page too
    page = (Path(__file__).resolve().parents[3] / "docs" / "suites" / "lab.md").read_text()
    assert "\n".join(table(result, [*LabConfig().categories, "overall"])) in page


def test_every_branch_is_drawn(suite):
    tasks = suite.tasks(None, "test")
    fill = [len(t.metadata["reference"][0]) - 1 for t in tasks if t.metadata["category"] == "fill"]
    assert set(fill) == {0, 1, 2}  # moves made: free slots 0, 1, 2
    room = [len(t.metadata["reference"][0]) for t in tasks if t.metadata["category"] == "make_room"]
    assert set(room) == {2, 3}


def test_reference_solutions_score_one_through_the_registered_env_and_a_guessed_label_zero(suite):
    env = gym.make("EnvACE-Tool-v0", suite="lab", split="test", max_steps_per_turn=8).unwrapped
    for task in env.tasks[::25]:
        env.reset(options={"task_id": task.id})
        for _t, calls in enumerate(suite.ground_truth(task)):
            for call in calls:
                env.step(format_tool_calls([call], "hermes"))
            _, reward, terminated, _, info = env.step("Done.")
        assert terminated and reward == 1.0, (task.id, info["verifier"])
    task = next(t for t in env.tasks if t.metadata["category"] == "ship")
    pack, ship = suite.ground_truth(task)[0]
    wrong = "A1-1" if ship.arguments["box"] != "A1-1" else "B1-1"
    result = suite.score(task, [pack, ToolCall("ship", {"box": wrong, "dock": ship.arguments["dock"]})], "Done.")
    assert result.reward == 0.0 and result.details["failed_calls"] == 1


def test_stated_rules_stay_available():
    stated = make_suite("lab-stated")
    assert stated.config.rules == "stated" and "count" in stated.categories
    assert "Each shelf holds at most 3 items" in stated.tasks(["ship"], "test")[0].turns[0][0].content
    with pytest.raises(ValueError, match="hidden rules"):
        next(stated.train_stream())
    with pytest.raises(ValueError, match="rules must be"):
        LabConfig(rules="secret")
    with pytest.raises(ValueError, match="distractors"):
        LabConfig(distractors=True)  # a stated-rules knob
    with pytest.raises(ValueError, match="hidden rules"):
        gym.make("EnvACE-LabDiscrete-v0", suite="lab")  # the discrete twin's actions are the stated world's
