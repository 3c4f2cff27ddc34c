"""`benchmarks/experiments/served_world_model.py` at tiny size: it starts ``envace serve-tools`` with a saved tiny lab
model, prints each reference call of the given tasks with the served and the real answer, and finds the served
answers, and the fidelity, equal to the in-process rehearsal's."""

from __future__ import annotations

import pytest

from benchmarks.experiments import served_world_model
from benchmarks.lab.lab_tiny import LabTinySizes, build_lab_tiny


def test_the_transcript_of_a_served_tiny_model(tmp_path, capsys):
    model, tokenizer = build_lab_tiny(LabTinySizes(hidden_size=32, num_hidden_layers=1, intermediate_size=64), seed=0)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    argv = ["--model", str(tmp_path), "--task", "ship_test1", "make_room_test2", "--max-new-tokens", "4"]
    report = served_world_model.main(argv)
    printed = capsys.readouterr().out
    calls = report["records"]
    assert report["equal_in_process"] is True and report["fidelity"]["num_calls"] == len(calls) >= 4
    assert {r["task_id"] for r in calls} == {"ship_test1", "make_room_test2"}
    assert printed.count("  served: ") == printed.count("  real:   ") == len(calls)
    assert "envace_start_task(task_id='make_room_test2') -> fresh history; task: make_room_test2" in printed
    assert all(r["real"].startswith("{") for r in calls)  # the real lab backend's JSON


def test_an_unknown_task_names_the_lab_test_tasks():
    with pytest.raises(SystemExit, match="are not lab test tasks"):
        served_world_model.main(["--model", "tiny-random", "--task", "ship_99999"])
