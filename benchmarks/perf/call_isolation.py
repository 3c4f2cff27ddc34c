"""What per-call isolation costs: BFCL backend calls in this process vs in a forked child of the call server.

`envace_gym.limits.run_limited` runs a backend call either in the caller's process (``isolation="none"``:
time limit on the main thread only, no memory limit) or in a child forked from a small helper process
(``isolation="process"``, the Linux default: time and memory limits always hold). This script measures,
side by side in one run, on real BFCL backends:

* per-call wall time of a few state-changing and read-only BFCL calls, both modes, and their ratio;
* the same with a ballast of ``--ballast-gb`` of resident memory in this process (a training process holds
  a model and its optimizer), to show that the isolated cost does not grow with the caller's memory,
  next to the cost of forking the caller itself (what a per-call ``os.fork`` of the trainer would pay);
* the verifier's replay (`BFCLSuite.verify` of the ground truth as model calls) over ``--tasks`` tasks.

Usage::

    .venv/bin/python -m benchmarks.perf.call_isolation                 # 200 calls, 1 GB ballast, 50 tasks
    .venv/bin/python -m benchmarks.perf.call_isolation --calls 1000 --ballast-gb 4

Prints one table of milliseconds per call (or per verified task) and the isolated/in-process ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

CALLS = [
    ("ls", {}),
    ("mkdir", {"dir_name": "bench"}),
    ("cd", {"folder": "bench"}),
    ("touch", {"file_name": "a.txt"}),
    ("echo", {"content": "hello", "file_name": "a.txt"}),
    ("cat", {"file_name": "a.txt"}),
    ("cd", {"folder": ".."}),
    ("rm", {"file_name": "bench"}),
]


def _resident_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def time_calls(isolation: str, n: int) -> float:
    """Milliseconds per call (median of 5 batches) of `n` calls cycling through CALLS on one backend."""
    from benchmarks.bfcl import BFCLSuite
    from envace_gym.limits import CallLimits
    from envace_gym.types import ToolCall

    suite = BFCLSuite(call_limits=CallLimits(isolation=isolation))
    task = next(
        t for t in suite.tasks(["multi_turn_base"], "all") if "GorillaFileSystem" in t.metadata["involved_classes"]
    )
    backend = suite.make_backend(task)
    backend.execute(ToolCall("ls", {}))  # starts the call server once, outside the timing
    batches = []
    for _ in range(5):
        t0 = time.perf_counter()
        for i in range(n // 5):
            name, args = CALLS[i % len(CALLS)]
            backend.execute(ToolCall(name, args))
        batches.append(1000 * (time.perf_counter() - t0) / (n // 5))
    return statistics.median(batches)


def time_fork_of_caller(n: int) -> float:
    """Milliseconds per ``os.fork`` of this process plus the child's exit and the wait."""
    t0 = time.perf_counter()
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
    return 1000 * (time.perf_counter() - t0) / n


def time_verify(isolation: str, tasks: int) -> float:
    """Milliseconds per `BFCLSuite.verify` of the ground truth (replayed as model calls, one step per turn)."""
    from benchmarks.bfcl import BFCLSuite
    from benchmarks.bfcl.verify import ground_truth_tool_calls
    from envace_gym.limits import CallLimits

    suite = BFCLSuite(call_limits=CallLimits(isolation=isolation))
    chosen = suite.tasks(["multi_turn_base"], "all")[:tasks]
    t0 = time.perf_counter()
    for task in chosen:
        turns = ground_truth_tool_calls(task)
        result = suite.verify_calls(task, [[list(turn)] if turn else [] for turn in turns])
        assert result.reward == 1.0, task.id
    return 1000 * (time.perf_counter() - t0) / len(chosen)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200, help="calls per measurement (5 batches)")
    parser.add_argument("--ballast-gb", type=float, default=1.0, help="resident memory added for the second rows")
    parser.add_argument("--tasks", type=int, default=50, help="multi_turn_base tasks for the verifier rows")
    args = parser.parse_args(argv)

    rows = []
    for label in ("as started", f"+{args.ballast_gb:g} GB ballast"):
        if label != "as started":
            ballast = bytearray(int(args.ballast_gb * 2**30))
            ballast[::4096] = b"\1" * len(ballast[::4096])  # touch every page: resident, as a model's weights
        here, isolated = time_calls("none", args.calls), time_calls("process", args.calls)
        fork = time_fork_of_caller(20)
        rows.append((f"backend call, {label} ({_resident_mb():.0f} MB resident)", here, isolated, fork))
    here, isolated = time_verify("none", args.tasks), time_verify("process", args.tasks)
    rows.append((f"verify one task ({args.tasks} multi_turn_base)", here, isolated, None))

    print(f"{'measurement':<52} {'in-process ms':>13} {'isolated ms':>11} {'ratio':>7} {'fork caller ms':>14}")
    for label, a, b, fork in rows:
        print(f"{label:<52} {a:>13.3f} {b:>11.3f} {b / a:>7.1f} {'' if fork is None else f'{fork:.1f}':>14}")


if __name__ == "__main__":
    main()
