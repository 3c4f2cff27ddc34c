"""The environment-cost curve on the lab: what each real tool call in training buys, with and without training the
world model on the real outputs.

    python -m benchmarks.experiments.lab_env_cost            # 5 seeds x 7 arms, the recipe's GRPO budget, 600 test tasks
    python -m benchmarks.experiments.lab_env_cost --quick    # 2 seeds, 2 GRPO steps, 1 test task per family

EnvACE's premise is environment cost: rehearsed rollouts need no real tool call in training (the verifier still
replays the calls to score them, counted apart), real rollouts need one per call. Hybrid rollouts
(``rollout: hybrid``, `envace_gym.responders.Hybrid`) answer each call from the real backend with probability p and
by the policy's REHEARSE role otherwise, so a run buys a chosen share of real outputs; the world-model loss
(``world_model_loss_weight`` λ, `agents.grpo.world_model_loss`) also trains REHEARSE on those outputs by teacher
forcing, beside the GRPO objective.

Protocol (fixed before any result was seen; every setting is reported):

1. **One shared warm start** (``--warm``, default the lab ablations' SFT warm start ``runs/lab_ablations/warm_start/sft``,
   the recipe's SFT stage on real executions; ``--warm none`` trains that stage in ``--out``). It is scored like
   every arm (the first row).
2. **Arms** (`benchmarks.experiments.arms.env_cost_arms`): p in {0, 0.05, 0.2, 1} without the world-model loss, and
   p in {0.05, 0.2, 1} with it at λ = 1 (p = 0 makes no real output, so with the loss it is the same run as without).
   λ = 1 was chosen before any run and is not tuned: the loss is a mean in nats per target token, as the warm
   start's SFT loss on its REHEARSE targets, so each real output is trained as the warm start trained its rehearsal
   targets, beside a GRPO term whose advantages are of order one (rewards in [0, 1]).
3. **Each arm, each seed** 0..S-1: role-wise GRPO from the warm start with the recipe's settings and budget (20 steps
   of B=16 x K=8 in ``configs/recipes/lab.yaml``), the arm's two fields changed; then greedy test success on the real
   backend (``--limit`` tasks per family; 100 is every test task of the hidden-rules world) and rehearsal fidelity
   (exact match on ordinary and on error outputs) on the first ``--fidelity-limit`` test tasks per family.

The table (and ``results.json``): per arm, success (mean +- the half-width of a 95% t-interval over seeds), the
paired difference to p = 0 on the same seeds (same interval) with the test tasks gained and lost summed over seeds,
the real calls in training per run (every execution on the real backend inside the rollouts, the catch-up of
rehearsed calls before a real one included: the environment cost), the real answers per run (the calls whose shown
output came from the backend), fidelity, and seconds per run (training + evaluation). The plot
(``env_cost.png``) shows success and fidelity against real calls, one line per loss setting. ``results.json`` is
rewritten after every run; every stage has its own folder and is skipped when done (an interrupted run resumes).
``python -m benchmarks.results <out>`` puts the table on the results page.
"""  # noqa: E501 (a command line in this docstring cannot be wrapped)

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.experiments.arms import (
    ENV_COST_PROBS,
    WORLD_MODEL_WEIGHT,
    arm_name,
    env_cost_arms,
    evaluate,
    row_fidelity,
    train_and_score,
)
from benchmarks.experiments.paired import WORLD_INFIXES, paired_comparison, start_recipe_run, task_rewards, world_kind
from benchmarks.experiments.result_tables import env_cost_table as table
from benchmarks.provenance import provenance

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "configs" / "recipes" / "lab.yaml"
WARM = "runs/lab_ablations/warm_start/sft"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument(
        "--recipe", default=str(RECIPE), help="the envace pipeline YAML (model, suite, GRPO and eval settings)"
    )
    ap.add_argument("--out", default="runs/lab_env_cost", help="folder of every stage, results.json and the plot")
    ap.add_argument(
        "--warm",
        default=WARM,
        help="the SFT run folder every arm starts from ('none': train the recipe's warm start in OUT)",
    )
    ap.add_argument("--seeds", type=int, default=5, help="GRPO seeds per arm (0..S-1)")
    ap.add_argument("--grpo-steps", type=int, default=None, help="GRPO steps per run (default: the recipe's)")
    ap.add_argument(
        "--probs",
        type=float,
        nargs="+",
        default=list(ENV_COST_PROBS),
        help="the shares p of real calls, 0 (the reference every row is paired with) among them",
    )
    ap.add_argument(
        "--world-model-weight",
        type=float,
        default=WORLD_MODEL_WEIGHT,
        help="lambda of the world-model loss arms (0: no such arm; see the module docstring for the default)",
    )
    ap.add_argument("--limit", type=int, default=100, help="test tasks per family (100: every test task)")
    ap.add_argument(
        "--fidelity-limit", type=int, default=25, help="test tasks per family of each fidelity evaluation (0: none)"
    )
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--quick", action="store_true", help="2 seeds, 2 GRPO steps, 1 test task per family (fidelity too)")
    args = ap.parse_args(argv)
    if args.quick:
        args.seeds, args.grpo_steps, args.limit, args.fidelity_limit = 2, 2, 1, min(args.fidelity_limit, 1)
    if args.seeds < 1 or (args.grpo_steps is not None and args.grpo_steps < 1) or args.limit < 1:
        ap.error("--seeds, --grpo-steps and --limit must be >= 1")
    if args.fidelity_limit < 0 or args.threads < 1:
        ap.error("--fidelity-limit must be >= 0 and --threads >= 1")
    if 0.0 not in args.probs or len(set(args.probs)) != len(args.probs) or not all(0 <= p <= 1 for p in args.probs):
        ap.error(f"--probs must be distinct shares in [0, 1] and include 0 (the reference), got {args.probs}")
    if args.world_model_weight < 0:
        ap.error(f"--world-model-weight must be >= 0, got {args.world_model_weight}")
    if args.warm.strip().lower() == "none":
        args.warm = None
    elif not Path(args.warm).is_dir():
        ap.error(
            f"--warm {args.warm}: no such SFT run folder; run benchmarks.experiments.lab_ablations first (it trains "
            "it), or pass --warm none to train the recipe's warm start in --out"
        )
    else:
        args.warm = str(Path(args.warm).resolve())  # one spelling, so a stage is found done from any directory
    args.argv = list(argv) if argv is not None else []
    return args


