"""`envace failures` (`agents.evaluation.failures`): where failed episodes leave the reference solution, on lab
episodes played on the real backend and scored by the suite's verifier, and on a real evaluation folder."""

from __future__ import annotations

import dataclasses
import json

import pytest

from agents.cli.main import main
from agents.evaluation.evaluate import EvalConfig, evaluate
from agents.evaluation.failures import episode_calls, failure_modes, failures_table, first_divergence, where_failed
from envace_gym.suites import make_suite
from envace_gym.types import ToolCall

SUITE = "lab"


def _played(task, calls):
    """The transcript record of `calls` played on the task's real backend, its reward the verifier's."""
    suite = make_suite(SUITE)
    backend = suite.make_backend(task)
    messages = [{"role": "user", "content": task.turns[0][0].content}]
    for k, call in enumerate(calls):
        call = dataclasses.replace(call, id=f"call_{k}")
        messages.append({"role": "assistant", "content": "", "tool_calls": [call.to_openai()]})
        messages.append({"role": "tool", "tool_call_id": call.id, "content": backend.execute(call)})
    messages.append({"role": "assistant", "content": "Done."})
    reward = suite.score(task, calls, "Done.").reward
    return {"task_id": task.id, "reward": reward, "messages": messages, "rehearsals": []}


