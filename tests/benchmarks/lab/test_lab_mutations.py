"""`LabSuite.mutations`: every mistake it proposes, played on a fresh real backend at its position of the
reference solution, fails; a move onto a full shelf breaks the item (the state changes), the others (an unknown
item, a wrong label, a repeated move or ship) change nothing; the draws follow the rng."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from benchmarks.lab.world import hidden_capacities
from envace_gym.suites import make_suite
from envace_gym.types import ToolCall


@pytest.mark.parametrize("name", ["lab", "lab-stated"])
def test_every_proposed_mistake_fails_on_the_real_backend_where_it_is_played(name):
    suite = make_suite(name)
    kinds: Counter[str] = Counter()
    for task in suite.tasks(None, "train"):
        calls = [c for turn in suite.ground_truth(task) for c in turn]
        proposed = suite.mutations(task, calls, random.Random(f"0/{task.id}"))
        assert proposed == suite.mutations(task, calls, random.Random(f"0/{task.id}"))
        assert [p for p, _ in proposed] == sorted(p for p, _ in proposed)
        for position, call in proposed:
            backend = suite.make_backend(task)
            for c in calls[:position]:
                backend.execute(c)
            state, before = backend.state, backend.snapshot()
            right = calls[position]
            repeat = position > 0 and call == calls[position - 1]
            breaking = not repeat and call.name == "move" and state.shelf_of(call.arguments["item"]) is not None
            if breaking:  # onto another shelf, full at this point
                shelf = call.arguments["shelf"]
                assert len(state.shelves[shelf]) >= state.capacity_of(shelf)
                assert state.shelf_of(call.arguments["item"]) != shelf
            output = backend.execute(call)
            assert json.loads(output).keys() == {"error"}, (task.id, call, output)
            if repeat:  # the item is already there, the box already shipped
                kinds["repeat"] += 1
                assert call.name in ("move", "ship") and backend.snapshot() == before
                assert "already" in json.loads(output)["error"]
            elif breaking:
                kinds["breaks"] += 1
                assert backend.state.broken[-1] == call.arguments["item"] and backend.snapshot() != before
            elif call.name == "ship":
                kinds["label"] += 1
                assert right.name == "ship" and call.arguments["box"] != right.arguments["box"]
                assert call.arguments["dock"] == right.arguments["dock"] and backend.snapshot() == before
            else:
                kinds["unknown item"] += 1
                assert call.name == right.name and call.arguments["item"] != right.arguments["item"]
                assert backend.snapshot() == before
    assert kinds["breaks"] > 10 and kinds["label"] > 10 and kinds["unknown item"] > 10 and kinds["repeat"] > 10, kinds


def test_a_ship_task_without_a_full_shelf_proposes_no_break_and_a_look_proposes_nothing():
    suite = make_suite("lab")
    caps = hidden_capacities(4)
    task = next(
        t
        for t in suite.tasks(["ship"], "train")
        if all(len(v) < caps[s] for s, v in t.metadata["initial_state"]["shelves"].items())
    )
    calls = [c for turn in suite.ground_truth(task) for c in turn]
    proposed = suite.mutations(task, calls, random.Random(0))
    # no shelf is full: no move that breaks; the unknown item sits before pack, the label mistake before the ship;
    # the ship is the last call, so nothing repeats it
    assert [(p, c.name) for p, c in proposed] == [(0, "pack"), (1, "ship")]
    assert proposed[0][1].arguments["item"] != calls[0].arguments["item"]
    assert suite.mutations(task, [ToolCall("list_shelf", {"shelf": "A"})], random.Random(0)) == []
