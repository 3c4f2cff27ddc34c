"""`envace pipeline` (the README's main job) end to end on the tiny model with tiny budgets, and resume."""

from __future__ import annotations

import json

import pytest

from agents.cli import main
from agents.pipeline import PipelineConfig

ARGS = ["--model", "tiny-random", "--sft-steps", "1", "--sft-max-demos", "1", "--grpo-steps", "1",
        "--eval-tasks", "1", "--max-new-tokens", "4", "--rehearse-max-new-tokens", "4",
        "--grpo-max-steps-per-turn", "2", "--eval-max-steps-per-turn", "2", "--min-solvable-fraction", "0"]


@pytest.mark.slow
def test_pipeline_runs_every_stage_then_resumes_without_redoing_them(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["pipeline", "--run-dir", str(run), *ARGS]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert set(summary["evals"]) == {"eval_base", "eval_sft", "eval_grpo"}
    for stage in ("eval_base", "sft", "eval_sft", "grpo", "eval_grpo"):
        assert (run / stage / "stage_done.json").is_file()
    assert (run / "sft" / "checkpoints").is_dir() and (run / "grpo" / "metrics.jsonl").is_file()
    assert (run / "plots" / "stages.png").stat().st_size > 1000
    assert (run / "eval_grpo" / "summary.csv").is_file()
    out = capsys.readouterr().out
    assert "eval_grpo" in out and "total" in out
    assert main(["pipeline", "--run-dir", str(run), *ARGS]) == 0
    assert out.count("already done") == 0 and capsys.readouterr().out.count("already done") == 5


def test_bad_pipeline_config_fails_fast():
    with pytest.raises(ValueError, match="grpo_group_size"):
        PipelineConfig(grpo_group_size=1)


def test_the_pipeline_runs_on_a_suite_defined_in_tests(tmp_path):
    import tests.testing_env  # noqa: F401  (registers the scripted suites)

    run = tmp_path / "run"
    assert main(["pipeline", "--run-dir", str(run), "--suite", "scripted-user", "--categories", *ARGS[:-2],
                 "--min-solvable-fraction", "0", "--max-new-tokens", "24"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["config"]["suite"] == "scripted-user"
    sft = json.loads((run / "sft" / "stage_done.json").read_text())
    assert sft["task_ids"] == ["user_0"]  # the demonstration came from the test suite's reference solution
    episodes = [json.loads(line) for line in open(run / "eval_grpo" / "episodes.jsonl", encoding="utf-8")]
    assert [e["task_id"] for e in episodes] == ["user_0"]
