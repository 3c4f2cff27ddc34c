"""The model-free baseline on EnvACE-Lab: sb3-contrib's MaskablePPO on a discrete twin, real backend only.

``--suite`` picks the world: ``lab-stated`` (the default, ``EnvACE-LabDiscrete-v0``) or ``lab`` (the hidden
rules, ``EnvACE-LabHiddenDiscrete-v0``, whose observation shows a hidden value only once an output has).

For each seed: train on the train split for ``--timesteps`` env steps (every tool call goes to the real
backend; the closing actions are not calls), then play every test-split task once with the deterministic
policy. Prints per seed the test success, the real tool calls training made and the wall time, then the mean
and a 95% Student-t interval over seeds. The row the lab ablations compare a world-rehearsing policy with:
what success PPO reaches, and how many real calls it needed.

    .venv/bin/python -m benchmarks.experiments.lab_sb3_baseline [--suite lab] [--seeds 5] [--timesteps 50000] \\
        [--quick] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json

import torch

import envace_gym  # noqa: F401
from benchmarks.experiments.maskable_ppo import run_seed
from benchmarks.stats import mean_ci95, plus_minus


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="lab-stated", help="lab-stated, lab, or a registered variant of either")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--timesteps", type=int, default=50_000)
    ap.add_argument("--categories", nargs="*", default=None, help="lab categories (default: all)")
    ap.add_argument("--quick", action="store_true", help="2 seeds x 10,000 steps")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None, help="also write the results as JSON here")
    args = ap.parse_args(argv)
    if args.quick:
        args.seeds, args.timesteps = 2, 10_000
    torch.set_num_threads(args.threads)
    rows = []
    for seed in range(args.seeds):
        row = run_seed(seed, args.timesteps, args.categories, suite=args.suite)
        rows.append(row)
        print(
            f"seed {seed}: test success {row['test_success']:.3f} ({row['test_tasks']} tasks), "
            f"{row['train_real_calls']} real tool calls in training, {row['train_s']:.0f} s  "
            + " ".join(f"{c}={v:.2f}" for c, v in row["per_category"].items())
        )
    success, half = mean_ci95([r["test_success"] for r in rows])
    calls, calls_half = mean_ci95([float(r["train_real_calls"]) for r in rows])
    print(
        f"MaskablePPO on {args.suite}, {args.timesteps} steps, {args.seeds} seeds: "
        f"test success {plus_minus(success, half)} (95% CI), "
        f"real tool calls in training {plus_minus(calls, calls_half, '.0f')}"
    )
    result = {
        "suite": args.suite,
        "timesteps": args.timesteps,
        "seeds": args.seeds,
        "rows": rows,
        "test_success_mean": success,
        "test_success_ci95": half,
        "train_real_calls_mean": calls,
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
