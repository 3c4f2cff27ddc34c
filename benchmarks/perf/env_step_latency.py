"""Median and p99 `env.step` latency with real BFCL backends: the token-level `EnvACE-Tool-v0` next to the
text-level core it runs on, in one run.

Replays the ground-truth calls of BFCL multi-turn tasks through each env, one call per step (as a model
would; a turn with more calls than the 20-step limit packs several per step), plus the closing no-call step
of each turn (which runs the verifier on the last turn), and times every `env.step`. Prints median, p90, p99
and max, separately for tool-call steps and turn-ending steps, for `ToolUseEnv` (``EnvACE-Tool-v0``: keeps
the SmolLM2 token sequence) and `TextToolUseEnv` (no tokens), and the ratio of their medians.

    .venv/bin/python -m benchmarks.perf.env_step_latency \\
        [--categories multi_turn_base multi_turn_long_context] [--tasks 50]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import envace_gym  # noqa: F401
from benchmarks.bfcl.verify import ground_truth_tool_calls
from envace_gym.envs.text import TextToolUseEnv
from envace_gym.envs.tool_use import ToolUseEnv
from envace_gym.parsing import format_tool_calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--categories", nargs="+", default=["multi_turn_base", "multi_turn_long_context"])
    parser.add_argument("--tasks", type=int, default=50, help="tasks per category")
    args = parser.parse_args()
    for category in args.categories:
        medians = {}
        for kind in (ToolUseEnv, TextToolUseEnv):
            medians[kind.__name__] = _time(kind(suite="bfcl", categories=[category], split="all"), category, args.tasks)
        for name in medians["ToolUseEnv"]:
            ratio = medians["ToolUseEnv"][name] / medians["TextToolUseEnv"][name]
            print(f"{category:26s} {name:17s} median ToolUseEnv / TextToolUseEnv = {ratio:.2f}x")


def _time(env, category: str, num_tasks: int) -> dict[str, float]:
    """Play the ground truth of the first `num_tasks` tasks; print the latency rows; return the medians (ms)."""
    call_steps, end_steps, resets, rewards = [], [], [], []
    for task in env.tasks[:num_tasks]:
        t0 = time.perf_counter()
        env.reset(options={"task_id": task.id})
        resets.append(time.perf_counter() - t0)
        for calls in ground_truth_tool_calls(task):
            # one call per step; a turn with more calls than the step limit allows packs them evenly
            per_step = max(1, -(-len(calls) // (env.max_steps_per_turn - 1)))
            for i in range(0, len(calls), per_step):
                action = format_tool_calls(calls[i : i + per_step], "hermes")
                t0 = time.perf_counter()
                env.step(action)
                call_steps.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            _, reward, terminated, _, _ = env.step("Done.")
            end_steps.append(time.perf_counter() - t0)
        rewards.append(reward if terminated else float("nan"))
    label = f"{category:26s} {type(env).__name__:14s}"
    print(f"{label} ground-truth episodes scored 1.0: {sum(r == 1.0 for r in rewards)}/{len(rewards)}")
    medians = {}
    for name, xs in (("reset", resets), ("tool-call step", call_steps), ("turn-ending step", end_steps)):
        ms = np.array(xs) * 1e3
        medians[name] = float(statistics.median(ms))
        print(
            f"{label} {name:17s} n={len(ms):5d}  median {medians[name]:7.2f} ms  p90 {np.percentile(ms, 90):7.2f} ms  "
            f"p99 {np.percentile(ms, 99):7.2f} ms  max {ms.max():7.2f} ms"
        )
    return medians


if __name__ == "__main__":
    main()
