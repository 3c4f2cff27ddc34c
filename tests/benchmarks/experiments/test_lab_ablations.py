"""`benchmarks/experiments/lab_ablations.py` end to end on the tiny model with tiny budgets: every arm and row, the
table, the plot, and a second run that resumes every stage instead of redoing it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from benchmarks.experiments import ablations_table, lab_ablations
from benchmarks.experiments.arms import train_reward
from benchmarks.results import RENDERERS
from envace_gym.suites import make_suite

RECIPE = {
    "model": "tiny-random",
    "suite": "lab-stated",
    "categories": ["relocate", "count"],
    "min_solvable_fraction": 0.0,
    "sft": {"max_steps": 1, "max_demos": 2, "max_batch_rows": 1, "memory": {"gradient_checkpointing": False}},
    "grpo": {
        "num_steps": 1,
        "batch_tasks": 1,
        "group_size": 2,
        "max_new_tokens": 4,
        "rehearse_max_new_tokens": 4,
        "max_steps_per_turn": 2,
        "memory": {"gradient_checkpointing": False},
    },
    "eval": {"limit": 1, "max_new_tokens": 4, "max_steps_per_turn": 2},
}


@pytest.mark.slow
def test_every_arm_and_row_is_reported_and_a_rerun_resumes(tmp_path, capsys):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(RECIPE))
    out = tmp_path / "ablations"
    argv = [
        "--recipe",
        str(recipe),
        "--out",
        str(out),
        "--seeds",
        "2",
        "--ttr-n",
        "1",
        "--ttr-sequential-n",
        "1",
        "--base-rehearser-n",
        "1",
        "--ttr-memory-tokens",
        "40",
        "--ttr-critique-tokens",
        "2",
        "--sb3-timesteps",
        "64",
        "--limit",
        "1",
        "--fidelity-limit",
        "1",
    ]
    results = lab_ablations.main(argv)
    rows = {r["row"]: r for r in results["rows"]}
    assert list(rows)[:7] == [
        "warm start (SFT, pre-RL)",
        "role_grpo",
        "role_grpo_token",
        "grpo",
        "per_role",
        "real_rollouts",
        "null_rehearser",
    ]
    ttr = [name for name in rows if "TTR" in name]
    assert ttr == [
        "role_grpo + TTR N=1 parallel, trained rehearser",
        "role_grpo + TTR N=1 sequential, trained rehearser",
        "role_grpo + TTR N=1 parallel, base rehearser",
    ]
    assert any("MaskablePPO" in name for name in rows)
    for name in ("role_grpo_token", "grpo", "per_role", "real_rollouts", "null_rehearser", *ttr):
        s = rows[name]["success"]
        assert s["n"] == 2 and "diff_mean" in s and s["diff_ci95"] >= 0  # paired with role_grpo's two seeds
        paired = rows[name]["paired_tasks"]  # lab rewards are 0/1 and the categories the same size
        assert paired["tasks"] == 2 * results["test_tasks"]  # (the tiny model solves nothing: the counts are 0 here)
        assert (paired["gained"] - paired["lost"]) / paired["tasks"] == pytest.approx(s["diff_mean"])
    demos = json.loads((out / "warm_start/sft/stage_done.json").read_text())["task_ids"]
    assert rows["warm start (SFT, pre-RL)"]["real_tool_calls"] == sum(  # the references its demonstrations ran
        len(turn)
        for t in make_suite("lab-stated").tasks(RECIPE["categories"], "train")
        if t.id in demos
        for turn in make_suite("lab-stated").ground_truth(t)
    )
    for seed in (0, 1):  # the per-seed runs are distinct GRPO runs from the one shared warm start
        config = json.loads((out / f"grpo/seed{seed}/grpo/stage_done.json").read_text())["config"]
        assert (
            config["seed"] == seed and config["algo"] == "grpo" and config["init"].startswith(str(out / "warm_start"))
        )
    assert (out / "per_role/seed0/grpo/checkpoints").is_dir()
    assert rows["null_rehearser"]["real_tool_calls"] == 0  # answered by the constant, never by a backend
    for seed in (0, 1):  # every arm's policy of every seed has its own fidelity evaluation on the limited tasks
        episodes = (out / f"null_rehearser/seed{seed}/fidelity/episodes.jsonl").read_text().splitlines()
        assert len(episodes) == results["fidelity_tasks"] == len(RECIPE["categories"])
    assert set(rows["grpo"]["fidelity"]) == {
        "exact",
        "ordinary exact",
        "error exact",
        "one-step ordinary exact",
        "one-step error exact",
    }
    assert rows["grpo"]["fidelity"]["one-step error exact"] is not None  # the suite proposes mistakes: scored
    assert results["seeds_done"] == 2 and "PARTIAL" not in printed_table(results)
    assert (out / "ablations.png").stat().st_size > 1000
    assert json.loads((out / "results.json").read_text())["rows"] == json.loads(json.dumps(results["rows"]))
    printed = capsys.readouterr().out
    assert "mean +- 95% CI over seeds" in printed and "fidelity exact_match" in printed
    assert "no told rows: suite 'lab-stated' has no told variant" in printed  # --told-arms' default asked for them
    assert not any(name.startswith("told: ") for name in rows) and not (out / "told").exists()

    again = lab_ablations.main(argv)
    printed = capsys.readouterr().out
    assert (
        "[stage] warm_start/sft ..." not in printed
        and printed.count("already done") >= 20
        and "sb3_maskable_ppo/seed1: already done" in printed
    )
    assert [r["success"] for r in again["rows"]] == [r["success"] for r in results["rows"]]


def printed_table(results):
    return "\n".join(lab_ablations.table(results))


def test_paired_task_counts_and_a_single_seed_prints_no_interval():
    refs = [{"a": 0.0, "b": 0.0, "c": 0.0}, {"a": 1.0, "b": 1.0, "c": 1.0}]
    rows = [{"a": 1.0, "b": 1.0, "c": 0.0}, {"a": 0.0, "b": 0.0, "c": 1.0}]
    assert lab_ablations.paired_tasks(rows, refs) == {"gained": 2, "lost": 2, "tasks": 6}
    assert lab_ablations.paired_tasks(rows[::-1], refs) == {"gained": 1, "lost": 1, "tasks": 6}  # seed i with seed i
    one = lab_ablations.summarize([0.5], [0.25])
    assert one["ci95"] is None and one["diff_mean"] == 0.25 and one["diff_ci95"] is None
    results = {
        "model": "m",
        "seeds": 1,
        "grpo_steps": 8,
        "grpo": {"batch_tasks": 6, "group_size": 4},
        "test_tasks": 4,
        "rows": [
            {"row": "role_grpo", "success": lab_ablations.summarize([0.25])},
            {"row": "grpo", "success": one, "paired_tasks": {"gained": 2, "lost": 1, "tasks": 4}},
        ],
        "fidelity": {
            "before": dict.fromkeys(lab_ablations.FIDELITY_METRICS),
            "after": {m: lab_ablations.summarize([0.5]) for m in lab_ablations.FIDELITY_METRICS},
        },
    }
    lines = lab_ablations.table(results)
    grpo = next(line for line in lines if line.startswith("grpo"))
    assert grpo.split() == ["grpo", "0.500", "+0.250", "+2/-1"] and "+-" not in "".join(lines[2:4])
    assert any(line.startswith("tasks +/-") and "one seed: no interval" in line for line in lines)
    assert "after 0.500 (no interval: 1 seed)" in lines[-1]
    partial = lab_ablations.table({**results, "seeds": 10, "seeds_done": 1})
    assert "PARTIAL: 1 of 10 seeds done" in partial[0] and "1 seeds" in partial[0]


def test_the_default_hidden_rules_recipe_gets_its_maskable_ppo_row():
    """The slow test above runs the row on the stated world; the default recipe is the hidden world's, whose
    discrete twin the row now trains on (one tiny MaskablePPO seed on the real backend, one test task)."""
    from benchmarks.experiments.maskable_ppo import run_seed

    recipe = Path(__file__).resolve().parents[3] / "configs" / "recipes" / "lab.yaml"
    suite = yaml.safe_load(recipe.read_text())["suite"]
    assert suite == "lab" and lab_ablations.sb3_twin(suite) == "EnvACE-LabHiddenDiscrete-v0"
    assert lab_ablations.sb3_twin("lab-stated") == "EnvACE-LabDiscrete-v0" and lab_ablations.sb3_twin("bfcl") is None
    from benchmarks.lab import LabConfig, LabSuite
    from envace_gym.suites import register_suite

    register_suite("lab-2turn-twin-test", lambda: LabSuite(LabConfig(user_turns=2)))
    assert lab_ablations.sb3_twin("lab-2turn-twin-test") is None  # a twin would show turn 2's request at reset
    row = run_seed(0, 64, ["ship"], limit=1, suite=suite)
    assert row["test_tasks"] == 1 and 0 < row["train_real_calls"] <= 1024 and 0.0 <= row["test_success"] <= 1.0


HIDDEN_RECIPE = {**RECIPE, "suite": "lab", "categories": ["ship", "fill"]}


@pytest.mark.slow
def test_the_told_rows_run_from_their_own_warm_start_and_pair_with_the_hidden_role_grpo(tmp_path, capsys):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(HIDDEN_RECIPE))
    out = tmp_path / "ablations"
    argv = ["--recipe", str(recipe), "--out", str(out), "--seeds", "2", "--arms", "role_grpo", "--sb3-timesteps", "0"]
    argv += ["--limit", "1", "--fidelity-limit", "1", "--told-arms", "role_grpo", "grpo", "--grpo-lr", "2e-4"]
    results = lab_ablations.main(argv)
    assert results["grpo"]["lr"] == 2e-4
    rows = {r["row"]: r for r in results["rows"]}
    assert list(rows) == ["warm start (SFT, pre-RL)", "role_grpo", "told: warm start", "told: role_grpo", "told: grpo"]
    assert results["told_suite"] == "lab-told"
    hidden_sft = json.loads((out / "warm_start/sft/stage_done.json").read_text())["config"]
    told_sft = json.loads((out / "told/warm_start/sft/stage_done.json").read_text())["config"]
    assert told_sft["data"] == ["lab-told"] and hidden_sft["data"] == ["lab"]  # the recipe's SFT, on the told world
    assert {k: v for k, v in told_sft.items() if k not in ("data", "run_dir")} == {
        k: v for k, v in hidden_sft.items() if k not in ("data", "run_dir")
    }
    told_tasks = {t.id: t for t in make_suite("lab-told").tasks(HIDDEN_RECIPE["categories"], "test")}
    hidden_ids = None
    for seed in (0, 1):
        grpo = json.loads((out / f"told/grpo/seed{seed}/grpo/stage_done.json").read_text())["config"]
        assert grpo["suite"] == "lab-told" and grpo["seed"] == seed and grpo["algo"] == "grpo"
        assert grpo["optim"]["lr"] == 2e-4  # --grpo-lr reaches every arm, the told rows' too
        assert grpo["init"].startswith(str(out / "told/warm_start/sft"))
        hidden = [json.loads(line) for line in (out / f"role_grpo/seed{seed}/eval/episodes.jsonl").open()]
        told = [json.loads(line) for line in (out / f"told/role_grpo/seed{seed}/eval/episodes.jsonl").open()]
        hidden_ids = sorted(e["task_id"] for e in hidden)
        assert sorted(e["task_id"] for e in told) == hidden_ids and len(hidden_ids) == 2  # the same test tasks
        assert all(e["task_id"] in told_tasks for e in told)
        assert (out / f"told/grpo/seed{seed}/fidelity/episodes.jsonl").is_file()
    for name in ("told: warm start", "told: role_grpo", "told: grpo"):
        s = rows[name]["success"]
        assert "diff_mean" in s and "diff_ci95" in s  # paired with the hidden world's role_grpo, seed by seed
        paired = rows[name]["paired_tasks"]
        assert paired["tasks"] == 2 * results["test_tasks"]
        assert (paired["gained"] - paired["lost"]) / paired["tasks"] == pytest.approx(s["diff_mean"])
        assert set(rows[name]["fidelity"]) == {
            "exact",
            "ordinary exact",
            "error exact",
            "one-step ordinary exact",
            "one-step error exact",
        }
        assert rows[name]["fidelity"]["one-step error exact"] is not None
    told_eval = json.loads((out / "told/role_grpo/seed1/eval/stage_done.json").read_text())["eval"]
    assert rows["told: role_grpo"]["success"]["values"][1] == told_eval["accuracy"]
    printed = capsys.readouterr().out
    assert "told: rows on suite lab-told" in printed and "told: role_grpo" in printed

    lab_ablations.main(argv)
    printed = capsys.readouterr().out
    assert "[stage] told/warm_start/sft: already done, skipped" in printed and " ...\n" not in printed


@pytest.mark.slow
def test_workers_train_the_seeds_in_parallel_and_give_the_sequential_results(tmp_path, capsys):
    """--workers 2: the two worlds' warm starts are made side by side (a process each), then worker k runs the
    seeds s % 2 == k (each in its own process), then this process reads every stage back; the table equals a
    one-process run's."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(HIDDEN_RECIPE))
    argv = ["--recipe", str(recipe), "--seeds", "2", "--arms", "role_grpo", "grpo", "--sb3-timesteps", "0"]
    argv += ["--limit", "1", "--fidelity-limit", "1", "--told-arms", "role_grpo", "--threads", "1"]
    parallel = lab_ablations.main([*argv, "--out", str(tmp_path / "parallel"), "--workers", "2"])
    printed = capsys.readouterr().out
    for world, prefix in (("hidden", ""), ("told", "told/")):  # each made by its own process, side by side
        made = (tmp_path / "parallel" / f"warm_start_{world}.log").read_text()
        assert f"[stage] {prefix}warm_start/sft ..." in made and "seed0" not in made
        assert f"[stage] {prefix}warm_start/sft: already done, skipped" in printed
    for k in (0, 1):
        worker = (tmp_path / "parallel" / f"worker{k}.log").read_text()
        assert f"[stage] grpo/seed{k}/grpo ..." in worker and f"told/role_grpo/seed{k}/grpo ..." in worker
        assert f"seed{1 - k}/" not in worker and "warm_start/sft: already done" in worker
    for stage in ("role_grpo/seed0/grpo", "grpo/seed1/eval", "told/role_grpo/seed1/grpo"):
        assert f"[stage] {stage}: already done, skipped" in printed  # this process only read them back
    sequential = lab_ablations.main([*argv, "--out", str(tmp_path / "sequential")])
    assert [r["row"] for r in parallel["rows"]] == [r["row"] for r in sequential["rows"]]
    for a, b in zip(parallel["rows"], sequential["rows"]):
        assert a["success"]["values"] == b["success"]["values"], a["row"]
    assert parallel["seeds_done"] == 2
    role = next(r for r in parallel["rows"] if r["row"] == "role_grpo")
    per_seed = [train_reward(tmp_path / "parallel" / f"role_grpo/seed{s}/grpo/metrics.jsonl") for s in (0, 1)]
    assert role["train_reward"]["mean"] == pytest.approx(sum(r["mean"] for r in per_seed) / 2)