def run(args: argparse.Namespace, log=print) -> dict[str, Any]:
    """Run (or resume) every stage; return the results (also written to ``<out>/results.json`` after each run)."""
    import shlex

    out = Path(args.out)
    t_start = time.perf_counter()
    recipe, models, stages, warm = start_recipe_run(args, log, suites=WORLD_INFIXES)
    steps = args.grpo_steps or recipe.grpo.num_steps
    arms = env_cost_arms(tuple(sorted(args.probs)), args.world_model_weight)
    warm_eval = evaluate(stages, recipe, models, "warm_start/eval", warm)
    warm_fid = (
        evaluate(stages, recipe, models, "warm_start/fidelity", warm, fidelity=True, limit=args.fidelity_limit)
        if args.fidelity_limit
        else {}
    )
    warm_row = {
        "success": warm_eval["accuracy"],
        "task_rewards": task_rewards(out / "warm_start" / "eval"),
        "fidelity": row_fidelity([warm_fid]),
        "fidelity_tasks": warm_fid.get("n_tasks"),
        "seconds": stages.timings["warm_start/eval"],
    }
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
    results: dict[str, Any] = {}
    for seed in range(args.seeds):
        for arm, fields in arms.items():
            changes = {"seed": seed, "num_steps": steps, "run.save_every": steps, **fields}
            record = train_and_score(
                stages, recipe, models, f"{arm}/seed{seed}", warm, changes, fidelity_limit=args.fidelity_limit, log=log
            )
            runs[arm].append({"seed": seed, **{k: v for k, v in record.items() if k != "model"}})
            done = min(len(r) for r in runs.values())
            # rows, table and plot over the seeds every arm has finished (the first seed while it is under way),
            # so a partial file never mixes a 2-seed interval with 1-seed ones
            results = summarize(
                args, recipe, steps, warm, warm_row, arms, {a: r[: max(done, 1)] for a, r in runs.items()}
            )
            results.update(
                seeds_done=done,
                wall_s=time.perf_counter() - t_start,
                command=("python -m benchmarks.experiments.lab_env_cost " + shlex.join(args.argv)).strip(),
                **provenance(stages),
                stage_seconds=dict(stages.timings),
            )
            (out / "results.json").write_text(json.dumps(results, indent=1))
            plot(results, out / "env_cost.png")
        log(f"[env cost] {seed + 1}/{args.seeds} seeds in {out / 'results.json'}")
    for line in table(results):
        log(line)
    return results


