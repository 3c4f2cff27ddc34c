"""Score BFCL's own ground truth through envace-gym's BFCL verifiers, per category.

Multi-turn: each task's ground-truth calls (parsed without eval, positional arguments bound by signature)
are replayed as the model's calls, one step per turn; the verifier replays them again next to a second
fresh backend running the ground truth, with BFCL's state and response checks. Every task should score 1.0.

Single-turn: the first alternative of every argument in BFCL's possible answer becomes the answer
(names shown dotted->underscored, as to a model), checked by BFCL's ast_checker. Irrelevance categories are
answered with no call. A few BFCL data quirks fail (see tests/benchmarks/bfcl/test_bfcl.py).

Usage: ``python -m benchmarks.perf.bfcl_ground_truth [--failures]``
"""

from __future__ import annotations

import argparse
import time

from benchmarks.bfcl import MULTI_TURN_CATEGORIES, SINGLE_TURN_CATEGORIES, BFCLSuite
from benchmarks.bfcl.verify import ground_truth_tool_calls, single_turn_ground_truth_calls


def main(argv: list[str] | None = None) -> int:
    """Print a table of ground-truth scores; returns 0 (the scores are the output, not a pass/fail)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--failures", action="store_true", help="list the ids (and error types) of tasks that fail")
    args = ap.parse_args(argv)
    suite = BFCLSuite()
    print(f"{'category':28s} {'kind':11s} {'passed':>7s} {'total':>6s} {'score':>7s} {'secs':>6s}")
    grand = [0, 0]
    for category in MULTI_TURN_CATEGORIES + SINGLE_TURN_CATEGORIES:
        t0 = time.perf_counter()
        tasks = suite.tasks([category], split="all")
        failed = []
        for task in tasks:
            if task.verifier == "bfcl.multi_turn":
                calls = [[turn] if turn else [] for turn in ground_truth_tool_calls(task)]
            else:
                calls = [[single_turn_ground_truth_calls(task)]]
            result = suite.verify_calls(task, calls)
            if not result.valid:
                failed.append((task.id, result.details.get("error_type")))
        passed = len(tasks) - len(failed)
        grand[0] += passed
        grand[1] += len(tasks)
        kind = "multi-turn" if category in MULTI_TURN_CATEGORIES else "single-turn"
        print(
            f"{category:28s} {kind:11s} {passed:7d} {len(tasks):6d} {passed / len(tasks):7.2%} "
            f"{time.perf_counter() - t0:6.1f}"
        )
        if args.failures:
            for tid, err in failed:
                print(f"    FAIL {tid}: {err}")
    print(f"{'all':28s} {'':11s} {grand[0]:7d} {grand[1]:6d} {grand[0] / grand[1]:7.2%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
