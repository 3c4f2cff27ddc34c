"""The paper's controlled comparisons on EnvACE-Lab, in miniature: same data, reward and step budget per arm.

One warm start (the lab recipe's SFT stage on real executions, seed 0) is shared by every arm; each arm then
runs role-wise GRPO's recipe with one factor changed, once per seed, and every trained policy is scored on
the same test-split tasks against the real backend (greedy, as the recipe's evaluations; by default every
test task of the hidden-rules world, 100 per family), and its rehearsal fidelity is measured on the first
``--fidelity-limit`` test tasks of each family:

| arm | what changes (docs/design.md §1; the paper's ablations) |
|---|---|
| ``role_grpo`` | EnvACE: one shared policy, rehearsed rollouts, one baseline per (group, role) |
| ``role_grpo_token`` | the same with the baseline's weights per token instead of per turn (``weighting=token``) |
| ``grpo`` | plain GRPO: one baseline per group for both roles (``algo=grpo``) |
| ``per_role`` | two models, each trained on its role (``policy=per_role``) |
| ``real_rollouts`` | tool calls answered by the real backend during training (``rollout=real``) |
| ``null_rehearser`` | every tool call answered with the same uninformative text (``rollout=null``): if it matches ``role_grpo``, the world model is not what helps |
| ``role_grpo_act_only`` | (not by default) role-wise GRPO whose REHEARSE segments get advantage 0 (``algo=role_grpo_act_only``): the policy gradient leaves the world model as the warm start made it |
| ``told: warm start``, ``told: <arm>`` | the world: suite ``lab-told``, the same test tasks with the rules' facts of each task's initial state in the prompt (its own warm start, then ``--told-arms``, default ``role_grpo`` and ``grpo``): told against hidden rules measures what a world model is worth |

The told rows (``--told-arms``; when the recipe's suite is the default hidden world, ``lab``) run after the
hidden-world stages of each seed: one more warm start, shared by them (the recipe with suite ``lab-told``, the
same SFT settings and seed; stages ``told/warm_start/...``), then each listed arm per seed (``told/<arm>/seed<s>``),
scored on the same test task ids on the told world's real backend, with fidelity like every row. Their
"vs role_grpo" and ``tasks +/-`` pair them with the hidden world's ``role_grpo`` (same seed, same task ids).

``--arms`` also takes the environment-cost arms (none by default): ``hybrid_p<p>`` answers each tool call from the
real backend with probability p in training (``rollout=hybrid``, p in 0, 0.05, 0.2, 1), ``hybrid_p<p>_wm1`` also
trains REHEARSE on those real outputs (``world_model_loss_weight=1``); `benchmarks.experiments.arms.env_cost_arms`,
the table `benchmarks.experiments.lab_env_cost` runs on its own.

Rehearsal fidelity is exact / JSON structure / token F1 of every rehearsed tool output against a shadow
real backend, with exact match apart on outputs that are errors and on the others. When asked
(``--ttr-n``, ``--ttr-sequential-n``, ``--base-rehearser-n``; none by default), every ``role_grpo`` policy is
also scored with test-time rehearsal, N attempts per user turn, ``parallel`` and ``sequential``, with the
trained policy as the rehearser and with the pre-RL (warm-start) model as the rehearser (the paper's
base-rehearser control). The model-free row is sb3-contrib's MaskablePPO on the recipe's world's discrete twin
(``EnvACE-LabHiddenDiscrete-v0`` for the hidden rules, ``EnvACE-LabDiscrete-v0`` for the stated;
`benchmarks/experiments/maskable_ppo.py`), trained on the real backend, scored on the same test tasks.

Printed per row: test success as mean +- the half-width of a 95% Student-t interval over seeds, the paired
difference to ``role_grpo`` on the same seeds (same interval; one seed gives no interval and none is printed),
the test tasks the row solved that ``role_grpo`` did not and the reverse (``tasks +/-``, summed over the
seeds: the paired view a handful of seeds can still read), the real tool calls made inside the training
loop and, counted apart, the calls the verifier replayed to score the rollouts (means per seed), and wall
seconds per seed (training + evaluation), and fidelity exact match on ordinary and on error outputs. The
warm start's row counts the calls of the reference solutions of the demonstrations it was given (each
executed on the real backend to build them); every arm starts from it. Writes ``results.json`` and
``ablations.png`` under ``--out`` after every seed (``"seeds_done"`` says how many are in; the table is
final when it equals ``"seeds"``). Every stage has its own folder and is skipped when run again (an
interrupted run resumes; GRPO from its newest checkpoint).

    .venv/bin/python -m benchmarks.experiments.lab_ablations --quick       # 2 seeds, 2 GRPO steps, 6 test tasks, told rows too
    .venv/bin/python -m benchmarks.experiments.lab_ablations               # 10 seeds, the recipe's GRPO budget, 600 test tasks

Nothing here is tuned toward a result: the world, the seeds (0..S-1) and the budgets are the recipe's (or
the options'), the same for every arm, and the script reports whatever the runs give.
"""  # noqa: E501 (a markdown table row in this docstring cannot be wrapped)

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
import typing
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.experiments.ablations_table import FIDELITY_METRICS, comparisons, table
from benchmarks.experiments.arms import anchor_arms, env_cost_arms, evaluate, row_fidelity, train_and_score
from benchmarks.experiments.paired import WORLD_INFIXES, task_rewards, world_kind
from benchmarks.experiments.workers import add_worker_options, check_worker_options
from benchmarks.provenance import provenance, stamp
from benchmarks.stats import mean_ci95
from wrappers.test_time_rehearsal import Memory

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "configs" / "recipes" / "lab.yaml"