def test_train_reward_reads_the_newest_record_of_each_step(tmp_path):
    """A resumed run logs the steps after its checkpoint again: the newest record of a step counts, once."""
    metrics = tmp_path / "metrics.jsonl"
    steps = [(1, 0.0), (2, 0.5), (3, 0.25), (2, 1.0), (3, 0.75), (4, 0.5)]  # resumed after step 1
    metrics.write_text("".join(json.dumps({"step": k, "rollout/reward_mean": r}) + "\n" for k, r in steps))
    assert train_reward(metrics, window=2) == {"first": 0.5, "last": 0.625, "mean": 0.5625}
    assert train_reward(tmp_path / "missing.jsonl") is None


def test_a_run_at_another_grpo_budget_is_its_own_kind_and_never_replaces_the_run_of_record():
    from types import SimpleNamespace

    recipe = SimpleNamespace(grpo=SimpleNamespace(num_steps=20), suite="lab")
    kind = lab_ablations.results_kind
    assert kind(lab_ablations.parse_args([]), recipe) == "lab_ablations"
    assert kind(lab_ablations.parse_args(["--grpo-steps", "20"]), recipe) == "lab_ablations"
    assert kind(lab_ablations.parse_args(["--grpo-steps", "60"]), recipe) == "lab_ablations_budget"
    assert kind(lab_ablations.parse_args(["--grpo-lr", "3e-4"]), recipe) == "lab_ablations_budget"
    # each lab world its own section; a suite outside the lab a kind the results page refuses to store
    blind = SimpleNamespace(grpo=recipe.grpo, suite="lab-blind")
    assert kind(lab_ablations.parse_args(["--grpo-lr", "3e-4"]), blind) == "lab_ablations_budget_blind"
    bfcl = SimpleNamespace(grpo=recipe.grpo, suite="bfcl")
    assert kind(lab_ablations.parse_args([]), bfcl) == "lab_ablations_bfcl"
    assert "lab_ablations_blind" in RENDERERS and "lab_ablations_bfcl" not in RENDERERS


