"""`benchmarks/experiments/lab_rehearsal_rl.py` end to end on the tiny model with tiny budgets: the three continuations
(the plain one at equal generated tokens), every policy at N=0 and N=n, the table, the results page and a resumed
rerun, two seeds in two worker processes."""

from __future__ import annotations

import json

import pytest
import yaml

from benchmarks import results as results_page
from benchmarks.experiments import lab_rehearsal_rl
from tests.benchmarks.experiments.test_lab_ablations import RECIPE


def test_options_are_checked():
    for bad in (
        ["--n", "0"],
        ["--steps", "0"],
        ["--seeds", "0"],
        ["--workers", "0"],
        ["--workers", "2", "--worker", "2"],
    ):
        with pytest.raises(SystemExit):
            lab_rehearsal_rl.parse_args(bad)


def test_a_run_is_a_results_kind_of_its_suite():
    assert lab_rehearsal_rl.result_kind("lab") == "lab_rehearsal_rl"
    assert lab_rehearsal_rl.result_kind("lab-blind") == "lab_rehearsal_rl_blind"
    assert lab_rehearsal_rl.result_kind("lab-stated") == "lab_rehearsal_rl_stated"
    # another memory layout is its own kind, and the results page gives each its own section
    kind = lab_rehearsal_rl.result_kind("lab-blind", "outcomes", True)
    assert kind == "lab_rehearsal_rl_blind_outcomes_restated" and kind in results_page.RENDERERS
    assert lab_rehearsal_rl.parse_args(["--memory", "outcomes", "--restate-request"]).restate_request
    with pytest.raises(SystemExit):
        lab_rehearsal_rl.parse_args(["--memory", "summary"])  # not a layout a policy is trained to read
    with pytest.raises(ValueError, match="runs on suites lab, lab-blind, lab-stated; the recipe's suite is 'lab-told'"):
        lab_rehearsal_rl.result_kind("lab-told")


@pytest.mark.slow
def test_equal_token_arm_matches_the_rehearsing_arms_tokens_and_a_rerun_resumes(tmp_path, capsys):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(RECIPE))
    out = tmp_path / "rrl"
    argv = ["--recipe", str(recipe), "--out", str(out), "--seeds", "2", "--steps", "1", "--n", "1", "--limit", "1"]
    argv += ["--workers", "2", "--threads", "1"]
    results = lab_rehearsal_rl.main(argv)
    assert (out / "worker1.log").read_text().count("rehearsal_rl/seed1/grpo") >= 1  # seed 1 ran in the second worker
    assert "rehearsal_rl/seed1" not in (out / "worker0.log").read_text()
    rows = {(r["policy"], r["setting"]): r for r in results["rows"]}
    assert list(rows) == [(p, s) for p in lab_rehearsal_rl.POLICIES for s in ("N=0", "N=1")]
    rl, equal = rows["rehearsal_rl", "N=0"], rows["role_grpo_equal_tokens", "N=0"]
    assert rl["train_steps"] == [1, 1] and rl["train_attempt_tokens"][0] > 0
    assert equal["train_attempt_tokens"] == [0, 0] and rows["role_grpo_equal_steps", "N=0"]["train_steps"] == [1, 1]
    # the plain run stopped at the first step whose cumulative tokens reached the rehearsing run's
    target = rl["train_generated_tokens"][0]
    steps = [json.loads(line) for line in (out / "role_grpo_equal_tokens/seed0/grpo/metrics.jsonl").open()]
    totals = [s["rollout/generated_tokens_total"] for s in steps]
    assert totals[-1] == equal["train_generated_tokens"][0] >= target and all(t < target for t in totals[:-1])
    for (policy, setting), r in rows.items():
        assert r["n_seeds"] == 2 and (r["tokens_per_task"] > 0) == (setting == "N=1")
        if policy == "role_grpo_equal_tokens":
            assert r["diff_mean"] == 0 and r["gained"] == r["lost"] == 0  # the reference itself
    printed = capsys.readouterr().out
    assert "Rehearsal-aware RL on EnvACE-Lab" in printed

    page = results_page.render(store_dir=results_page.store(out, tmp_path / "store").parent, page=tmp_path / "r.md")
    text = page.read_text()
    assert "## Rehearsal-aware RL on the lab's stated-rules world (suite lab-stated)" in text
    assert "role_grpo_equal_tokens" in text

    again = lab_rehearsal_rl.main(argv)
    printed = capsys.readouterr().out
    assert "rehearsal_rl/seed0/grpo: already done" in printed and "[stage] rehearsal_rl/seed0/grpo ..." not in printed
    assert again["rows"] == results["rows"]