DEFAULT_ARMS: dict[str, dict[str, Any]] = {
    "role_grpo": {},
    "role_grpo_token": {"weighting": "token"},
    "grpo": {"algo": "grpo"},
    "per_role": {"policy": "per_role"},
    "real_rollouts": {"rollout": "real"},
    "null_rehearser": {"rollout": "null"},
}
"""The arms run by default: the paper's ablations."""

ARMS: dict[str, dict[str, Any]] = {
    **DEFAULT_ARMS,
    "role_grpo_act_only": {"algo": "role_grpo_act_only"},
    **anchor_arms(),
    **env_cost_arms(),
}
"""Each arm's `agents.config.TrainConfig` fields over the recipe's GRPO stage (``role_grpo`` is the recipe): the
default arms, the act-only control, the world-model anchor arms (`benchmarks.experiments.arms.anchor_arms`:
rehearsed rollouts plus the world-model loss on real demonstrations, errors included), then the environment-cost
arms (`benchmarks.experiments.arms.env_cost_arms`)."""

DEFAULT_TOLD_ARMS = ("role_grpo", "grpo")
"""The arms run by default on the told world (``--told-arms``): EnvACE and plain GRPO."""
WORLDS = ("hidden", "told")
"""The worlds of the rows: the recipe's (hidden rules) and its told variant (``--told-arms``)."""
TOLD_PREFIX = "told/"
"""The told rows' stage folders and row names start with it (``told/role_grpo/seed0``, ``told: role_grpo``)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default=str(RECIPE), help="the envace pipeline YAML whose stages every arm uses")
    ap.add_argument("--out", default="runs/lab_ablations", help="folder of every stage, results.json and ablations.png")
    ap.add_argument("--seeds", type=int, default=10, help="GRPO seeds per arm (0..S-1)")
    ap.add_argument("--grpo-steps", type=int, default=None, help="GRPO steps per run (default: the recipe's)")
    ap.add_argument("--grpo-lr", type=float, default=None, help="GRPO learning rate (default: the recipe's)")
    ap.add_argument(
        "--arms",
        nargs="*",
        default=list(DEFAULT_ARMS),
        choices=list(ARMS),
        help="the arms to run (default: the paper's ablations; the hybrid_* arms are the environment-cost arms)",
    )
    ap.add_argument(
        "--told-arms",
        nargs="*",
        default=list(DEFAULT_TOLD_ARMS),
        choices=list(ARMS),
        help=(
            "the arms also run on the told world (suite lab-told, from its own warm start), each paired with the "
            "hidden world's role_grpo (default: role_grpo grpo; the option with no value: none). Only with a "
            "recipe on the default hidden world, suite lab"
        ),
    )
    ap.add_argument(
        "--ttr-n",
        type=int,
        nargs="*",
        default=[],
        help=(
            "test-time rehearsal attempts per turn (each >= 1), parallel, the trained policy rehearsing (none by "
            "default); N = 0 is each arm's own evaluation, always run"
        ),
    )
    ap.add_argument(
        "--ttr-sequential-n", type=int, nargs="*", default=None, help="the same, sequential attempts (default: --ttr-n)"
    )
    ap.add_argument(
        "--base-rehearser-n",
        type=int,
        nargs="*",
        default=None,
        help=(
            "the same, parallel, the pre-RL (warm-start) model rehearsing: the base-rehearser control (default: "
            "--ttr-n)"
        ),
    )
    ap.add_argument(
        "--ttr-memory",
        choices=list(typing.get_args(Memory)),
        default="trace",
        help=(
            "the rehearsal memory (wrappers.TestTimeRehearsal's memory): a trace of the attempts' calls and outputs, "
            "the trace without the attempts' replies (outcomes), or English critiques and a summary"
        ),
    )
    ap.add_argument(
        "--ttr-memory-tokens", type=int, default=128, help="bound on the rehearsal memory (the same for every N)"
    )
    ap.add_argument(
        "--ttr-critique-tokens",
        type=int,
        default=32,
        help="cap per critique, --ttr-memory summary (the same for every N)",
    )
    ap.add_argument(
        "--limit",
        type=int,
        default=100,
        help="test tasks per category (100: every test task of the hidden-rules world)",
    )
    ap.add_argument(
        "--fidelity-limit", type=int, default=25, help="test tasks per category of each fidelity evaluation (0: none)"
    )
    ap.add_argument("--sb3-timesteps", type=int, default=50_000, help="MaskablePPO env steps per seed (0: no SB3 row)")
    ap.add_argument(
        "--quick",
        action="store_true",
        help=(
            "2 seeds, 2 GRPO steps, 1 test task per category (fidelity too), test-time rehearsal N <= 2 parallel "
            "only, SB3 10,000 steps; the told rows with the same budgets"
        ),
    )
    ap.add_argument("--threads", type=int, default=2, help="torch threads per process")
    add_worker_options(
        ap,
        "train and score the seeds in parallel (worker k takes the seeds s with s %% W == k) after the shared "
        "warm starts (with told rows: the two worlds' warm starts side by side, a process each)",
    )
    # set by --workers for the process that makes one world's warm start beside the other's
    ap.add_argument("--warm-start-only", choices=WORLDS, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    check_worker_options(ap, args)
    if args.quick:
        args.seeds, args.grpo_steps, args.sb3_timesteps = 2, 2, min(args.sb3_timesteps, 10_000)
        args.limit, args.fidelity_limit = 1, min(args.fidelity_limit, 1)
        args.ttr_n, args.ttr_sequential_n = [n for n in args.ttr_n if n <= 2], []
    if args.ttr_sequential_n is None:
        args.ttr_sequential_n = list(args.ttr_n)
    if args.base_rehearser_n is None:
        args.base_rehearser_n = list(args.ttr_n)
    if args.quick:
        args.base_rehearser_n = [n for n in args.base_rehearser_n if n <= 2]
    for option, values in (
        ("--ttr-n", args.ttr_n),
        ("--ttr-sequential-n", args.ttr_sequential_n),
        ("--base-rehearser-n", args.base_rehearser_n),
    ):
        if len(set(values)) != len(values):
            ap.error(f"{option} lists an N twice: {values}")
    if args.limit < 1 or args.fidelity_limit < 0:
        ap.error("--limit must be >= 1 and --fidelity-limit >= 0 (0: no fidelity evaluations)")
    if (
        args.seeds < 1
        or (args.grpo_steps is not None and args.grpo_steps < 1)
        or (args.grpo_lr is not None and not args.grpo_lr > 0)
        or any(n < 1 for n in args.ttr_n + args.ttr_sequential_n + args.base_rehearser_n)
    ):
        ap.error("--seeds, --grpo-steps and every test-time rehearsal N must be >= 1, and --grpo-lr > 0")
    if "role_grpo" not in args.arms:
        ap.error("--arms must include role_grpo: every comparison and the rehearsal rows are made against it")
    if len(set(args.told_arms)) != len(args.told_arms):
        ap.error(f"--told-arms lists an arm twice: {args.told_arms}")
    return args


def _fidelity(row: dict[str, Any]) -> dict[str, float | None]:
    return {m: row.get(f"fidelity_{m}") for m in FIDELITY_METRICS}


def summarize(values: list[float], reference: list[float] | None = None) -> dict[str, Any]:
    """Mean and 95% half-width of `values` (one per seed), and of the paired differences to `reference`
    (the mean and half-width are None when nothing was measured; the half-width is None for one seed)."""
    if not values:
        return {"values": [], "mean": None, "ci95": None, "n": 0}
    mean, half = mean_ci95(values)
    out: dict[str, Any] = {"values": values, "mean": mean, "ci95": half, "n": len(values)}
    if reference is not None and len(reference) == len(values):
        diff_mean, diff_half = mean_ci95([v - r for v, r in zip(values, reference)])
        out.update(diff_mean=diff_mean, diff_ci95=diff_half)
    return out


def run(args: argparse.Namespace, log=print) -> dict[str, Any]:
    """Run (or resume) every stage and return the results (also written to ``<out>/results.json`` after
    every seed)."""
    import shlex

    import torch

    from agents.config import replace_fields
    from agents.models import default_store
    from agents.pipeline import StageRunner
    from benchmarks.experiments.paired import load_recipe
    from envace_gym.suites import make_suite

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    recipe = load_recipe(args.recipe, out, args.threads, args.limit)
    if args.grpo_lr is not None:
        recipe = dataclasses.replace(recipe, grpo=replace_fields(recipe.grpo, {"optim.lr": args.grpo_lr}))
    steps = args.grpo_steps or recipe.grpo.num_steps
    make_suite(recipe.suite)  # an unknown suite stops here, before any stage
    models = default_store()
    stages = StageRunner(out, log, stamp=stamp)
    t_start = time.perf_counter()

    told_name = told_variant(recipe.suite) if args.told_arms else None
    told_recipe = dataclasses.replace(recipe, suite=told_name) if told_name else None
    if args.told_arms and told_name is None:
        log(f"[ablations] no told rows: suite {recipe.suite!r} has no told variant (the default hidden world lab has)")
    told_warm: dict[str, Any] | None = None
    told_runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in args.told_arms} if told_recipe else {}
    if args.warm_start_only is not None:  # a process started below: one world's warm start, nothing else
        hidden = args.warm_start_only == "hidden"
        world, prefix = (recipe, "") if hidden else (told_recipe, TOLD_PREFIX)
        shared_warm_start(stages, world, models, prefix, args.fidelity_limit, log)
        return {}
    if told_recipe is not None and args.workers > 1 and args.worker is None:
        # both warm starts, one process each (the same stages as made here, which then skips them): on 2 cores
        # the told world's SFT need not wait for the hidden world's
        run_workers(
            args,
            out,
            log,
            jobs=[(f"the {w} world's warm start", ["--warm-start-only", w], f"warm_start_{w}.log") for w in WORLDS],
        )
    warm_start = shared_warm_start(stages, recipe, models, "", args.fidelity_limit, log)
    warm = warm_start["model"]

    def told_warm_start() -> dict[str, Any]:
        """The told world's shared warm start, checked to be scored on the hidden warm start's test task ids."""
        made = shared_warm_start(stages, told_recipe, models, TOLD_PREFIX, args.fidelity_limit, log)
        if set(made["eval"]["task_rewards"]) != set(warm_start["eval"]["task_rewards"]):
            raise RuntimeError(
                f"{told_name} was evaluated on other test tasks than {recipe.suite}; its rows are paired "
                f"with {recipe.suite}'s role_grpo task by task (compare the episodes.jsonl of "
                f"{out / 'warm_start/eval'} and {out / TOLD_PREFIX / 'warm_start/eval'})"
            )
        return made

    if told_recipe is not None and args.workers > 1:  # every worker starts from it: made once, before them
        told_warm = told_warm_start()
    if args.workers > 1 and args.worker is None:
        run_workers(args, out, log)  # every seed's stages; the loop below reads them back

    def evaluation(name: str, model: str, **changes: Any) -> dict[str, Any]:
        return evaluate(stages, recipe, models, name, model, **changes)

    settings = (
        [("trained", None, "parallel", n) for n in args.ttr_n]
        + [("trained", None, "sequential", n) for n in args.ttr_sequential_n]
        + [("base", warm, "parallel", n) for n in args.base_rehearser_n]
    )
    twin = sb3_twin(recipe.suite)
    run_sb3 = bool(args.sb3_timesteps) and twin is not None
    if args.sb3_timesteps and twin is None:
        log(f"[ablations] no MaskablePPO row: suite {recipe.suite!r} has no discrete twin (only the lab's have)")

    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in args.arms}
    rehearsal: dict[str, list[dict[str, Any]]] = {}
    sb3: list[dict[str, Any]] = []
    results: dict[str, Any] = {}
    for seed in range(args.seeds):
        if args.worker is not None and seed % args.workers != args.worker:
            continue
        for arm in args.arms:
            changes = {"seed": seed, "num_steps": steps, "run.save_every": steps, **ARMS[arm]}
            run_info = train_and_score(
                stages, recipe, models, f"{arm}/seed{seed}", warm, changes, fidelity_limit=args.fidelity_limit, log=log
            )
            runs[arm].append({"seed": seed, **run_info})
        for rehearser, rehearser_model, mode, n in settings:
            stage = f"role_grpo/seed{seed}/ttr_{rehearser}_{mode}_n{n}"
            row = evaluation(
                stage,
                runs["role_grpo"][-1]["model"],
                rehearsal_n=n,
                rehearsal_mode=mode,
                rehearser_model=rehearser_model,
                memory=args.ttr_memory,
                memory_tokens=args.ttr_memory_tokens,
                critique_tokens=args.ttr_critique_tokens,
            )
            row["task_rewards"] = task_rewards(out / stage)
            rehearsal.setdefault(f"N={n} {mode}, {rehearser} rehearser", []).append(
                {"seed": seed, "eval": row, "eval_s": stages.timings[stage]}
            )
        if run_sb3:
            from benchmarks.experiments.maskable_ppo import run_seed

            sb3_settings = {
                "timesteps": args.sb3_timesteps,
                "categories": recipe.categories,
                "limit": recipe.eval.limit,
            }
            sb3.append(
                stages.stage(
                    f"sb3_maskable_ppo/seed{seed}",
                    lambda _, seed=seed, sb3_settings=sb3_settings: {
                        "row": run_seed(
                            seed, args.sb3_timesteps, recipe.categories, limit=recipe.eval.limit, suite=recipe.suite
                        ),
                        "config": sb3_settings,
                    },
                    sb3_settings,
                )["row"]
            )
        if told_recipe is not None:
            # after this seed's hidden-world stages: the told world's warm start (once), then its arms
            if told_warm is None:
                told_warm = told_warm_start()
            for arm in told_runs:
                changes = {"seed": seed, "num_steps": steps, "run.save_every": steps, **ARMS[arm]}
                run_info = train_and_score(
                    stages,
                    told_recipe,
                    models,
                    f"{TOLD_PREFIX}{arm}/seed{seed}",
                    told_warm["model"],
                    changes,
                    fidelity_limit=args.fidelity_limit,
                    log=log,
                )
                told_runs[arm].append({"seed": seed, **run_info})
        if args.worker is not None:
            continue  # a worker's seeds are a subset: the process that started it writes the results
        told = None if told_warm is None else {"suite": told_name, "warm_start": told_warm, "runs": told_runs}
        results = _results(args, recipe, steps, warm_start, runs, rehearsal, sb3, told)
        results.update(
            seeds_done=seed + 1,
            wall_s=time.perf_counter() - t_start,
            kind=results_kind(args, recipe),
            command=("python -m benchmarks.experiments.lab_ablations " + shlex.join(getattr(args, "argv", []))).strip(),
            **provenance(stages),
            stage_seconds=dict(stages.timings),
            stage_minutes=sum(stages.timings.values()) / 60,
        )
        (out / "results.json").write_text(json.dumps(results, indent=1))
        plot(results, out / "ablations.png")
        log(f"[ablations] {seed + 1}/{args.seeds} seeds in {out / 'results.json'}")
    if args.worker is not None:
        return {}
    for line in (*table(results), "", *comparisons(results)):
        log(line)
    log(
        f"[ablations] plot: {out / 'ablations.png'}; results: {out / 'results.json'}; "
        f"stage time {results['stage_minutes']:.1f} min"
    )
    return results


def results_kind(args: argparse.Namespace, recipe: Any) -> str:
    """``lab_ablations`` for a run at the recipe's GRPO budget (the run of record, one section of the results
    page); ``lab_ablations_budget`` for one at another (``--grpo-lr``, or ``--grpo-steps`` other than the
    recipe's), its own section, so that it never replaces the run of record; each with the recipe's world infix
    (`benchmarks.experiments.paired.world_kind`: ``lab_ablations_blind``), and ``_<suite>`` for a suite outside
    the lab (``lab_ablations_bfcl``), which `benchmarks.results.store` refuses (no section renders it)."""
    other = args.grpo_lr is not None or args.grpo_steps not in (None, recipe.grpo.num_steps)
    base = "lab_ablations_budget" if other else "lab_ablations"
    suite = str(recipe.suite)
    return world_kind(base, suite) if suite in WORLD_INFIXES else f"{base}_{suite.replace('-', '_')}"


def run_workers(
    args: argparse.Namespace, out: Path, log: Any = print, jobs: list[tuple[str, list[str], str]] | None = None
) -> None:
    """`benchmarks.experiments.workers.run_workers` of this script."""
    from benchmarks.experiments.workers import run_workers as run

    run(args, out, log, jobs, module="benchmarks.experiments.lab_ablations")


def shared_warm_start(
    stages: Any, recipe: Any, models: Any, prefix: str, fidelity_limit: int, log: Any = print
) -> dict[str, Any]:
    """The warm start every arm of a world starts from: stages ``<prefix>warm_start/sft`` (the recipe's SFT stage),
    ``<prefix>warm_start/eval`` and, when `fidelity_limit` > 0, ``<prefix>warm_start/fidelity``; each skipped
    when done.

    Returns:
        ``model`` (the SFT model folder), ``eval`` (the evaluation row with ``task_rewards``), ``fidelity`` (``{}``
        without one), ``real_tool_calls`` (the calls of the reference solutions of its demonstrations, each
        executed on the real backend to build them) and ``wall_s`` (SFT + evaluation seconds).
    """
    from agents.evaluation.failures import where_failed
    from agents.pipeline import latest_model, sft_stage
    from envace_gym.suites import make_suite

    out = stages.run
    info = stages.stage(f"{prefix}warm_start/sft", lambda folder: sft_stage(recipe, folder, models, log))
    model = latest_model(out / f"{prefix}warm_start" / "sft")
    row = evaluate(stages, recipe, models, f"{prefix}warm_start/eval", model)
    row["task_rewards"] = task_rewards(out / f"{prefix}warm_start" / "eval")
    row["where_failed"] = where_failed(out / f"{prefix}warm_start" / "eval")
    fidelity = (
        evaluate(stages, recipe, models, f"{prefix}warm_start/fidelity", model, fidelity=True, limit=fidelity_limit)
        if fidelity_limit
        else {}
    )
    suite, used = make_suite(recipe.suite), set(info["task_ids"])
    calls = sum(
        len(turn) for t in suite.tasks(recipe.categories, "train") if t.id in used for turn in suite.ground_truth(t)
    )
    seconds = stages.timings[f"{prefix}warm_start/sft"] + stages.timings[f"{prefix}warm_start/eval"]
    return {"model": model, "eval": row, "fidelity": fidelity, "real_tool_calls": calls, "wall_s": seconds}


def told_variant(suite: str) -> str | None:
    """The registered told variant of the recipe's `suite` (``lab-told`` for the default hidden world, ``lab``:
    the same tasks with the rules' facts of each task's initial state in the prompt), or None: no told rows."""
    from benchmarks.lab import LabConfig
    from envace_gym.suites import make_suite, registered_suites

    if getattr(make_suite(suite), "config", None) != LabConfig() or "lab-told" not in registered_suites():
        return None
    told = getattr(make_suite("lab-told"), "config", None)
    return "lab-told" if told == dataclasses.replace(LabConfig(), told=True) else None


def sb3_twin(suite: str) -> str | None:
    """The env id of the discrete twin the MaskablePPO row trains on for the recipe's `suite` (the hidden or
    the stated lab world's), or None: no such row."""
    from benchmarks.experiments.maskable_ppo import discrete_twin

    return discrete_twin(suite)


def paired_tasks(rows: list[dict[str, float]], references: list[dict[str, float]]) -> dict[str, int]:
    """Tasks where a row scored above (``gained``) or below (``lost``) its reference, summed over the seeds
    (`rows[i]` is paired with `references[i]`: the same seed's per-task rewards,
    `benchmarks.experiments.paired.task_rewards`)."""
    gained = lost = tasks = 0
    for row, ref in zip(rows, references):
        gained += sum(row[t] > ref[t] for t in ref)
        lost += sum(row[t] < ref[t] for t in ref)
        tasks += len(ref)
    return {"gained": gained, "lost": lost, "tasks": tasks}


def _warm_row(name: str, warm: dict[str, Any], reference: list[float], ref_tasks: list[dict[str, float]]):
    """A warm start's row (`shared_warm_start`'s record): one model, so its difference to each seed's
    ``role_grpo`` is paired with that seed."""
    success = summarize([warm["eval"]["accuracy"]])
    success.update(
        {
            k: v
            for k, v in summarize([warm["eval"]["accuracy"]] * len(reference), reference).items()
            if k.startswith("diff_")
        }
    )
    return {
        "row": name,
        "success": success,
        "paired_tasks": paired_tasks([warm["eval"]["task_rewards"]] * len(ref_tasks), ref_tasks),
        "real_tool_calls": warm["real_tool_calls"],
        "verifier_replay_calls": 0,
        "wall_s": warm["wall_s"],
        "fidelity": row_fidelity([warm["fidelity"]]),
        "where_failed": _mean_fields([warm["eval"].get("where_failed")]),
    }


def _arm_row(
    name: str, rs: list[dict[str, Any]], reference: list[float] | None, ref_tasks: list[dict[str, float]]
) -> dict[str, Any]:
    """An arm's row over its seeds (`benchmarks.experiments.arms.train_and_score` records), paired seed by seed
    with `reference` and `ref_tasks` (``role_grpo``'s; None: the row is ``role_grpo`` itself)."""
    return {
        "row": name,
        "success": summarize([r["eval"]["accuracy"] for r in rs], reference),
        **(
            {}
            if reference is None
            else {"paired_tasks": paired_tasks([r["eval"]["task_rewards"] for r in rs], ref_tasks)}
        ),
        # the world-model demonstrations' executions are real calls too (0 in arms without them)
        "real_tool_calls": float(
            np.mean([r["train"]["real_tool_calls"] + r["train"].get("demo_tool_calls", 0) for r in rs])
        ),
        "verifier_replay_calls": float(np.mean([r["train"]["verifier_replay_calls"] for r in rs])),
        "groups_with_signal": float(np.mean([sum(r["train"]["groups_with_reward_variance"]) for r in rs])),
        "wall_s": float(np.mean([r["train_s"] + r["eval_s"] for r in rs])),
        "fidelity": row_fidelity([r["fidelity"] for r in rs]),
        "where_failed": _mean_fields([r["eval"].get("where_failed") for r in rs]),
        "train_reward": _mean_fields([r.get("train_reward") for r in rs]),
    }


def _mean_fields(records: list[dict[str, float] | None]) -> dict[str, float] | None:
    """Each field's mean over `records` (one per seed); None when there are none or one is None."""
    if not records or any(r is None for r in records):
        return None
    return {k: float(np.mean([r[k] for r in records])) for k in records[0]}


def told_row_name(name: str) -> str:
    """A told row's name: ``told: warm start``, ``told: role_grpo``."""
    return f"{TOLD_PREFIX[:-1]}: {name}"


def _results(args, recipe, steps, warm, runs, rehearsal, sb3, told=None) -> dict[str, Any]:
    reference = [r["eval"]["accuracy"] for r in runs["role_grpo"]]
    ref_tasks = [r["eval"]["task_rewards"] for r in runs["role_grpo"]]
    rows: list[dict[str, Any]] = [_warm_row("warm start (SFT, pre-RL)", warm, reference, ref_tasks)]
    for arm, rs in runs.items():
        rows.append(_arm_row(arm, rs, None if arm == "role_grpo" else reference, ref_tasks))
    for key, rs in rehearsal.items():
        rows.append(
            {
                "row": f"role_grpo + TTR {key}",
                "success": summarize([r["eval"]["accuracy"] for r in rs], reference),
                "paired_tasks": paired_tasks([r["eval"]["task_rewards"] for r in rs], ref_tasks),
                "wall_s": float(np.mean([r["eval_s"] for r in rs])),
            }
        )
    if sb3:
        rows.append(
            {
                "row": f"MaskablePPO ({args.sb3_timesteps} steps, real backend)",
                "success": summarize([r["test_success"] for r in sb3]),
                "real_tool_calls": float(np.mean([r["train_real_calls"] for r in sb3])),
                "verifier_replay_calls": 0,
                "wall_s": float(np.mean([r["train_s"] for r in sb3])),
            }
        )
    if told is not None:  # paired with the hidden world's role_grpo: the same seeds and test task ids
        rows.append(_warm_row(told_row_name("warm start"), told["warm_start"], reference, ref_tasks))
        rows += [_arm_row(told_row_name(arm), rs, reference, ref_tasks) for arm, rs in told["runs"].items()]
    fidelity_after = [r["fidelity"] for r in runs["role_grpo"] if r["fidelity"]]
    fidelity = {
        "before": _fidelity(warm["fidelity"]),
        "after": {
            m: summarize([f[f"fidelity_{m}"] for f in fidelity_after if f.get(f"fidelity_{m}") is not None])
            for m in FIDELITY_METRICS
        },
    }
    return {
        "recipe": str(args.recipe),
        "model": recipe.model,
        "seeds": args.seeds,
        "grpo_steps": steps,
        "grpo": {
            **{k: getattr(recipe.grpo, k) for k in ("batch_tasks", "group_size")},
            "lr": recipe.grpo.optim.lr,
            **{
                k: getattr(recipe.grpo, k)
                for k in ("max_new_tokens", "rehearse_max_new_tokens", "max_steps_per_turn", "temperature")
            },
        },
        "test_tasks": warm["eval"]["n_tasks"],
        "fidelity_tasks": warm["fidelity"].get("n_tasks"),
        "told_suite": None if told is None else told["suite"],
        "told_arms": [] if told is None else list(told["runs"]),
        "rows": rows,
        "fidelity": fidelity,
    }


def plot(results: dict[str, Any], path: Path) -> Path:
    """Test success per row with 95% intervals, and fidelity before / after GRPO."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results["rows"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 0.35 * len(rows) + 2.5), gridspec_kw={"width_ratios": [3, 1]})
    ys = np.arange(len(rows))[::-1]
    nan = float("nan")  # no interval (one seed): no error bar, rather than a zero-width one
    ax.barh(
        ys,
        [r["success"]["mean"] for r in rows],
        capsize=3,
        xerr=[nan if r["success"]["ci95"] is None else r["success"]["ci95"] for r in rows],
    )
    ax.set_yticks(ys, [r["row"] for r in rows], fontsize=8)
    ax.set_xlim(0, 1)
    ax.set_xlabel(
        f"test success, real backend ({results['test_tasks']} tasks; mean, 95% CI over "
        f"{results.get('seeds_done', results['seeds'])} seeds)"
    )
    before, after = results["fidelity"]["before"], results["fidelity"]["after"]
    xs = np.arange(len(FIDELITY_METRICS))
    bx.bar(xs - 0.2, [before[m] or 0 for m in FIDELITY_METRICS], 0.4, label="before GRPO")
    bx.bar(
        xs + 0.2,
        [after[m]["mean"] if after[m]["n"] else 0 for m in FIDELITY_METRICS],
        0.4,
        yerr=[nan if not after[m]["n"] or after[m]["ci95"] is None else after[m]["ci95"] for m in FIDELITY_METRICS],
        capsize=3,
        label="after GRPO",
    )
    bx.set_xticks(xs, ["exact", "structure", "token F1"])
    bx.set_ylim(0, 1)
    bx.set_title("rehearsal fidelity", fontsize=9)
    bx.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return run(args)


if __name__ == "__main__":
    main()