def test_experiments_load_the_demo_recipe_without_its_test_time_rehearsal_at_any_limit(tmp_path):
    from benchmarks.experiments.paired import load_recipe

    demo = Path(__file__).resolve().parents[3] / "configs" / "recipes" / "lab.yaml"
    recipe = load_recipe(demo, tmp_path, threads=1, limit=1)  # below the recipe's test_time_rehearsal_limit
    assert (recipe.test_time_rehearsal_n, recipe.test_time_rehearsal_limit, recipe.eval.limit) == (0, None, 1)
    assert recipe.run_dir == str(tmp_path) and recipe.threads == 1


def test_told_arms_options_and_which_recipes_get_told_rows():
    assert lab_ablations.parse_args([]).told_arms == ["role_grpo", "grpo"]
    assert lab_ablations.parse_args(["--told-arms"]).told_arms == []  # no value: no told rows
    assert lab_ablations.parse_args(["--quick", "--told-arms", "null_rehearser"]).told_arms == ["null_rehearser"]
    with pytest.raises(SystemExit):
        lab_ablations.parse_args(["--told-arms", "grpo", "grpo"])
    with pytest.raises(SystemExit):
        lab_ablations.parse_args(["--grpo-lr", "-1e-4"])
    assert lab_ablations.told_variant("lab") == "lab-told"
    assert lab_ablations.told_variant("lab-stated") is None and lab_ablations.told_variant("lab-told") is None
    from benchmarks.lab import LabConfig, LabSuite
    from envace_gym.suites import register_suite

    register_suite("lab-seed1-told-test", lambda: LabSuite(LabConfig(seed=1)))
    assert lab_ablations.told_variant("lab-seed1-told-test") is None  # lab-told holds the default world's tasks