def _write_folder(path, records, categories):
    path.mkdir(parents=True)
    config = {"suite": SUITE, "categories": categories, "split": "test"}
    (path / "eval_config.json").write_text(json.dumps(config))
    with open(path / "transcripts.jsonl", "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record) + "\n")


def test_first_divergence_names_where_the_calls_leave_the_reference():
    task = make_suite(SUITE).tasks(["make_room"], "test")[0]
    (reference,) = make_suite(SUITE).ground_truth(task)
    assert len(reference) >= 2 and reference[0].name == "list_shelf"
    first = reference[0]
    other_shelf = next(s for s in "ABCD" if s != first.arguments["shelf"])
    cases = {
        "same calls": list(reference),
        "no call": [],
        "stopped early": reference[:-1],
        "extra call": [*reference, reference[-1]],
        "wrong tool, call 1": [ToolCall("locate", {"item": "x"}), *reference[1:]],
        "wrong shelf, call 1": [ToolCall("list_shelf", {"shelf": other_shelf}), *reference[1:]],
        "unparsed call, call 2": [first, "<tool_call>{oops", *reference[2:]],
    }
    for kind, calls in cases.items():
        assert first_divergence([calls], [reference]) == kind, kind
    # an argument the reference does not have counts as a wrong value of it
    extra_arg = ToolCall(first.name, {**first.arguments, "verbose": True})
    assert first_divergence([[extra_arg]], [reference]) == "wrong verbose, call 1"
    # a reference of one turn (τ²'s) is compared with the calls of every turn of the episode
    assert first_divergence([reference[:1], reference[1:]], [reference]) == "same calls"


def test_first_divergence_compares_turn_by_turn():
    """Two user turns: a turn closed one call early, or given one call too many, is named so in that turn, not as a
    wrong tool at the next turn's first call (what comparing the calls flattened over the turns would say); call k
    counts the reference's calls over its turns."""
    pack_a, ship_a = ToolCall("pack", {"item": "apple"}), ToolCall("ship", {"box": "A1-1", "dock": "north"})
    pack_b, ship_b = ToolCall("pack", {"item": "bolt"}), ToolCall("ship", {"box": "A1-2", "dock": "south"})
    reference = [[pack_a, ship_a], [pack_b, ship_b]]
    cases = {
        "same calls": [[pack_a, ship_a], [pack_b, ship_b]],
        "stopped early": [[pack_a], [pack_b, ship_b]],
        "extra call": [[pack_a, ship_a, ship_a], [pack_b, ship_b]],
        "wrong item, call 3": [[pack_a, ship_a], [pack_a, ship_b]],
        "wrong tool, call 4": [[pack_a, ship_a], [pack_b, pack_b]],
    }
    for kind, calls in cases.items():
        assert first_divergence(calls, reference) == kind, kind
    assert first_divergence([[pack_a, ship_a]], reference) == "stopped early"  # the second turn never came
    assert first_divergence([[pack_a, ship_a], [pack_b, ship_b], [pack_b]], reference) == "extra call"
    # the turns as episode_calls reads them off a transcript, with a message the env could not parse
    calls = [dataclasses.replace(c, id=f"call_{k}") for k, c in enumerate([pack_a, pack_b, ship_b])]
    messages = [
        {"role": "user", "content": "Ship the apple from the north dock."},
        {"role": "assistant", "content": "", "tool_calls": [calls[0].to_openai()]},
        {"role": "tool", "tool_call_id": "call_0", "content": '{"box": "A1-1"}'},
        {"role": "assistant", "content": "Packed."},
        {"role": "user", "content": "Now ship the bolt from the south dock."},
        {"role": "assistant", "content": "<tool_call>{oops"},
        {"role": "tool", "content": "Error: the tool call is not valid JSON"},
        {"role": "assistant", "content": "", "tool_calls": [c.to_openai() for c in calls[1:]]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"box": "A1-2"}'},
        {"role": "tool", "tool_call_id": "call_2", "content": '{"shipped": "A1-2"}'},
        {"role": "assistant", "content": "Done."},
    ]
    turns, outputs = episode_calls(messages)
    assert turns == [[calls[0]], ["<tool_call>{oops", calls[1], calls[2]]]
    assert outputs == ['{"box": "A1-1"}', '{"box": "A1-2"}', '{"shipped": "A1-2"}']  # not the parse error's answer
    assert first_divergence(turns, reference) == "stopped early"
    assert first_divergence([turns[0] + [ship_a], turns[1]], reference) == "unparsed call, call 3"


def test_failure_modes_classify_episodes_played_on_the_real_backend(tmp_path, capsys):
    """Reference solutions played for real score 1 and are not counted, nor is a run that probes another shelf
    and still solves the task; a run whose move goes to another shelf fails by the verifier and is classified at
    that call; a ship of a wrong box label too, and its error output is counted by the lab's kind; the CLI prints
    the same table."""
    suite = make_suite(SUITE)
    records, moved = [], 0
    for task in suite.tasks(["relocate"], "test")[:3]:
        reference = [c for turn in suite.ground_truth(task) for c in turn]
        probe, move = reference  # list_shelf(the target's shelf), then move(item, where it goes)
        other = next(s for s in "ABCD" if s != probe.arguments["shelf"])
        records.append(_played(task, reference))
        records.append(_played(task, [ToolCall("list_shelf", {"shelf": other}), move]))  # still solved
        home = suite.make_backend(task).state.shelf_of(move.arguments["item"])
        elsewhere = next(s for s in "ABCD" if s not in (move.arguments["shelf"], home))
        wrong = _played(task, [probe, ToolCall("move", {**move.arguments, "shelf": elsewhere})])
        moved += wrong["reward"] < 1
        records.append(wrong)
    ship = suite.tasks(["ship"], "test")[0]
    pack, send = [c for turn in suite.ground_truth(ship) for c in turn]
    bad_box = _played(ship, [pack, ToolCall("ship", {**send.arguments, "box": "Z9-9"})])
    records.append(bad_box)
    assert [r["reward"] for r in records[:2]] == [1.0, 1.0] and bad_box["reward"] == 0.0 and moved == 3
    unparsed = _played(suite.tasks(["ship"], "test")[1], [])  # a message the env could not parse, then "Done."
    unparsed["messages"][1:1] = [
        {"role": "assistant", "content": "<tool_call>{oops"},
        {"role": "tool", "content": "Error: the tool call is not valid JSON"},
    ]
    records.append(unparsed)
    _write_folder(tmp_path / "eval", records, ["relocate", "ship"])

    result = failure_modes(tmp_path / "eval")
    assert result["episodes"] == len(records) == 11 and result["failed"] == 5
    assert result["kinds"]["relocate"] == {"wrong shelf, call 2": 3}
    assert result["kinds"]["ship"] == {"wrong box, call 2": 1, "unparsed call, call 1": 1}
    # the env's answer to the unparsed message is counted as such, not as the lab's other_error
    assert result["errors"]["ship"] == {"no_box": 1, "unparsed call": 1}
    assert where_failed(tmp_path / "eval") == {"failed": 5, "at call 1": 1, "at a later call": 4, "other": 0}
    (calls,), outputs = episode_calls(bad_box["messages"])
    assert calls[1].arguments["box"] == "Z9-9" and len(outputs) == 2

    table = failures_table([("eval", result)])
    assert "  wrong shelf, call 2" in [line[: len("  wrong shelf, call 2")] for line in table]
    assert next(line for line in table if "wrong shelf, call 2" in line).split()[-1] == "3"
    assert main(["failures", str(tmp_path / "eval"), "--by-category"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[: len(table)] == table and any(line.startswith("ship ") for line in printed)


def test_failure_modes_read_a_real_evaluation_folder(tmp_path):
    """An `evaluate` folder of the tiny random model: every episode with reward below 1 gets exactly one kind."""
    config = EvalConfig(model="tiny-random", suite=SUITE, categories=["ship"], limit=2, out=str(tmp_path / "ev"))
    result = evaluate(config, log=None)
    modes = failure_modes(tmp_path / "ev")
    failed = sum(e["reward"] < 1 for e in result.episodes)
    assert modes["episodes"] == len(result.episodes) == 2
    assert modes["failed"] == failed == sum(modes["kinds"]["ship"].values())


def test_a_folder_that_is_not_an_evaluation_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="not an evaluation folder"):
        failure_modes(tmp_path)
    with pytest.raises(SystemExit, match="envace failures: .*not an evaluation folder"):
        main(["failures", str(tmp_path)])
    with pytest.raises(SystemExit, match="envace failures: 1 --labels for 2 folders"):  # not a folder left out
        main(["failures", str(tmp_path), str(tmp_path), "--labels", "a"])
