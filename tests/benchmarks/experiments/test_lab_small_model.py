"""`benchmarks/experiments/lab_small_model.py`: the corpus must not hold a test prompt, and the probe runs end to end
(a random Llama built from a config, SFT on the generated corpus, greedy evaluation on the lab test split)."""

from __future__ import annotations

import math

import pytest

from benchmarks.experiments import lab_small_model


def test_a_corpus_that_holds_test_prompts_is_refused(tmp_path):
    # the lab suite's own seed regenerates its test tasks: the probe must refuse to score on them
    with pytest.raises(SystemExit, match="test-split prompt"):
        lab_small_model.main(["--out", str(tmp_path), "--corpus-seed", "0", "--tasks-per-family", "120"])


def test_bad_sizes_fail_fast():
    with pytest.raises(SystemExit):
        lab_small_model.parse_args(["--hidden", "100"])


@pytest.mark.slow
def test_the_probe_trains_and_scores_a_small_llama(tmp_path):
    argv = [
        "--out",
        str(tmp_path / "probe"),
        "--layers",
        "1",
        "--hidden",
        "64",
        "--tasks-per-family",
        "3",
        "--steps",
        "2",
        "--batch-tokens",
        "2048",
        "--limit",
        "1",
    ]
    report = lab_small_model.main(argv)
    assert report["test_tasks"] == 6 and set(report["test_success"]) >= {"relocate", "full_job", "overall"}
    assert math.isfinite(report["act_loss"]) and math.isfinite(report["rehearse_loss"])
    assert 0 < report["parameters"] < 1_000_000  # one layer of width 64 over a ~630-token vocabulary
    again = lab_small_model.main(argv)  # a rerun reuses the initial model and the finished SFT run
    assert again["parameters"] == report["parameters"] and again["act_loss"] is None  # no step trained again
    with pytest.raises(SystemExit, match="other settings"):  # other sizes never reuse that model
        lab_small_model.main(argv[:-4] + ["--hidden", "128"] + argv[-4:])
