"""`benchmarks/experiments/lab_env_cost.py`: its arms (also reachable from the ablations), its options, the table
and plot of a results.json and the results page; end to end on the tiny model with tiny budgets, and a resumed
rerun."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest
import yaml

from agents.config import TrainConfig, load_dataclass
from agents.pipeline import PipelineConfig
from benchmarks import results as results_page
from benchmarks.experiments import lab_ablations, lab_env_cost
from benchmarks.experiments.arms import arm_name, env_cost_arms
from benchmarks.experiments.result_tables import env_cost_table
from tests.benchmarks.experiments.test_lab_ablations import RECIPE


def test_the_arms_and_their_names():
    arms = env_cost_arms()
    assert list(arms) == [
        "hybrid_p0",
        "hybrid_p0.05",
        "hybrid_p0.2",
        "hybrid_p1",
        "hybrid_p0.05_wm1",
        "hybrid_p0.2_wm1",
        "hybrid_p1_wm1",
    ]  # p = 0 with the loss is the run without it
    assert arms["hybrid_p0.2_wm1"] == {"rollout": "hybrid", "real_call_prob": 0.2, "world_model_loss_weight": 1.0}
    for fields in arms.values():
        TrainConfig(**fields)  # each is a valid setting
    assert list(env_cost_arms((0.0, 0.5), 0.0)) == ["hybrid_p0", "hybrid_p0.5"]
    assert arm_name(0.5, 2) == "hybrid_p0.5_wm2"
    # the ablations reach them, and still run only the paper's arms by default
    assert all(lab_ablations.ARMS[name] == fields for name, fields in arms.items())
    args = lab_ablations.parse_args([])
    assert args.arms == list(lab_ablations.DEFAULT_ARMS) and not any(a.startswith("hybrid") for a in args.arms)
    assert lab_ablations.parse_args(["--arms", "role_grpo", "hybrid_p0.05_wm1"]).arms[-1] == "hybrid_p0.05_wm1"


def test_options_are_checked(tmp_path):
    warm = ["--warm", str(tmp_path)]
    for bad in (["--probs", "0.2", "1"], ["--probs", "0", "1.5"], ["--probs", "0", "0"], ["--seeds", "0"]):
        with pytest.raises(SystemExit):
            lab_env_cost.parse_args(bad + warm)
    with pytest.raises(SystemExit):
        lab_env_cost.parse_args(["--warm", str(tmp_path / "missing")])
    args = lab_env_cost.parse_args(["--quick", *warm])
    assert (args.seeds, args.grpo_steps, args.limit, args.fidelity_limit, args.threads) == (2, 2, 1, 1, 1)
    assert args.warm == str(tmp_path.resolve()) and lab_env_cost.parse_args(["--warm", "none"]).warm is None
    defaults = lab_env_cost.parse_args(warm)
    assert (defaults.seeds, defaults.limit, defaults.world_model_weight) == (5, 100, 1.0)
    assert defaults.probs == [0, 0.05, 0.2, 1] and defaults.grpo_steps is None  # the recipe's


def _record(seed: int, rewards: dict[str, float], calls: int, answers: int, fid: float) -> dict:
    return {
        "seed": seed,
        "eval": {"task_rewards": rewards},
        "train": {
            "real_tool_calls": calls,
            "real_answers": answers,
            "verifier_replay_calls": 10,
            "world_model_tokens": 3 * answers,
        },
        "fidelity": {"fidelity_ordinary_exact_match": fid, "fidelity_error_exact_match": fid / 2},
        "train_s": 30.0,
        "eval_s": 10.0,
    }


def test_a_results_json_is_tabulated_plotted_and_rendered(tmp_path):
    """Two seeds of three arms: the paired difference to p = 0, the counts, a partial second seed, the page."""
    args = argparse.Namespace(recipe="r.yaml", seeds=2, world_model_weight=1.0)
    recipe = load_dataclass(PipelineConfig, lab_env_cost.RECIPE)
    arms = env_cost_arms((0.0, 0.2), 1.0)
    tasks = [f"t{i}" for i in range(4)]
    ref = [dict.fromkeys(tasks, 0.0), {**dict.fromkeys(tasks, 0.0), "t0": 1.0}]
    better = [{**r, "t1": 1.0, "t2": 1.0} for r in ref]
    runs = {
        "hybrid_p0": [_record(s, ref[s], 0, 0, 0.5) for s in (0, 1)],
        "hybrid_p0.2": [_record(s, better[s], 120, 80, 0.6) for s in (0, 1)],
        "hybrid_p0.2_wm1": [_record(0, ref[0], 100, 70, 0.9)],  # its second seed is not done yet
    }
    warm_row = {
        "success": 0.25,
        "task_rewards": dict.fromkeys(tasks, 0.0),
        "fidelity": {"exact": 0.4, "ordinary exact": 0.5, "error exact": 0.1},
        "fidelity_tasks": 6,
        "seconds": 12.0,
    }
    result = lab_env_cost.summarize(args, recipe, 20, "warm", warm_row, arms, runs)
    result.update(seeds_done=1, command="python -m benchmarks.experiments.lab_env_cost --seeds 2", date="2026-01-01")
    rows = {r["arm"]: r for r in result["rows"]}
    assert list(rows) == ["hybrid_p0", "hybrid_p0.2", "hybrid_p0.2_wm1"]
    hybrid = rows["hybrid_p0.2"]
    assert hybrid["diff_mean"] == pytest.approx(0.5) and hybrid["diff_ci95"] == pytest.approx(0.0)
    assert (hybrid["gained"], hybrid["lost"]) == (4, 0) and hybrid["real_tool_calls"] == 120.0
    assert hybrid["real_answers"] == 80.0 and hybrid["fidelity"]["error exact"] == pytest.approx(0.3)
    assert rows["hybrid_p0.2_wm1"]["seeds"] == [0] and rows["hybrid_p0.2_wm1"]["ci95"] is None
    assert rows["hybrid_p0"]["diff_mean"] == 0.0 and rows["hybrid_p0"]["seconds"] == 40.0

    lines = env_cost_table(result)
    assert "PARTIAL: 1 of 2 seeds done" in lines[0] and "20 GRPO steps" in lines[0]
    line = next(x for x in lines if x.startswith("hybrid_p0.2 "))
    assert line.split() == ["hybrid_p0.2", "0.2", "0", "0.625", "+-", "1.588", "+0.500", "+-", "0.000", "+4/-0"] + [
        "120",
        "80",
        "0.600",
        "0.300",
        "40",
    ]
    assert next(x for x in lines if x.startswith("hybrid_p0 ")).split()[3:6] == ["0.125", "+-", "1.588"]
    assert lines[3].split()[:4] == ["warm", "start", "(SFT)", "0.250"]

    out = tmp_path / "run"
    out.mkdir()
    (out / "results.json").write_text(json.dumps(result))
    lab_env_cost.plot(result, out / "env_cost.png")
    assert (out / "env_cost.png").stat().st_size > 1000
    store = tmp_path / "docs" / "results"
    assert results_page.store(out, store) == store / "lab_env_cost"
    page = results_page.render(store, tmp_path / "docs" / "results.md").read_text()
    assert "## Environment cost on the lab" in page and result["command"] in page
    assert line in page and "![env_cost](results/lab_env_cost/env_cost.png)" in page
    # a run on another lab world is its own kind and section: it never replaces the default world's
    blind = lab_env_cost.summarize(
        args, dataclasses.replace(recipe, suite="lab-blind"), 20, "warm", warm_row, arms, runs
    )
    assert blind["kind"] == "lab_env_cost_blind"
    blind.update(
        seeds_done=1, command=result["command"] + " --recipe configs/recipes/lab-blind.yaml", date="2026-01-02"
    )
    (out / "results.json").write_text(json.dumps(blind))
    assert results_page.store(out, store) == store / "lab_env_cost_blind"
    page = results_page.render(store, tmp_path / "docs" / "results.md").read_text()
    assert (
        page.count("## Environment cost on the lab") == 2 and "## Environment cost on the lab's blind variant" in page
    )


@pytest.mark.slow
def test_every_arm_is_trained_scored_and_tabulated_and_a_rerun_resumes(tmp_path, capsys):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(RECIPE))
    out = tmp_path / "env_cost"
    argv = ["--recipe", str(recipe), "--out", str(out), "--warm", "none", "--seeds", "1", "--grpo-steps", "1"]
    argv += ["--probs", "0", "1", "--limit", "1", "--fidelity-limit", "1"]
    results = lab_env_cost.main(argv)
    rows = {r["arm"]: r for r in results["rows"]}
    assert list(rows) == ["hybrid_p0", "hybrid_p1", "hybrid_p1_wm1"] and results["seeds_done"] == 1
    assert rows["hybrid_p0"]["real_tool_calls"] == rows["hybrid_p0"]["real_answers"] == 0
    for arm in ("hybrid_p1", "hybrid_p1_wm1"):  # every call answered by the backend: no catch-up
        assert rows[arm]["real_tool_calls"] == rows[arm]["real_answers"]
    assert rows["hybrid_p1"]["world_model_tokens"] == 0  # the loss is off: no target in the batch
    config = json.loads((out / "hybrid_p1_wm1/seed0/grpo/stage_done.json").read_text())["config"]
    assert config["rollout"] == "hybrid" and config["real_call_prob"] == 1.0 and config["world_model_loss_weight"] == 1
    assert config["init"].startswith(str(out / "warm_start"))
    assert (out / "env_cost.png").stat().st_size > 1000 and (out / "hybrid_p1/seed0/fidelity/episodes.jsonl").is_file()
    printed = capsys.readouterr().out
    assert "Environment cost on EnvACE-Lab" in printed
    page = results_page.render(store_dir=results_page.store(out, tmp_path / "store").parent, page=tmp_path / "r.md")
    text = page.read_text()
    assert "## Environment cost on the lab" in text and "hybrid_p1_wm1" in text and "env_cost.png" in text
    again = lab_env_cost.main(argv)
    printed = capsys.readouterr().out
    assert "hybrid_p1_wm1/seed0/grpo: already done" in printed and "[stage] hybrid_p1/seed0/grpo ..." not in printed
    assert again["rows"] == results["rows"]
