"""lab-tiny's SFT step with glibc's mmap threshold fixed at 128 KiB (`MemoryConfig`'s default) against glibc's own
dynamic threshold (``malloc_mmap_threshold_kb: 0``), side by side.

`agents.training.allocator` fixes the threshold so that a 135M model's freed activations leave resident memory; the
price is that every large block is a fresh mapping whose pages fault in. At lab-tiny's size (0.9M parameters) a
step is short and allocates many such blocks, so the price is a large share of the step. ``mallopt`` is
process-wide and cannot be undone, so each side runs in its own process (this script with ``--side KB``); sides
alternate because this machine's speed drifts. Each side trains the lab recipe's SFT stage from the same
initialisation on the same demonstrations (``--demos`` train tasks, ``--steps`` steps) and prints the median
seconds per step (the first five untimed) and its loss per step; the parent prints the ratio of the medians and
whether the two sides' losses are identical (the allocator must not change the numbers).

    .venv/bin/python -m benchmarks.perf.allocator_ab [--steps 40] [--demos 1500] [--pairs 2] [--threads 2]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

RECIPE = Path(__file__).resolve().parents[2] / "configs" / "recipes" / "lab.yaml"
SIDES = (128, 0)
"""The mmap thresholds compared, in KiB: `MemoryConfig`'s default and glibc's dynamic threshold (0)."""


def run_side(kb: int, steps: int, demos: int, threads: int) -> dict:
    """One side in this process: the recipe's SFT stage with threshold `kb`; median step seconds and losses."""
    import torch

    from agents.config import load_dataclass, replace_fields
    from agents.models import default_store
    from agents.pipeline import PipelineConfig, sft_stage
    from agents.training.run_folder import read_jsonl

    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as out:
        recipe = load_dataclass(PipelineConfig, str(RECIPE), run_dir=out, threads=threads)
        sft = replace_fields(
            recipe.sft,
            {"max_steps": steps, "max_demos": demos, "memory.malloc_mmap_threshold_kb": kb, "run.save_every": steps},
        )
        sft_stage(dataclasses.replace(recipe, sft=sft), Path(out) / "sft", default_store(), log=lambda *_: None)
        history = list(read_jsonl(Path(out) / "sft" / "metrics.jsonl"))
    return {
        "kb": kb,
        "median_step_s": statistics.median(h["perf/step_s"] for h in history[5:]),
        "losses": [h["train/loss"] for h in history],
    }


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40, help="SFT steps per side (the first five untimed)")
    parser.add_argument("--demos", type=int, default=1500, help="train demonstrations (fewer: less time building)")
    parser.add_argument("--pairs", type=int, default=2, help="alternating runs of each side")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--side", type=int, default=None, help=argparse.SUPPRESS)  # a child process: one side
    args = parser.parse_args(argv)
    if args.steps < 6 or args.pairs < 1:
        parser.error("--steps needs at least 6 (five are untimed) and --pairs at least 1")
    if args.side is not None:
        print(json.dumps(run_side(args.side, args.steps, args.demos, args.threads)))
        return {}
    runs: dict[int, list[dict]] = {kb: [] for kb in SIDES}
    # a MALLOC_MMAP_THRESHOLD_ in the environment would fix the threshold on the dynamic side too
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    for _ in range(args.pairs):
        for kb in SIDES:
            command = [sys.executable, "-m", "benchmarks.perf.allocator_ab", "--side", str(kb)]
            command += ["--steps", str(args.steps), "--demos", str(args.demos), "--threads", str(args.threads)]
            done = subprocess.run(command, capture_output=True, text=True, env=env)
            if done.returncode:
                sys.exit(f"side {kb} KiB failed:\n{done.stderr[-3000:]}")
            runs[kb].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"threshold {kb:>3} KiB: median SFT step {runs[kb][-1]['median_step_s']:.3f} s")
    medians = {kb: statistics.median(r["median_step_s"] for r in runs[kb]) for kb in SIDES}
    same = all(r["losses"] == runs[SIDES[0]][0]["losses"] for kb in SIDES for r in runs[kb])
    ratio = medians[128] / medians[0]
    print(
        f"median step: fixed 128 KiB {medians[128]:.3f} s, glibc's dynamic threshold {medians[0]:.3f} s, "
        f"ratio {ratio:.2f}; losses identical on every run: {same}"
    )
    return {"fixed_s": medians[128], "dynamic_s": medians[0], "ratio": ratio, "same_losses": float(same)}


if __name__ == "__main__":
    main()