def test_the_stored_results_render_with_and_without_told_rows(tmp_path):
    """The results page renders the ablations' results.json through the printed table: the stored one (no told
    rows) as before, and the same with told rows appended, each printed with its pairing to role_grpo."""
    from benchmarks import results as page

    stored = Path(__file__).resolve().parents[3] / "docs" / "results" / "lab_ablations" / "results.json"
    old = json.loads(stored.read_text())
    old = {k: v for k, v in old.items() if k != "told_suite"}
    old["rows"] = [r for r in old["rows"] if not r["row"].startswith("told")]
    rendered = page.render_ablations(old, stored.parent)
    assert rendered[5 : 5 + len(lab_ablations.table(old))] == lab_ablations.table(old)
    assert not any("told" in line for line in rendered)
    # the run's wall clock and stage time, unless the writing process only read finished stages back (seconds)
    timed = page.render_ablations({**old, "wall_s": 6667.0, "stage_minutes": 215.1}, stored.parent)
    assert "Time: the process that wrote these results ran 111 min (wall clock, its workers included); its " in (
        "\n".join(timed)
    )
    assert not any(line.startswith("Time:") for line in page.render_ablations({**old, "wall_s": 20.7}, stored.parent))

    rows = {r["row"]: r for r in old["rows"]}
    told = {
        **old,
        "told_suite": "lab-told",
        "rows": old["rows"]
        + [{**rows["warm start (SFT, pre-RL)"], "row": "told: warm start"}, {**rows["grpo"], "row": "told: grpo"}],
    }
    lines = page.render_ablations(told, tmp_path)
    grpo = next(line for line in lines if line.startswith("told: grpo"))
    s = rows["grpo"]["success"]
    assert grpo.split()[2:8] == [
        f"{s['mean']:.3f}",
        "+-",
        f"{s['ci95']:.3f}",
        f"{s['diff_mean']:+.3f}",
        "+-",
        f"{s['diff_ci95']:.3f}",
    ]
    assert any(line.startswith("told: warm start") for line in lines)
    assert any(line.startswith("told: rows on suite lab-told") for line in lines)


