"""What role-wise GRPO buys on the hidden-rules lab as its budget (steps and learning rate) grows: success on the
same tasks every E steps, per seed, paired with the warm start it started from.

    python -m benchmarks.experiments.lab_grpo_budget                       # 3 seeds, 200 steps, evaluated every 25
    python -m benchmarks.experiments.lab_grpo_budget --warm runs/lab_ablations/warm_start/sft   # reuse a warm start
    python -m benchmarks.experiments.lab_grpo_budget --arms role_grpo null_rehearser             # with the control
    python -m benchmarks.experiments.lab_grpo_budget --split valid --lr 1e-4 3e-4 1e-3   # select lr and steps

Every arm is the recipe's GRPO stage (`configs/recipes/lab.yaml`) with the same warm start, seeds 0..S-1 and
batch, at the recipe's learning rate or at each of ``--lr`` (a row per arm and lr), run for ``--steps`` steps
with a checkpoint every ``--eval-every``; every checkpoint is evaluated greedily on the real backend on the same
tasks as the warm start. Per checkpoint the table gives the mean success, the paired difference to the warm
start (95% t-interval over seeds), the tasks gained and lost summed over seeds, and in how many seeds the gain
is resolved on that seed's own tasks (exact McNemar p < 0.05 with more tasks gained than lost): the question
``make demo`` asks of its one run. Every checkpoint is reported.

``--split valid`` evaluates on the lab's validation split instead (as large as the test split, disjoint from it
and from the train tasks), the split for hyperparameter selection: under the table it applies a rule fixed
before any run (`benchmarks.experiments.result_tables.budget_choice`: role_grpo's largest gain whose interval
lies above 0, or nothing), so the test split only reports the choice. With world-model anchor arms
(``role_grpo_wm_demos*``) a validation run chooses the anchor's weight instead (kind ``lab_anchor_valid``,
`benchmarks.experiments.result_tables.anchor_choice`). ``--workers`` trains the runs in parallel
processes. Stages resume (`agents.pipeline`); a rerun that adds an arm or a learning rate trains only the new
runs.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from benchmarks.experiments.arms import anchor_arms
from benchmarks.experiments.paired import WORLD_INFIXES, paired_comparison, start_recipe_run, task_rewards, world_kind
from benchmarks.experiments.result_tables import grpo_budget_table as table
from benchmarks.experiments.result_tables import split_name
from benchmarks.experiments.workers import add_worker_options, check_worker_options
from benchmarks.provenance import provenance

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "configs" / "recipes" / "lab.yaml"

ARMS: dict[str, dict[str, Any]] = {
    "role_grpo": {},
    "null_rehearser": {"rollout": "null"},
    "real_rollouts": {"rollout": "real"},
    "grpo": {"algo": "grpo"},
    "role_grpo_kl": {"beta": 0.04},
    **anchor_arms(),
}
"""Each arm's `agents.config.TrainConfig` fields over the recipe's GRPO stage (as in ``lab_ablations``).
``role_grpo_kl`` adds a KL penalty to the warm start (k3 estimator, coefficient 0.04: TRL's former default
for GRPO, not chosen on this world), the usual guard against a run drifting away from its start. The world-model
anchor arms (`benchmarks.experiments.arms.anchor_arms`) add the world-model loss on real demonstrations at each
weight of `benchmarks.experiments.arms.ANCHOR_WEIGHTS`; on the validation split they make the run a choice of that
weight (`results_kind`)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--recipe", default=str(RECIPE), help="the envace pipeline YAML whose stages every arm uses")
    ap.add_argument(
        "--out",
        default=None,
        help="folder of every stage, results.json and the plot (default: runs/<results kind>: runs/lab_grpo_budget, "
        "runs/lab_grpo_budget_real when every arm rolls out on the real backend, with --split valid "
        "runs/lab_grpo_budget_valid, or runs/lab_anchor_valid with an anchor arm; on another lab "
        "world with its infix, runs/lab_grpo_budget_blind)",
    )
    ap.add_argument(
        "--warm",
        default=None,
        help="an SFT run folder to start from (its newest checkpoint); default: train the recipe's warm start in OUT",
    )
    ap.add_argument("--seeds", type=int, default=3, help="GRPO seeds per arm (0..S-1)")
    ap.add_argument("--steps", type=int, default=200, help="GRPO steps per run")
    ap.add_argument("--eval-every", type=int, default=25, help="evaluate a checkpoint every this many steps")
    ap.add_argument("--arms", nargs="*", default=["role_grpo"], choices=list(ARMS))
    ap.add_argument("--limit", type=int, default=100, help="tasks per family (6 families) of the evaluated split")
    ap.add_argument(
        "--split",
        default="test",
        choices=("test", "valid"),
        help="the split every checkpoint is evaluated on: valid (the lab's validation split) to choose a budget, "
        "test to report one",
    )
    ap.add_argument(
        "--lr",
        type=float,
        nargs="*",
        default=None,
        help="GRPO learning rates, a row per arm and lr named '<arm> lr=<lr>', stages in <arm>/lr<lr>/seed<s> "
        "(not given: the recipe's lr, rows named '<arm>', stages in <arm>/seed<s>)",
    )
    ap.add_argument("--threads", type=int, default=2)
    add_worker_options(
        ap,
        "train and evaluate the runs not finished yet in parallel (dealt in turn, arm by arm, so each worker gets "
        "its share of every arm) after the warm start's evaluation",
    )
    # set by --workers: the indices (in `_runs` order) of the runs this worker trains and evaluates
    ap.add_argument("--worker-runs", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    check_worker_options(ap, args)
    if args.lr is not None and not args.lr:
        ap.error("--lr needs at least one learning rate (leave it out for the recipe's)")
    if args.lr and (any(not lr > 0 for lr in args.lr) or len({f"{lr:g}" for lr in args.lr}) != len(args.lr)):
        ap.error(f"--lr takes learning rates > 0 that differ in their folder names (<arm>/lr<lr:g>), got {args.lr}")
    if args.split == "valid" and ("role_grpo" not in args.arms or args.seeds < 2):
        ap.error(
            "--split valid chooses with a rule measured against role_grpo (its budget over 95% intervals, or the "
            "anchor weight against it): include role_grpo in --arms and give --seeds 2 or more"
        )
    if args.out is None:
        from agents.config import load_dataclass
        from agents.pipeline import PipelineConfig

        try:
            args.out = f"runs/{results_kind(args, load_dataclass(PipelineConfig, args.recipe).suite)}"
        except (OSError, ValueError) as e:  # no such recipe, or a suite outside the lab
            ap.error(str(e))
    if args.seeds < 1 or args.steps < 1 or args.eval_every < 1:
        ap.error("--seeds, --steps and --eval-every must be >= 1")
    if args.steps % args.eval_every:
        ap.error(f"--steps ({args.steps}) must be a multiple of --eval-every ({args.eval_every})")
    if not args.arms:
        ap.error("--arms needs at least one arm")
    args.argv = list(argv) if argv is not None else []
    return args


def compare(rows: list[dict[str, float]], references: list[dict[str, float]]) -> dict[str, Any]:
    """`benchmarks.experiments.paired.paired_comparison` of the checkpoints' per-task rewards with the warm start's,
    plus ``resolved_seeds``: the seeds whose own gain is resolved (more gained than lost, exact McNemar p < 0.05)."""
    out = paired_comparison(rows, references)
    out["resolved_seeds"] = out["resolved_up"]
    return out


def run(args: argparse.Namespace, log=print) -> dict[str, Any]:
    """Run (or resume) every stage; return the results (also written to ``<out>/results.json`` after each seed)."""
    import shlex

    from agents.config import TrainConfig, replace_fields
    from agents.pipeline import grpo_stage, stage_ignores, stage_settings
    from agents.training.checkpoint import checkpoint_dir
    from benchmarks.experiments.paired import load_recipe
    from envace_gym.suites import make_suite

    out = Path(args.out)
    t_start = time.perf_counter()
    planned = load_recipe(args.recipe, out, args.threads, args.limit)
    world_kind("lab_grpo_budget", planned.suite)  # a suite outside the lab stops here, named, before the split check
    make_suite(planned.suite).tasks(planned.categories, args.split)  # a world without the split stops here, untrained
    recipe, models, stages, warm = start_recipe_run(args, log, suites=WORLD_INFIXES)
    explicit = args.lr is not None
    lrs = args.lr or [recipe.grpo.optim.lr]

    def evaluation(name: str, model: str) -> dict[str, float]:
        stages.evaluate(name, replace_fields(recipe.eval_config(out / name, model), {"split": args.split}), models)
        return task_rewards(out / name)

    warm_rewards = evaluation("warm_start/eval", warm)
    rows = [(arm, lr) for arm in args.arms for lr in lrs]
    checkpoints = list(range(args.eval_every, args.steps + 1, args.eval_every))
    if args.workers > 1 and args.worker is None:
        from benchmarks.experiments.workers import run_workers

        # the runs with a checkpoint not yet evaluated (a rerun that adds an arm or an lr shares out only the new
        # ones), dealt in turn arm by arm, so that a slower arm's runs are split between the workers
        runs = _runs(args.seeds, rows)
        pending = [
            i
            for i, (seed, arm, lr) in enumerate(runs)
            if any(
                stages.finished(f"{run_name(arm, lr, seed, explicit)}/eval_step{step}") is None for step in checkpoints
            )
        ]
        pending.sort(key=lambda i: (args.arms.index(runs[i][1]), lrs.index(runs[i][2]), runs[i][0]))
        jobs = []
        for k in range(args.workers):
            mine = pending[k :: args.workers]
            if not mine:
                continue
            described = [f"{row_name(a, lr, explicit)} seed {s}" for s, a, lr in (runs[i] for i in mine)]
            jobs.append(
                (
                    f"worker {k}: " + ", ".join(described),
                    ["--worker", str(k), "--worker-runs", ",".join(map(str, mine))],
                    f"worker{k}.log",
                )
            )
        if jobs:
            run_workers(args, out, log, jobs, module="benchmarks.experiments.lab_grpo_budget")  # read back below
    mine = {int(i) for i in args.worker_runs.split(",") if i}
    per_seed: dict[str, list[dict[str, Any]]] = {row_name(arm, lr, explicit): [] for arm, lr in rows}
    results: dict[str, Any] = {}
    for seed in range(args.seeds):
        for k, (arm, lr) in enumerate(rows):
            if args.worker is not None and seed * len(rows) + k not in mine:
                continue
            name = run_name(arm, lr, seed, explicit)
            config = replace_fields(
                recipe.grpo_config(out / name / "grpo", warm),
                {
                    "seed": seed,
                    "num_steps": args.steps,
                    "optim.lr": lr,
                    "run.save_every": args.eval_every,
                    "run.keep_checkpoints": len(checkpoints),
                    **ARMS[arm],
                },
            )
            info = stages.stage(
                f"{name}/grpo",
                lambda _, config=config: grpo_stage(config, models, log),
                stage_settings(config),
                ignore=stage_ignores(TrainConfig),
            )
            missing = [s for s in checkpoints if not (checkpoint_dir(out / name / "grpo", s) / "model").is_dir()]
            if missing:  # a finished run saved at other steps (run.save_every is not part of what a stage compares)
                raise ValueError(
                    f"{out / name / 'grpo'} has no checkpoint at steps {missing}: it ran with another --eval-every; "
                    "give another --out or the --eval-every it ran with"
                )
            rewards = {
                step: evaluation(f"{name}/eval_step{step}", str(checkpoint_dir(out / name / "grpo", step) / "model"))
                for step in checkpoints
            }
            per_seed[row_name(arm, lr, explicit)].append(
                {
                    "seed": seed,
                    "arm": arm,
                    "lr": lr,
                    "rewards": rewards,
                    "train_s": info["seconds"],
                    # the world-model demonstrations' calls are real calls too (0 in arms without them)
                    "real_tool_calls": info["real_tool_calls"] + info.get("demo_tool_calls", 0),
                    "verifier_replay_calls": info["verifier_replay_calls"],
                }
            )
        if args.worker is not None:
            continue  # the process that started the workers writes the results
        results = summarize(args, recipe, warm, warm_rewards, checkpoints, per_seed, lrs)
        results.update(
            seeds_done=seed + 1,
            wall_s=time.perf_counter() - t_start,
            command=("python -m benchmarks.experiments.lab_grpo_budget " + shlex.join(args.argv)).strip(),
            **provenance(stages),
            stage_seconds=dict(stages.timings),
        )
        (out / "results.json").write_text(json.dumps(results, indent=1))
        plot(results, out / "grpo_budget.png")
        log(f"[grpo budget] {seed + 1}/{args.seeds} seeds in {out / 'results.json'}")
    if args.worker is not None:
        return {}
    for line in table(results):
        log(line)
    return results


def _runs(seeds: int, rows: list[tuple[str, float]]) -> list[tuple[int, str, float]]:
    """Every run as (seed, arm, lr), seed-major: the order workers are dealt them in."""
    return [(seed, arm, lr) for seed in range(seeds) for arm, lr in rows]


def run_name(arm: str, lr: float, seed: int, explicit_lr: bool) -> str:
    """A run's stage folder under ``--out``: ``<arm>/lr<lr>/seed<s>`` for a learning rate given with ``--lr``,
    ``<arm>/seed<s>`` for the recipe's."""
    return f"{arm}/lr{lr:g}/seed{seed}" if explicit_lr else f"{arm}/seed{seed}"


def results_kind(args: argparse.Namespace, suite: str = "lab") -> str:
    """``lab_grpo_budget`` on the test split (``lab_grpo_budget_real`` when every arm's rollouts are the real
    backend's: the budget of the learning regression test, not of the method); on the validation split
    ``lab_anchor_valid`` when an arm is a world-model anchor arm (the run chooses the anchor's weight,
    `benchmarks.experiments.result_tables.anchor_choice`), else ``lab_grpo_budget_valid`` (it chooses role_grpo's
    budget); each with `suite`'s world infix (`benchmarks.experiments.paired.world_kind`: ``lab_grpo_budget_blind``).
    Each kind is its own section of the results page, so no run replaces another.

    Raises:
        ValueError: a suite that is not one of the lab's worlds.
    """
    if args.split != "valid":
        real = all(ARMS[arm].get("rollout") == "real" for arm in args.arms)
        return world_kind("lab_grpo_budget_real" if real else "lab_grpo_budget", suite)
    anchors = set(anchor_arms())
    base = "lab_anchor_valid" if any(arm in anchors for arm in args.arms) else "lab_grpo_budget_valid"
    return world_kind(base, suite)


def row_name(arm: str, lr: float, explicit_lr: bool) -> str:
    """A row's name: the arm, with its learning rate when it was given with ``--lr`` (``role_grpo lr=0.0003``)."""
    return f"{arm} lr={lr:g}" if explicit_lr else arm


def summarize(args, recipe, warm, warm_rewards, checkpoints, per_seed, lrs) -> dict[str, Any]:
    """The results.json body: per row (arm, or arm and lr) and checkpoint, `compare` against the warm start."""
    arms = {}
    for name, seeds in per_seed.items():
        arms[name] = {
            "arm": seeds[0]["arm"] if seeds else name.split(" lr=")[0],
            "seeds": [s["seed"] for s in seeds],
            "lr": seeds[0]["lr"] if seeds else None,
            "world_model_loss_weight": ARMS[seeds[0]["arm"] if seeds else name.split(" lr=")[0]].get(
                "world_model_loss_weight", 0.0
            ),
            "train_s": [s["train_s"] for s in seeds],
            "real_tool_calls": [s["real_tool_calls"] for s in seeds],
            "verifier_replay_calls": [s["verifier_replay_calls"] for s in seeds],
            "checkpoints": {
                str(step): compare([s["rewards"][step] for s in seeds], [warm_rewards] * len(seeds))
                for step in checkpoints
            },
        }
    grpo = recipe.grpo
    return {
        "kind": results_kind(args, recipe.suite),
        "recipe": str(args.recipe),
        "model": recipe.model,
        "warm_start": warm,
        "warm_success": sum(warm_rewards.values()) / len(warm_rewards),
        "test_tasks": len(warm_rewards),
        "split": args.split,
        "seeds": args.seeds,
        "steps": args.steps,
        "eval_every": args.eval_every,
        "grpo": {
            "batch_tasks": grpo.batch_tasks,
            "group_size": grpo.group_size,
            "lr": lrs[0] if len(lrs) == 1 else None,
            "lrs": lrs,
        },
        "arms": arms,
    }


def plot(results: dict[str, Any], path: Path) -> Path:
    """Success against GRPO steps: each seed thin, the mean thick, the warm start dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for i, (arm, row) in enumerate(results["arms"].items()):
        steps = [0] + [int(s) for s in row["checkpoints"]]
        color = f"C{i}"
        for k in range(len(row["seeds"])):
            values = [results["warm_success"]] + [c["success"][k] for c in row["checkpoints"].values()]
            ax.plot(steps, values, color=color, alpha=0.3, linewidth=1)
        means = [results["warm_success"]] + [c["mean"] for c in row["checkpoints"].values()]
        ax.plot(steps, means, color=color, linewidth=2.5, label=f"{arm} (mean of {len(row['seeds'])} seeds)")
    ax.axhline(results["warm_success"], color="gray", linestyle="--", label="warm start")
    ax.set_xlabel("GRPO steps")
    split = split_name(results.get("split", "test"))
    ax.set_ylabel(f"{split} success ({results['test_tasks']} tasks, real backend)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return run(parse_args(argv))


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
