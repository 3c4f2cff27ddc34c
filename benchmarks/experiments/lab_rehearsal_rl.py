"""Rehearsal-aware RL on the hidden-rules lab: does training on rollouts that rehearse before they commit beat plain
role-wise GRPO given the same generated tokens, with and without test-time rehearsal.

    python -m benchmarks.experiments.lab_rehearsal_rl --warm 'runs/lab_ttr/memory_sft/seed{seed}/sft'   # 3 seeds

Start from a policy that can read a rehearsal memory (the memory-conditioned SFT of
`benchmarks.experiments.lab_ttr`, one per seed): the plain warm start almost never succeeds after reading a memory
(its N=2 success is near 0), and in a 2-step trial from it every group's rehearsing rollouts scored 0: no signal.

Protocol (fixed before any result was seen; every setting is reported):

1. **Three role-wise GRPO continuations of the same start per seed** (``--warm``; ``{seed}`` in it is the seed), with
   the recipe's GRPO settings (B x K, lr, caps): ``rehearsal_rl`` runs ``--steps`` steps whose rollouts open every
   user turn with ``--n`` private rehearsal attempts and their trace memory (`agents.rollout.collect_rollouts` with
   ``rehearsal_n``; the committed reward also trains the attempts' ACT and REHEARSE tokens);
   ``role_grpo_equal_tokens`` runs plain role-wise GRPO until its rollouts have generated as many ACT and REHEARSE
   tokens as ``rehearsal_rl``'s did (``generated_token_budget``); ``role_grpo_equal_steps`` runs plain role-wise GRPO
   for ``--steps`` steps (less compute: the cost of the attempts shows against it).
2. **Evaluation on the same test tasks** (greedy commits on the real backend, ``--limit`` per family): the start
   and every continuation at N = 0 and at N = ``--n`` parallel attempts of its own rehearsal (the memory layout
   ``rehearsal_rl`` trained with: ``--memory``, ``--restate-request``, to match the start's memory training).

The equal-token run stops at the first step whose cumulative tokens reach the budget, so it overshoots by less than
one step's tokens (both totals are reported). Rows are paired by seed and task with ``role_grpo_equal_tokens`` at the
same N (the issue's comparison): the mean difference with its 95% t-interval over seeds, tasks gained and lost summed
over seeds, and per seed an exact McNemar test. Each row reports the tokens generated in training and, at evaluation,
the rehearsal tokens per task. Stages resume (`agents.pipeline.StageRunner`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.experiments.paired import (
    WORLD_INFIXES,
    paired_comparison,
    rehearsal_tokens_per_task,
    start_recipe_run,
    task_rewards,
    world_kind,
)
from benchmarks.experiments.result_tables import rehearsal_rl_table as table
from benchmarks.experiments.workers import add_worker_options, check_worker_options, run_workers
from benchmarks.provenance import provenance

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "configs" / "recipes" / "lab.yaml"
POLICIES = ("start", "rehearsal_rl", "role_grpo_equal_tokens", "role_grpo_equal_steps")
REFERENCE = "role_grpo_equal_tokens"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument(
        "--recipe", default=str(RECIPE), help="the envace pipeline YAML (model, suite, GRPO and eval settings)"
    )
    ap.add_argument("--out", default="runs/lab_rehearsal_rl", help="folder of every stage, results.json and the plot")
    ap.add_argument(
        "--warm",
        default=None,
        help="the SFT run folder every arm starts from, '{seed}' replaced by the seed (default: train the recipe's "
        "warm start in OUT)",
    )
    ap.add_argument("--seeds", type=int, default=3, help="seeds 0..S-1 (GRPO sampling, attempt sampling)")
    ap.add_argument("--steps", type=int, default=20, help="GRPO steps of rehearsal_rl and role_grpo_equal_steps")
    ap.add_argument("--n", type=int, default=2, help="rehearsal attempts per user turn, in training and evaluation")
    ap.add_argument(
        "--memory",
        choices=["trace", "outcomes"],
        default="trace",
        help=(
            "the memory's layout in training and evaluation (wrappers.TestTimeRehearsal's memory): give the one the "
            "start was trained to read (lab_ttr --memory); outcomes writes results of their own kind"
        ),
    )
    ap.add_argument(
        "--restate-request",
        action="store_true",
        help=(
            "the turn's request again after each memory, in training and evaluation (a start trained that way: "
            "lab_ttr's *_restated_* policies); results of their own kind"
        ),
    )
    ap.add_argument("--limit", type=int, default=50, help="test tasks per family")
    ap.add_argument("--threads", type=int, default=2, help="torch threads per process")
    add_worker_options(
        ap,
        "train and evaluate the seeds in parallel (worker k takes the seeds s with s %% W == k) after the shared "
        "start's N=0 evaluation",
    )
    args = ap.parse_args(argv)
    check_worker_options(ap, args)
    if args.seeds < 1 or args.steps < 1 or args.n < 1 or args.limit < 1:
        ap.error("--seeds, --steps, --n and --limit must be >= 1")
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what the workers and results.json repeat
    return args


def run(args: argparse.Namespace, log=print) -> dict[str, Any]:
    """Run (or resume) every stage; return the results (also written to ``<out>/results.json`` after each seed)."""
    import shlex

    from agents.pipeline import latest_model
    from agents.training.run_folder import read_jsonl
    from benchmarks.experiments.arms import grpo_run

    out = Path(args.out)
    t_start = time.perf_counter()
    per_seed = bool(args.warm) and "{seed}" in args.warm
    first = argparse.Namespace(**{**vars(args), "warm": args.warm.format(seed=0) if per_seed else args.warm})
    recipe, models, stages, warm = start_recipe_run(first, log, suites=WORLD_INFIXES)

    def start_of(seed: int) -> str:
        return latest_model(args.warm.format(seed=seed)) if per_seed else warm

    def grpo(name: str, seed: int, **changes: Any) -> dict[str, Any]:
        info, model = grpo_run(stages, recipe, models, name, start_of(seed), {"seed": seed, **changes}, log)
        history = list(read_jsonl(out / name / "grpo" / "metrics.jsonl"))
        return {
            "model": model,
            "steps": len(history),
            "generated_tokens": int(history[-1]["rollout/generated_tokens_total"]) if history else 0,
            "attempt_tokens": sum(int(h.get("rollout/attempt_tokens", 0)) for h in history),
            "seconds": info["seconds"],
        }

    def evaluation(name: str, model: str, seed: int, n: int) -> dict[str, Any]:
        changes = {"memory": args.memory, "restate_request": args.restate_request} if n else {}
        config = dataclasses.replace(recipe.eval_config(out / name, model), seed=seed, rehearsal_n=n, **changes)
        stages.evaluate(name, config, models)
        return {"rewards": task_rewards(out / name), "tokens_per_task": rehearsal_tokens_per_task(out / name)}

    measured: dict[str, list[dict[str, Any]]] = {}
    training: dict[str, list[dict[str, Any]]] = {p: [] for p in POLICIES[1:]}
    results: dict[str, Any] = {}
    if args.workers > 1 and args.worker is None:
        if not per_seed:
            evaluation("start/n0", warm, 0, 0)  # shared by every seed: made once, before the workers
        run_workers(args, out, log, module="benchmarks.experiments.lab_rehearsal_rl")  # the loop reads them back
    for seed in range(args.seeds):
        if args.worker is not None and seed % args.workers != args.worker:
            continue
        rl = grpo(
            f"rehearsal_rl/seed{seed}",
            seed,
            num_steps=args.steps,
            rehearsal_n=args.n,
            rehearsal_memory=args.memory,
            rehearsal_restate_request=args.restate_request,
        )
        runs = {
            "rehearsal_rl": rl,
            # plain rollouts cost about 1/(N+1) of rehearsing ones: the step cap is never what stops this run
            "role_grpo_equal_tokens": grpo(
                f"role_grpo_equal_tokens/seed{seed}",
                seed,
                num_steps=args.steps * (args.n + 1) * 4,
                generated_token_budget=rl["generated_tokens"],
            ),
            "role_grpo_equal_steps": grpo(f"role_grpo_equal_steps/seed{seed}", seed, num_steps=args.steps),
        }
        equal = runs["role_grpo_equal_tokens"]
        if equal["generated_tokens"] < rl["generated_tokens"]:  # the step cap ended it first: not equal compute
            raise RuntimeError(
                f"role_grpo_equal_tokens/seed{seed} stopped at {equal['steps']} steps with {equal['generated_tokens']} "
                f"generated tokens, short of rehearsal_rl's {rl['generated_tokens']}; raise its step cap"
            )
        for policy, info in runs.items():
            training[policy].append(info)
        models_of = {"start": start_of(seed), **{p: info["model"] for p, info in runs.items()}}
        for policy, model in models_of.items():
            # one start for every seed: its N=0 evaluation is greedy and seed-free, one folder serves them all
            shared = policy == "start" and not per_seed
            n0 = "start/n0" if shared else f"{policy}/seed{seed}/n0"
            measured.setdefault(f"{policy} | N=0", []).append(evaluation(n0, model, 0 if shared else seed, 0))
            measured.setdefault(f"{policy} | N={args.n}", []).append(
                evaluation(f"{policy}/seed{seed}/n{args.n}", model, seed, args.n)
            )
        if args.worker is not None:
            continue  # a worker's seeds are a subset: the process that started it writes the results
        results = summarize(args, recipe, args.warm or warm, measured, training)
        results.update(
            seeds_done=seed + 1,
            wall_s=time.perf_counter() - t_start,
            command=("python -m benchmarks.experiments.lab_rehearsal_rl " + shlex.join(args.argv)).strip(),
            **provenance(stages),
            stage_seconds=dict(stages.timings),
        )
        (out / "results.json").write_text(json.dumps(results, indent=1))
        log(f"[rehearsal rl] {seed + 1}/{args.seeds} seeds in {out / 'results.json'}")
    if args.worker is not None:
        return {}
    for line in table(results):
        log(line)
    return results


def result_kind(suite: str, memory: str = "trace", restate_request: bool = False) -> str:
    """The ``kind`` of a run's ``results.json``: ``lab_rehearsal_rl`` with the recipe's world
    (`benchmarks.experiments.paired.world_kind`), ``_outcomes`` for ``--memory outcomes`` and ``_restated`` for
    ``--restate-request`` (so neither ever replaces the default run's section).

    Raises:
        ValueError: a suite without a kind (the lab's worlds have one each).
    """
    return (
        world_kind("lab_rehearsal_rl", suite)
        + ("" if memory == "trace" else f"_{memory}")
        + ("_restated" if restate_request else "")
    )


def summarize(args, recipe, warm, measured, training) -> dict[str, Any]:
    """The results.json body: one row per (policy, N), paired with ``role_grpo_equal_tokens`` at the same N."""
    rows = []
    for key, seeds in measured.items():
        policy, setting = key.split(" | ")
        reference = measured[f"{REFERENCE} | {setting}"]
        row = {"policy": policy, "setting": setting, "n_seeds": len(seeds)}
        row.update(paired_comparison([s["rewards"] for s in seeds], [r["rewards"] for r in reference]))
        row["tokens_per_task"] = sum(s["tokens_per_task"] for s in seeds) / len(seeds)
        runs = training.get(policy, [])
        row["train_steps"] = [r["steps"] for r in runs]
        row["train_generated_tokens"] = [r["generated_tokens"] for r in runs]
        row["train_attempt_tokens"] = [r["attempt_tokens"] for r in runs]
        row["train_s"] = [r["seconds"] for r in runs]
        rows.append(row)
    g = recipe.grpo
    return {
        "kind": result_kind(recipe.suite, args.memory, args.restate_request),
        "memory": args.memory,
        "restate_request": args.restate_request,
        "recipe": str(args.recipe),
        "model": recipe.model,
        "start": warm,
        "seeds": args.seeds,
        "steps": args.steps,
        "n": args.n,
        "reference": REFERENCE,
        "grpo": {"batch_tasks": g.batch_tasks, "group_size": g.group_size, "lr": g.optim.lr},
        "test_tasks": len(next(iter(measured.values()))[0]["rewards"]),
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return run(parse_args(argv))


if __name__ == "__main__":
    main()
