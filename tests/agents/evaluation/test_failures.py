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
    reference = [c for turn in make_suite(SUITE).ground_truth(task) for c in turn]
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
        assert first_divergence(calls, reference) == kind, kind
    # an argument the reference does not have counts as a wrong value of it
    extra_arg = ToolCall(first.name, {**first.arguments, "verbose": True})
    assert first_divergence([extra_arg], reference) == "wrong verbose, call 1"


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
    _write_folder(tmp_path / "eval", records, ["relocate", "ship"])

    result = failure_modes(tmp_path / "eval")
    assert result["episodes"] == len(records) == 10 and result["failed"] == 4
    assert result["kinds"]["relocate"] == {"wrong shelf, call 2": 3}
    assert result["kinds"]["ship"] == {"wrong box, call 2": 1} and result["errors"]["ship"] == {"no_box": 1}
    assert where_failed(tmp_path / "eval") == {"failed": 4, "at call 1": 0, "at a later call": 4, "other": 0}
    calls, outputs = episode_calls(bad_box["messages"])
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
