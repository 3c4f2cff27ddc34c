"""`benchmarks.lab.tiny_sft`: the lab-tiny SFT protocol runs end to end, reads a finished seed back instead of
retraining it, and refuses another run's folder."""

from __future__ import annotations

import json

import pytest

from benchmarks.lab import tiny_sft
from benchmarks.stats import mean_ci95

SMOKE = ["--steps", "2", "--rows", "4", "--limit", "1", "--categories", "ship", "--warmup-steps", "1"]


def test_smoke_run_reports_each_seed_and_reads_finished_seeds_back(tmp_path, capsys):
    out = tmp_path / "run"
    result = tiny_sft.main(SMOKE + ["--seeds", "0", "1", "--out", str(out)])
    assert [r["seed"] for r in result["seeds"]] == [0, 1]
    assert all(0.0 <= r["success"]["ship"] <= 1.0 and r["test_tasks"] == 1 for r in result["seeds"])
    assert (out / "seed_1" / "eval" / "episodes.jsonl").is_file()
    assert json.loads((out / "results.json").read_text())["mean"]["overall"]["ci95"] is not None
    assert "lab-tiny SFT from scratch" in capsys.readouterr().out
    stamp = (out / "seed_0" / "report.json").stat().st_mtime_ns
    tiny_sft.main(SMOKE + ["--seeds", "0", "--out", str(out)])
    assert (out / "seed_0" / "report.json").stat().st_mtime_ns == stamp  # read back, not retrained
    with pytest.raises(SystemExit, match="other settings"):
        tiny_sft.main(SMOKE[:-2] + ["--warmup-steps", "2", "--seeds", "0", "--out", str(out)])


def test_mean_ci95_matches_the_t_table():
    mean, half = mean_ci95([0.2, 0.4, 0.6])
    assert mean == pytest.approx(0.4) and half == pytest.approx(4.303 * 0.2 / 3 ** 0.5)
    assert mean_ci95([0.5]) == (0.5, None)
    with pytest.raises(ValueError):
        mean_ci95([])