def summarize(
    args: argparse.Namespace,
    recipe: Any,
    steps: int,
    warm: str,
    warm_row: dict[str, Any],
    arms: dict[str, dict[str, Any]],
    runs: dict[str, list[dict[str, Any]]],
) -> dict[str, Any]:
    """The results.json body: one row per arm with runs, each paired by seed with p = 0 (without the loss)."""
    reference = {r["seed"]: r["eval"]["task_rewards"] for r in runs[arm_name(0.0)]}
    rows = []
    for arm, fields in arms.items():
        done = [r for r in runs[arm] if r["seed"] in reference]
        if not done:
            continue
        row: dict[str, Any] = {
            "arm": arm,
            "real_call_prob": fields["real_call_prob"],
            "world_model_loss_weight": fields.get("world_model_loss_weight", 0.0),
            "seeds": [r["seed"] for r in done],
        }
        row.update(paired_comparison([r["eval"]["task_rewards"] for r in done], [reference[r["seed"]] for r in done]))
        for total in ("real_tool_calls", "real_answers", "verifier_replay_calls", "world_model_tokens"):
            row[f"{total}_per_seed"] = [int(r["train"][total]) for r in done]
            row[total] = float(np.mean(row[f"{total}_per_seed"]))
        row["fidelity"] = row_fidelity([r["fidelity"] for r in done])
        row["seconds_per_seed"] = [r["train_s"] + r["eval_s"] for r in done]
        row["seconds"] = float(np.mean(row["seconds_per_seed"]))
        rows.append(row)
    g = recipe.grpo
    return {
        "kind": world_kind("lab_env_cost", recipe.suite),  # each lab world its own section
        "recipe": str(args.recipe),
        "model": recipe.model,
        "start": warm,
        "seeds": args.seeds,
        "grpo_steps": steps,
        "grpo": {"batch_tasks": g.batch_tasks, "group_size": g.group_size, "lr": g.optim.lr},
        "world_model_weight": args.world_model_weight,
        "test_tasks": len(warm_row["task_rewards"]),
        "fidelity_tasks": warm_row["fidelity_tasks"],
        "warm_start": warm_row,
        "rows": rows,
    }


def plot(results: dict[str, Any], path: Path) -> Path:
    """Success and fidelity (exact match, ordinary and error outputs) against real calls in training per run, one
    line per loss setting (x on a symmetric log scale, so p = 0 at 0 calls is shown)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results["rows"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    reference = next((r for r in rows if r["real_call_prob"] == 0), None)
    nan = float("nan")
    for weight in sorted({r["world_model_loss_weight"] for r in rows}):
        line = [r for r in rows if r["world_model_loss_weight"] == weight]
        if weight and reference is not None:
            line = [reference, *line]  # p = 0 with the loss is the run without it
        line.sort(key=lambda r: r["real_tool_calls"])
        xs = [r["real_tool_calls"] for r in line]
        label = f"world-model loss {weight:g}" if weight else "no world-model loss"
        ax.errorbar(
            xs,
            [r["mean"] for r in line],
            yerr=[nan if r["ci95"] is None else r["ci95"] for r in line],
            marker="o",
            capsize=3,
            label=label,
        )
        for r, x in zip(line, xs):
            label_p = f"p={r['real_call_prob']:g}"
            ax.annotate(label_p, (x, r["mean"]), fontsize=7, xytext=(3, 3), textcoords="offset points")
        for split, style in (("ordinary exact", "-"), ("error exact", "--")):
            ys = [nan if r["fidelity"][split] is None else r["fidelity"][split] for r in line]
            bx.plot(xs, ys, style, marker="o", label=f"{split}, {label}")
    warm = results["warm_start"]
    ax.axhline(warm["success"], color="grey", lw=0.8, ls=":", label="warm start")
    most = max([r["real_tool_calls"] for r in rows] + [10.0])
    ticks = [0.0] + [10.0**k for k in range(1, math.ceil(math.log10(most)) + 1)]
    for a, title in ((ax, "test success, real backend"), (bx, "rehearsal fidelity (exact match)")):
        a.set_xscale("symlog", linthresh=10)
        a.set_xlim(-1, ticks[-1] * 1.5)
        a.set_xticks(ticks, [f"{t:g}" for t in ticks])
        a.set_xlabel("real tool calls in training per run (backend executions)")
        a.set_ylim(0, 1)
        a.set_title(title, fontsize=9)
        a.legend(fontsize=7)
    ax.set_ylabel(
        f"mean, 95% CI over {results.get('seeds_done', results['seeds'])} seeds ({results['test_tasks']} tasks)"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return run(parse_args(argv))


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
