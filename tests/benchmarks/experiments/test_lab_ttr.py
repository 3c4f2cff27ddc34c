"""`benchmarks/experiments/lab_ttr.py` end to end on the tiny model with tiny budgets: memory demonstrations, the two
continuations, every policy at N=0 and under rehearsal, the three controls, the table and a resumed rerun."""

from __future__ import annotations

import json

import pytest
import yaml

from benchmarks.experiments import lab_ttr
from tests.benchmarks.experiments.test_lab_ablations import RECIPE


def test_compare_is_paired_with_the_reference_seed_by_seed():
    ref = [{"a": 1.0, "b": 0.0}, {"a": 0.0, "b": 0.0}]
    rows = [{"a": 1.0, "b": 1.0}, {"a": 1.0, "b": 0.0}]
    c = lab_ttr.compare(rows, ref)
    assert c["success"] == [1.0, 0.5] and c["diff_mean"] == pytest.approx(0.5)
    assert (c["gained"], c["lost"]) == (2, 0) and c["p_values"] == [1.0, 1.0]  # one discordant task per seed
    many = lab_ttr.compare([{f"t{i}": 0.0 for i in range(10)}], [{f"t{i}": 1.0 for i in range(10)}])
    assert many["p_values"] == [pytest.approx(2 / 1024)] and (many["resolved_up"], many["resolved_down"]) == (0, 1)


def test_options_are_checked():
    with pytest.raises(SystemExit):
        lab_ttr.parse_args(["--n", "1", "3"])  # the controls run at N=2
    with pytest.raises(SystemExit):
        lab_ttr.parse_args(["--n", "0"])
    assert lab_ttr.parse_args(["--n", "1", "--no-controls"]).n == [1]


@pytest.mark.slow
def test_every_policy_setting_and_control_is_reported_and_a_rerun_resumes(tmp_path, capsys):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(RECIPE))
    out = tmp_path / "ttr"
    argv = ["--recipe", str(recipe), "--out", str(out), "--seeds", "1", "--n", "1", "2"]
    argv += ["--memory-tasks", "1", "--sft-steps", "1", "--limit", "1"]
    results = lab_ttr.main(argv)
    rows = {(r["policy"], r["setting"]): r for r in results["rows"]}
    settings = ["N=0", "N=1", "N=2"]
    controls = ["N=2, null outputs", "N=2, real outputs (oracle)", "N=2, other task's memory"]
    variants = ["N=2, sequential", "N=2, warm-start rehearser"]
    expected = {"warm": settings, "plain_sft": settings + variants, "memory_sft": settings + variants + controls}
    assert list(rows) == [(p, s) for p in lab_ttr.POLICIES for s in expected[p]]
    n_tasks = results["test_tasks"]
    assert n_tasks == len(RECIPE["categories"])
    for (_, setting), r in rows.items():
        assert r["n_seeds"] == 1 and len(r["success"]) == 1
        if setting == "N=0":
            assert r["diff_mean"] == 0 and r["tokens_per_task"] == 0
        elif "other task" not in setting:
            assert r["tokens_per_task"] > 0  # attempts were generated
        else:
            assert r["tokens_per_task"] == 0  # the other task's memory is read, not rehearsed
    demos = results["memory_demos"]
    assert sorted(demos) == ["1", "2", "3"] and all(d["tasks"] == len(RECIPE["categories"]) for d in demos.values())
    sft = json.loads((out / "memory_sft/seed0/sft/stage_done.json").read_text())["config"]
    plain = json.loads((out / "plain_sft/seed0/sft/stage_done.json").read_text())["config"]
    assert sft["data"][1:] == [d["path"] for d in demos.values()] and plain["data"] == [sft["data"][0]]
    assert sft["init"] == plain["init"] == results["warm_start"] and sft["task_ids"] == plain["task_ids"]
    sequential = json.loads((out / "memory_sft/seed0/n2_sequential/eval_config.json").read_text())
    assert sequential["rehearsal_mode"] == "sequential" and sequential["rehearser_model"] is None
    base = json.loads((out / "plain_sft/seed0/n2_warm_start/eval_config.json").read_text())
    assert base["rehearser_model"] == results["warm_start"] and base["rehearsal_mode"] == "parallel"
    assert (out / "ttr.png").stat().st_size > 1000
    printed = capsys.readouterr().out
    assert "Test-time rehearsal on EnvACE-Lab" in printed

    again = lab_ttr.main(argv)
    printed = capsys.readouterr().out
    assert "[stage] warm_start/sft ..." not in printed and "memory_demos/n1: already done" in printed
    assert again["rows"] == results["rows"]
