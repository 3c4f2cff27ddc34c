"""Wall time of one role-wise GRPO step on the hidden-rules lab with ``lab-tiny``, against the lab issue's target.

The target (EnvACE-Lab v1): one role-wise GRPO step of at least 128 trajectories in at most 3 seconds on 2 cores.
This script builds the recipe's trainer (``configs/recipes/lab.yaml``: B=16 x K=8, inline rehearsal, 8 ACT steps
per turn, 40 new tokens per message) from a warm start, runs ``--steps`` training steps after ``--warmup`` untimed
ones, and prints per step the rollout and update seconds (the trainer's own ``perf/rollout_s`` and
``perf/update_s``), the generated tokens, and the median step time against the target. ``--rehearsal-n N`` times
rehearsal-aware steps instead (N attempts per user turn before the committed steps).

``--engine-baseline`` also trains a second trainer from the same warm start with the generation engine's three
rollout-shaped optimisations off (`agents.engines.generation`: finished rows stay in the decode's batch,
``COMPACT_FRACTION = 0``; every ragged prefill is one padded forward, ``BUCKET_CALL_TOKENS`` unbounded; each decode
step attends every row over every column, ``SEGMENT_CALL_CELLS`` unbounded), its
steps alternating with the first's (this machine's speed drifts), and prints the ratio of the median rollout
seconds. Both draw the same samples up to float rounding (a rare flip between two ids with no probability
between them); the generated tokens are printed side by side.

    .venv/bin/python -m benchmarks.perf.lab_grpo_step --init runs/lab_ablations/warm_start/sft
    .venv/bin/python -m benchmarks.perf.lab_grpo_step --init runs/lab/sft --engine-baseline

Run it on an idle machine: other processes on the 2 cores slow every step.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

TARGET_S = 3.0
RECIPE = Path(__file__).resolve().parents[2] / "configs" / "recipes" / "lab.yaml"


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(
        description="Wall time of one role-wise GRPO step (B=16 x K=8 trajectories) on the hidden-rules lab with "
        f"lab-tiny, against the {TARGET_S:g} s target of the lab's design (docs/benchmarks.md).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    ap.add_argument(
        "--init",
        required=True,
        help="a warm start's SFT run folder, e.g. runs/lab/sft from `make demo` (an untrained model earns no reward "
        "to train on)",
    )
    ap.add_argument("--recipe", default=str(RECIPE), help="the pipeline YAML whose GRPO settings the step uses")
    ap.add_argument("--steps", type=int, default=5, help="timed steps")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    ap.add_argument(
        "--rehearsal-n", type=int, default=0, help="rehearsal attempts per user turn (rehearsal-aware steps; 0: plain)"
    )
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    ap.add_argument(
        "--engine-baseline",
        action="store_true",
        help="also time the same steps with the engine's rollout optimisations off (row compaction, prefill buckets, "
        "attention segments), alternating",
    )
    args = ap.parse_args(argv)
    if args.steps < 1 or args.warmup < 0:
        ap.error("--steps must be >= 1 and --warmup >= 0")

    import torch

    from agents.config import load_dataclass, replace_fields
    from agents.engines import generation
    from agents.pipeline import PipelineConfig, latest_model
    from agents.training.trainer import RoleWiseGRPOTrainer

    torch.set_num_threads(args.threads)
    recipe = load_dataclass(PipelineConfig, args.recipe, threads=args.threads)
    knobs = ("COMPACT_FRACTION", "BUCKET_CALL_TOKENS", "SEGMENT_CALL_CELLS")
    engine = {k: getattr(generation, k) for k in knobs}
    without = {"COMPACT_FRACTION": 0.0, "BUCKET_CALL_TOKENS": 10**12, "SEGMENT_CALL_CELLS": 10**12}
    with tempfile.TemporaryDirectory() as tmp:
        trainers = []
        for name in ("ours", "baseline") if args.engine_baseline else ("ours",):
            config = replace_fields(
                recipe.grpo_config(str(Path(tmp, name)), latest_model(args.init)),
                {
                    "num_steps": args.warmup + args.steps,
                    "run.save_every": 10**6,
                    "tensorboard": False,
                    "rehearsal_n": args.rehearsal_n,
                },
            )
            trainers.append(RoleWiseGRPOTrainer(config, log=lambda *_: None))
        measured: list[list[dict[str, float]]] = [[] for _ in trainers]
        try:
            for _ in range(args.warmup + args.steps):
                for trainer, settings, rows in zip(trainers, (engine, without), measured):
                    for key, value in settings.items():
                        setattr(generation, key, value)
                    rows.append(trainer.train_step())
        finally:
            for key, value in engine.items():
                setattr(generation, key, value)
            for trainer in trainers:
                trainer.close()
    rows = measured[0][args.warmup :]
    print(
        f"lab GRPO step: B={config.batch_tasks} x K={config.group_size} = {config.trajectories_per_step} trajectories, "
        f"rehearsal_n={args.rehearsal_n}, {args.threads} threads"
    )
    print(f"{'step':>4} {'rollout s':>10} {'update s':>9} {'step s':>7} {'generated tokens':>17}")
    for m in rows:
        print(
            f"{m['step']:>4} {m['perf/rollout_s']:>10.2f} {m['perf/update_s']:>9.2f} {m['perf/step_s']:>7.2f} "
            f"{m['rollout/generated_tokens']:>17}"
        )
    median = statistics.median(m["perf/step_s"] for m in rows)
    print(f"median step {median:.2f} s; target {TARGET_S:.1f} s: ratio {median / TARGET_S:.2f}")
    result = {"median_step_s": median, "ratio_to_target": median / TARGET_S}
    if args.engine_baseline:
        base = measured[1][args.warmup :]
        print(
            f"{'step':>4} {'rollout s (ours)':>17} {'rollout s (baseline)':>21} "
            f"{'generated tokens (ours / baseline)':>36}"
        )
        for m, b in zip(rows, base):
            print(
                f"{m['step']:>4} {m['perf/rollout_s']:>17.2f} {b['perf/rollout_s']:>21.2f} "
                f"{m['rollout/generated_tokens']:>17} / {b['rollout/generated_tokens']}"
            )
        ours_s = statistics.median(m["perf/rollout_s"] for m in rows)
        base_s = statistics.median(m["perf/rollout_s"] for m in base)
        print(
            f"median rollout: ours {ours_s:.2f} s, baseline {base_s:.2f} s: ratio ours / baseline {ours_s / base_s:.2f}"
        )
        result["rollout_ratio_to_baseline"] = ours_s / base_s
    return result


if __name__ == "__main__":
    main()