def test_comparisons_say_which_way_each_paired_difference_goes_and_whether_it_is_resolved(tmp_path):
    """One bullet per comparison whose row was run, from the row's paired difference to role_grpo (row - role_grpo
    in results.json, role_grpo - row in the sentence): resolved only when the interval excludes 0, and then in or
    against the claim's direction; the results page prints the same bullets under the table."""
    from benchmarks import results as page

    def row(name, diff=None, half=None):
        success = {"values": [0.5, 0.5], "mean": 0.5, "ci95": 0.01, "n": 2}
        if diff is not None:
            success.update(diff_mean=diff, diff_ci95=half)
        return {"row": name, "success": success, "paired_tasks": {"gained": 3, "lost": 9, "tasks": 20}}

    results = {
        "rows": [
            row("role_grpo"),
            row("grpo", -0.05, 0.02),  # role_grpo ahead: as the paper claims
            row("per_role", 0.05, 0.02),  # per_role ahead: against the claim
            row("null_rehearser", -0.01, 0.02),  # interval includes 0
            row("real_rollouts", 0.0, 0.01),
            row("warm start (SFT, pre-RL)", 0.03, 0.02),  # the warm start ahead: against the claim
            row("told: role_grpo", 0.03, None),  # one seed
        ]
    }
    results["rows"][1]["where_failed"] = {"failed": 10.0, "at call 1": 6.0, "at a later call": 3.5, "other": 0.5}
    results["rows"][1]["train_reward"] = {"first": 0.125, "last": 0.25, "mean": 0.2}
    lines = ablations_table.comparisons(results)
    by_row = {
        name: next(line for line in lines if f"role_grpo − {name}:" in line)
        for name in (
            "grpo",
            "per_role",
            "null_rehearser",
            "real_rollouts",
            "warm start (SFT, pre-RL)",
            "told: role_grpo",
        )
    }
    assert len(lines) == 6 and not any("role_grpo_act_only" in line for line in lines)
    assert (
        "role_grpo − grpo: +0.050 +- 0.020" in by_row["grpo"]
        and "Resolved: role_grpo ahead, as claimed." in by_row["grpo"]
    )
    assert "only role_grpo solved / only grpo solved, summed over 2 seeds: 9 / 3" in by_row["grpo"]
    assert "Resolved: per_role ahead, against the claim." in by_row["per_role"]
    assert "Not resolved (the 95% interval includes 0)." in by_row["null_rehearser"]
    assert "consistent with the claim, though real_rollouts may be ahead by up to 0.010." in by_row["real_rollouts"]
    # the row's name as written (str.capitalize would print "warm start (sft, pre-rl)")
    assert "Resolved: warm start (SFT, pre-RL) ahead, against the claim." in by_row["warm start (SFT, pre-RL)"]
    assert "One seed: no interval, not resolved." in by_row["told: role_grpo"]
    # a claim of no difference ("reaches") is contradicted only by the row resolved ahead
    for diff, says in (
        (-0.05, "Resolved: role_grpo ahead, so it reaches real_rollouts and more"),
        (0.05, "Resolved: real_rollouts ahead, against the claim."),
    ):
        results["rows"][4]["success"].update(diff_mean=diff, diff_ci95=0.02)
        assert says in next(line for line in ablations_table.comparisons(results) if "real_rollouts:" in line)
    results["rows"][4]["success"].update(diff_mean=0.0, diff_ci95=0.01)
    results.update(model="lab-tiny", seeds=2, grpo_steps=1, grpo={"batch_tasks": 1, "group_size": 2}, test_tasks=20)
    results["fidelity"] = {
        "before": dict.fromkeys(ablations_table.FIDELITY_METRICS),
        "after": {m: {"mean": 0.0, "ci95": None, "n": 0} for m in ablations_table.FIDELITY_METRICS},
    }
    rendered = page.render_ablations(results, tmp_path)
    assert rendered[-len(lines) :] == lines
    where = next(line for line in rendered if line.startswith("  grpo "))
    assert where.split()[1:] == ["10.0", "failed:", "6.0", "/", "3.5", "/", "0.5"]
    reward = [line for line in rendered if line.startswith("  grpo ")][1]
    assert reward.split()[1:] == ["0.125", "->", "0.250", "(0.200)"]


