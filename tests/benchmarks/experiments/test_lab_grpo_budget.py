"""`benchmarks/experiments/lab_grpo_budget.py`: its paired comparison, and the whole protocol on the tiny model with
tiny budgets (every checkpoint evaluated on the warm start's tasks, the table, the plot, a resumed rerun)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from benchmarks.experiments import lab_grpo_budget
from benchmarks.stats import mcnemar_exact
from tests.benchmarks.experiments.test_lab_ablations import HIDDEN_RECIPE, RECIPE


def test_compare_pairs_each_seed_with_its_reference():
    warm = {f"t{i}": 0.0 for i in range(10)}
    better = {f"t{i}": 1.0 if i < 8 else 0.0 for i in range(10)}  # 8 gained, 0 lost: p = 2/256
    mixed = {f"t{i}": 1.0 if i < 2 else 0.0 for i in range(10)}  # 2 gained: not resolved
    c = lab_grpo_budget.compare([better, mixed], [warm, warm])
    assert c["success"] == [0.8, 0.2]
    assert c["diff_mean"] == pytest.approx(0.5) and c["diff_ci95"] > 0.5  # two seeds far apart: a wide interval
    assert (c["gained"], c["lost"]) == (10, 0)
    assert c["p_values"] == [mcnemar_exact(8, 0), mcnemar_exact(2, 0)]
    assert c["resolved_seeds"] == 1
    worse = lab_grpo_budget.compare([warm], [better])  # losses are never counted as resolved gains
    assert worse["resolved_seeds"] == 0 and worse["lost"] == 8 and worse["ci95"] is None


def test_options_are_checked(tmp_path):
    with pytest.raises(SystemExit):
        lab_grpo_budget.parse_args(["--steps", "10", "--eval-every", "3"])
    with pytest.raises(SystemExit):
        lab_grpo_budget.parse_args(["--arms"])
    with pytest.raises(SystemExit):
        lab_grpo_budget.parse_args(["--lr", "0"])
    with pytest.raises(SystemExit):
        lab_grpo_budget.parse_args(["--workers", "2", "--worker", "2"])
    for bad in (["--lr"], ["--lr", "1e-4", "1.0000001e-4"], ["--split", "valid", "--arms", "grpo"]):
        with pytest.raises(SystemExit):  # no lr; two lrs one folder name; a selection run without role_grpo
            lab_grpo_budget.parse_args(bad)
    with pytest.raises(SystemExit):  # the rule needs intervals: two seeds at least
        lab_grpo_budget.parse_args(["--split", "valid", "--seeds", "1"])
    assert lab_grpo_budget.parse_args(["--split", "valid"]).out == "runs/lab_grpo_budget_valid"
    assert lab_grpo_budget.parse_args([]).out == "runs/lab_grpo_budget"
    anchor = lab_grpo_budget.parse_args(["--split", "valid", "--arms", "role_grpo", "role_grpo_wm_demos_w0.1"])
    assert anchor.out == "runs/lab_anchor_valid" and lab_grpo_budget.results_kind(anchor) == "lab_anchor_valid"
    on_test = lab_grpo_budget.parse_args(["--arms", "role_grpo", "role_grpo_wm_demos"])
    assert lab_grpo_budget.results_kind(on_test) == "lab_grpo_budget"  # only a validation run chooses
    # real-backend rollouts alone are the regression test's budget, not the method's: their own section
    real = lab_grpo_budget.parse_args(["--arms", "real_rollouts"])
    assert real.out == "runs/lab_grpo_budget_real" and lab_grpo_budget.results_kind(real, "lab-blind") == (
        "lab_grpo_budget_real_blind"
    )
    assert lab_grpo_budget.results_kind(lab_grpo_budget.parse_args(["--arms", "real_rollouts", "role_grpo"])) == (
        "lab_grpo_budget"
    )
    # each lab world its own folder and kind; a recipe outside the lab, or none, is a usage error
    recipes = Path(lab_grpo_budget.RECIPE).parent
    blind = lab_grpo_budget.parse_args(["--split", "valid", "--recipe", str(recipes / "lab-blind.yaml")])
    assert blind.out == "runs/lab_grpo_budget_valid_blind"
    assert lab_grpo_budget.results_kind(on_test, "lab-stated") == "lab_grpo_budget_stated"
    for recipe in (recipes / "lab-told.yaml", tmp_path / "no_such_recipe.yaml"):
        with pytest.raises(SystemExit):
            lab_grpo_budget.parse_args(["--recipe", str(recipe)])


def test_a_selection_run_on_a_world_without_a_validation_split_stops_before_training(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(RECIPE))  # the stated-rules world
    with pytest.raises(ValueError, match="no validation split"):
        lab_grpo_budget.main(["--recipe", str(recipe), "--out", str(tmp_path / "out"), "--split", "valid"])
    assert not (tmp_path / "out" / "warm_start").exists()


@pytest.mark.slow
def test_every_checkpoint_is_evaluated_and_a_rerun_resumes(tmp_path, capsys):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(RECIPE))
    out = tmp_path / "budget"
    argv = ["--recipe", str(recipe), "--out", str(out), "--seeds", "2", "--steps", "2", "--eval-every", "1"]
    argv += ["--arms", "role_grpo", "null_rehearser", "--limit", "1"]
    results = lab_grpo_budget.main(argv)
    assert results["seeds_done"] == 2 and results["test_tasks"] == len(RECIPE["categories"])
    for arm in ("role_grpo", "null_rehearser"):
        row = results["arms"][arm]
        assert list(row["checkpoints"]) == ["1", "2"]
        for step in (1, 2):
            c = row["checkpoints"][str(step)]
            assert len(c["success"]) == 2 and len(c["p_values"]) == 2
            for seed in (0, 1):  # each checkpoint's own model, evaluated on the warm start's tasks
                stage = json.loads((out / f"{arm}/seed{seed}/eval_step{step}/stage_done.json").read_text())
                assert stage["config"]["model"].endswith(f"step_{step:06d}/model")
    assert results["arms"]["null_rehearser"]["real_tool_calls"] == [0, 0]
    assert (out / "grpo_budget.png").stat().st_size > 1000
    assert json.loads((out / "results.json").read_text())["arms"] == json.loads(json.dumps(results["arms"]))
    printed = capsys.readouterr().out
    assert "GRPO budget on EnvACE-Lab" in printed and "resolved seeds" in printed

    again = lab_grpo_budget.main(argv)
    printed = capsys.readouterr().out
    assert "[stage] warm_start/sft ..." not in printed and printed.count("already done") >= 13
    assert again["arms"] == results["arms"]


@pytest.mark.slow
def test_a_budget_chosen_on_the_validation_split_with_another_lr_and_two_workers(tmp_path, capsys):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(HIDDEN_RECIPE))  # the hidden-rules world: the one with a validation split
    out = tmp_path / "budget"
    argv = ["--recipe", str(recipe), "--out", str(out), "--seeds", "2", "--steps", "1", "--eval-every", "1"]
    argv += ["--limit", "1", "--split", "valid", "--lr", "3e-4", "1e-3", "--workers", "2", "--threads", "1"]
    results = lab_grpo_budget.main(argv)
    assert results["split"] == "valid" and results["grpo"]["lrs"] == [3e-4, 1e-3] and results["seeds_done"] == 2
    assert list(results["arms"]) == ["role_grpo lr=0.0003", "role_grpo lr=0.001"]
    # dealt in turn lr by lr, (3e-4 seed 0, 3e-4 seed 1, 1e-3 seed 0, 1e-3 seed 1): here worker k gets seed k
    for seed, lr in [(0, 3e-4), (0, 1e-3), (1, 3e-4), (1, 1e-3)]:
        run = out / f"role_grpo/lr{lr:g}/seed{seed}"
        grpo = json.loads((run / "grpo/stage_done.json").read_text())
        assert grpo["config"]["optim"]["lr"] == lr and grpo["config"]["seed"] == seed
        started = f"[stage] role_grpo/lr{lr:g}/seed{seed}/grpo ..."
        assert started in (out / f"worker{seed}.log").read_text()
        assert started not in (out / f"worker{1 - seed}.log").read_text()
        evaluated = json.loads((run / "eval_step1/stage_done.json").read_text())
        assert evaluated["config"]["split"] == "valid"
        assert results["arms"][f"role_grpo lr={lr:g}"]["lr"] == lr
    warm = [json.loads(line) for line in (out / "warm_start/eval/episodes.jsonl").read_text().splitlines()]
    assert warm and all("_valid" in e["task_id"] for e in warm)
    assert "validation tasks" in capsys.readouterr().out

    # a rerun that adds an arm deals out only its runs; the finished ones are read back by this process
    again = lab_grpo_budget.main([*argv, "--arms", "role_grpo", "null_rehearser"])
    logs = (out / "worker0.log").read_text() + (out / "worker1.log").read_text()
    assert "[stage] role_grpo/" not in logs and logs.count("[stage] null_rehearser/lr0.001/seed1/grpo ...") == 1
    assert again["arms"]["role_grpo lr=0.0003"] == results["arms"]["role_grpo lr=0.0003"]
    assert len(again["arms"]["null_rehearser lr=0.001"]["seeds"]) == 2

    # and one that adds a learning rate trains only that lr's runs, in their own folders
    lr_argv = [*argv[: argv.index("--lr") + 1], "3e-4", "1e-3", "1e-4", *argv[argv.index("--workers") :]]
    third = lab_grpo_budget.main(lr_argv)
    logs = (out / "worker0.log").read_text() + (out / "worker1.log").read_text()
    assert "[stage] role_grpo/lr0.0001/seed0/grpo ..." in logs and "role_grpo/lr0.0003/seed0/grpo ..." not in logs
    assert third["arms"]["role_grpo lr=0.0003"] == results["arms"]["role_grpo lr=0.0003"]
    assert third["arms"]["role_grpo lr=0.0001"]["lr"] == 1e-4 and "No choice yet" not in " ".join(
        lab_grpo_budget.table(third)
    )


def test_the_validation_rule_chooses_the_largest_gain_above_zero_or_nothing():
    from benchmarks.experiments.result_tables import budget_choice, grpo_budget_table

    def cell(diff, ci):
        return {"diff_mean": diff, "diff_ci95": ci, "mean": 0.5 + diff, "ci95": ci, "gained": 1, "lost": 0}

    def results(rows):
        arms = {
            name: {"lr": lr, "seeds": [0, 1, 2], "checkpoints": {str(k): cell(*v) for k, v in cps.items()}}
            for name, lr, cps in rows
        }
        for row in arms.values():
            for c in row["checkpoints"].values():
                c["resolved_seeds"] = 0
        return {
            "arms": arms,
            "split": "valid",
            "model": "m",
            "seeds": 3,
            "test_tasks": 6,
            "warm_success": 0.5,
            "grpo": {"batch_tasks": 1, "group_size": 2, "lr": None, "lrs": [1e-4, 3e-4]},
        }

    chosen = results(
        [
            ("role_grpo lr=0.0001", 1e-4, {20: (0.03, 0.01), 40: (0.05, 0.06)}),  # 40 larger, but its interval has 0
            ("role_grpo lr=0.0003", 3e-4, {20: (0.03, 0.02), 40: (0.03, 0.02)}),  # ties 1e-4 at 20: higher lr
            ("real_rollouts lr=0.0001", 1e-4, {20: (0.2, 0.01)}),  # a diagnostic arm is never chosen
        ]
    )
    assert "role_grpo lr=0.0001 at 20 steps: +0.030 +- 0.010" in budget_choice(chosen)
    assert budget_choice(chosen).startswith("Chosen by the rule")
    nothing = results([("role_grpo", 1e-4, {20: (-0.01, 0.02), 40: (0.01, 0.02)})])
    sentence = budget_choice(nothing)
    assert sentence.startswith("Nothing chosen") and "role_grpo at 40 steps: +0.010 +- 0.020" in sentence
    assert "Nothing chosen" in " ".join(grpo_budget_table(nothing))
    assert "Nothing chosen" not in " ".join(grpo_budget_table({**nothing, "split": "test"}))
    partial = {**chosen, "seeds_done": 2}  # results.json is written after every seed: no choice from a part
    assert budget_choice(partial) == "No choice yet: 2 of 3 seeds are in."


def test_the_anchor_rule_chooses_the_best_final_validation_success_and_never_the_reference(tmp_path):
    from benchmarks.experiments.result_tables import anchor_choice, grpo_budget_table
    from benchmarks.results import render_grpo_budget

    def row(weight, means):
        cps = {
            str(k): {"mean": m, "ci95": 0.01, "diff_mean": m - 0.5, "diff_ci95": 0.01, "gained": 1, "lost": 0}
            for k, m in means.items()
        }
        for c in cps.values():
            c["resolved_seeds"] = 0
        return {"seeds": [0, 1, 2], "lr": 1e-4, "world_model_loss_weight": weight, "checkpoints": cps}

    results = {
        "kind": "lab_anchor_valid",
        "split": "valid",
        "model": "m",
        "seeds": 3,
        "steps": 60,
        "test_tasks": 6,
        "warm_success": 0.5,
        "grpo": {"batch_tasks": 1, "group_size": 2, "lr": 1e-4, "lrs": [1e-4]},
        "arms": {
            "role_grpo lr=0.0003": {**row(0.0, {20: 0.5, 60: 0.1}), "lr": 3e-4},  # not the chosen row's lr
            "role_grpo lr=0.0001": row(0.0, {20: 0.5, 60: 0.9}),  # the reference is never chosen
            "role_grpo_wm_demos_w0.3 lr=0.0001": row(0.3, {20: 0.8, 60: 0.52}),  # best at 20, not at the end
            "role_grpo_wm_demos_w0.1 lr=0.0001": row(0.1, {20: 0.5, 60: 0.55}),
            "role_grpo_wm_demos lr=0.0001": row(1.0, {20: 0.5, 60: 0.55}),  # ties 0.1: the smaller weight wins
        },
    }
    sentence = anchor_choice(results)
    assert "role_grpo_wm_demos_w0.1 lr=0.0001, weight 0.1: 0.550, -0.350 against role_grpo at the same lr" in sentence
    assert " ".join(grpo_budget_table(results)).endswith(sentence)  # the sentence, wrapped, under the table
    assert "Nothing chosen" not in " ".join(grpo_budget_table(results))  # the budget rule is not this run's
    section = render_grpo_budget({**results, "command": "python -m benchmarks.experiments.lab_grpo_budget"}, tmp_path)
    assert section[0] == "## Choosing the world-model anchor's weight on the validation split"
    blind = {**results, "kind": "lab_anchor_valid_blind", "command": "python -m benchmarks.experiments.lab_grpo_budget"}
    assert " ".join(grpo_budget_table(blind)).endswith(sentence)  # the anchor rule on any lab world
    assert render_grpo_budget(blind, tmp_path)[0].startswith(section[0] + ", on the lab's blind variant")
    assert anchor_choice({**results, "seeds_done": 1}) == "No choice yet: 1 of 3 seeds are in."
    no_anchor = {**results, "arms": {"role_grpo lr=0.0001": results["arms"]["role_grpo lr=0.0001"]}}
    assert anchor_choice(no_anchor).startswith("No world-model anchor row")
