"""Write the checklists a suite derives from its reference solutions as JSONL (`envace_gym.judging`'s format), for
a judge reward or for inspection::

    .venv/bin/python -m benchmarks.experiments.make_checklists --suite lab --split test --out checklists/lab_test.jsonl

Suites with ``checklist(task)``: ``lab`` and ``lab-stated`` (`benchmarks.lab.suite.LabSuite.checklist`), ``tau2``
(`benchmarks.tau2.suite.Tau2Suite.checklist`; tasks without criteria are skipped).
"""

from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> int:
    from envace_gym.judging import write_checklists
    from envace_gym.suites import make_suite

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", default="lab")
    ap.add_argument("--categories", nargs="*", default=None, help="the suite's categories (default: its own)")
    ap.add_argument("--split", default="test", choices=("train", "test", "all"))
    ap.add_argument("--out", required=True, help="the JSONL file to write (replaced)")
    args = ap.parse_args(argv)
    suite = make_suite(args.suite)
    derive = getattr(suite, "checklist", None)
    if not callable(derive):
        raise SystemExit(f"suite {args.suite!r} derives no checklists (no checklist(task) method)")
    checklists = [c for c in (derive(t) for t in suite.tasks(args.categories, args.split)) if c is not None]
    n = write_checklists(args.out, checklists)
    print(f"[make_checklists] {n} checklists ({sum(c.num_items for c in checklists)} items) in {args.out}")
    return n


if __name__ == "__main__":
    main()