@pytest.mark.parametrize("workers", [[], ["--workers", "2", "--worker", "0"]])
def test_told_rows_scored_on_other_test_tasks_are_refused_with_or_without_workers(tmp_path, monkeypatch, workers):
    """The told rows are paired task by task with the hidden world's role_grpo: a told warm start evaluated on
    other task ids stops the run, whether the warm start is made before the workers or after seed 0."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(HIDDEN_RECIPE))
    made: list[str] = []

    def fake_warm_start(stages, recipe, models, prefix, fidelity_limit, log=print):
        made.append(prefix)
        ids = ["ship_test0"] if not prefix else ["ship_test1"]
        return {"model": f"{prefix}warm", "eval": {"task_rewards": dict.fromkeys(ids, 1.0)}}

    monkeypatch.setattr(lab_ablations, "shared_warm_start", fake_warm_start)
    monkeypatch.setattr(lab_ablations, "train_and_score", lambda *a, **k: {"eval": {}})  # the hidden arm's stages
    argv = ["--recipe", str(recipe), "--out", str(tmp_path / "out"), "--seeds", "1", "--arms", "role_grpo"]
    argv += ["--sb3-timesteps", "0", "--ttr-n", "--base-rehearser-n", "--told-arms", "role_grpo", *workers]
    with pytest.raises(RuntimeError, match="lab-told was evaluated on other test tasks than lab"):
        lab_ablations.main(argv)
    assert made == ["", lab_ablations.TOLD_PREFIX]


def _start_parallel_run(tmp_path, worker_script: str):
    """Start `lab_ablations.run_workers` (2 workers) in a child Python whose interpreter is `worker_script`, a shell
    script standing in for each worker that writes ``pid.<k>`` under `tmp_path`; wait until both have. Returns the
    parent process and each worker's pid file's integers."""
    import os
    import subprocess
    import sys
    import textwrap
    import time

    script = tmp_path / "worker.sh"
    script.write_text(worker_script)
    script.chmod(0o755)
    parent = textwrap.dedent(f"""
        import argparse, sys
        from pathlib import Path
        from benchmarks.experiments import lab_ablations
        sys.executable = {str(script)!r}
        lab_ablations.run_workers(argparse.Namespace(workers=2, seeds=2, argv=[]), Path({str(tmp_path)!r}))
    """)
    proc = subprocess.Popen([sys.executable, "-c", parent], cwd=os.getcwd())
    pid_files = [tmp_path / "pid.0", tmp_path / "pid.1"]
    deadline = time.monotonic() + 60
    while not all(p.is_file() and p.read_text().strip() for p in pid_files):
        assert time.monotonic() < deadline and proc.poll() is None, "the workers did not start"
        time.sleep(0.1)
    return proc, [[int(x) for x in p.read_text().split()] for p in pid_files]


def _assert_gone(pid: int, what: str) -> None:
    """Wait up to 10 s for process `pid` to exit; fail naming `what` if it does not."""
    import os
    import time

    deadline = time.monotonic() + 10
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        assert time.monotonic() < deadline, f"{what} still runs after its parent was stopped"
        time.sleep(0.1)


def _kill_all(pids) -> None:
    import os
    import signal

    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_sigterm_to_a_parallel_run_stops_its_workers(tmp_path):
    """A parallel run stopped by SIGTERM (a job scheduler, `kill`) takes its workers with it instead of leaving
    them training on the cores."""
    import signal

    # each stand-in records its pid, then waits
    script = f'#!/bin/sh\necho $$ > "{tmp_path}/pid.$(echo "$@" | tr -dc 0-9 | tail -c 1)"\nexec sleep 120\n'
    proc, pids = _start_parallel_run(tmp_path, script)
    workers = [p[0] for p in pids]
    try:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) != 0
        for pid in workers:
            _assert_gone(pid, f"worker {pid}")
    finally:  # a failing run leaves no sleeper behind
        _kill_all(workers)


def test_a_second_sigterm_does_not_cut_the_workers_cleanup_short(tmp_path):
    """Stopping a worker takes a while (here: 2 s after its SIGTERM); a second SIGTERM to the parent meanwhile
    must not abandon the cleanup and leave the other worker running."""
    import signal
    import time

    # each stand-in records its pid and its sleep's; on SIGTERM takes 2 s to exit
    script = (
        "#!/bin/sh\ntrap 'sleep 2; kill $!; exit 0' TERM\nsleep 120 &\n"
        f'echo $$ $! > "{tmp_path}/pid.$(echo "$@" | tr -dc 0-9 | tail -c 1)"\nwait\n'
    )
    proc, pids = _start_parallel_run(tmp_path, script)
    workers, sleeps = zip(*pids)
    try:
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)  # the parent now waits for worker 0 to exit
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) != 0
        _assert_gone(workers[1], "worker 1")
    finally:  # a failing run leaves no worker behind
        _kill_all(workers + sleeps)
