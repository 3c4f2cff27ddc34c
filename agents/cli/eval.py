"""``envace eval`` (`agents.evaluation.evaluate`: a policy on real backends, optionally with test-time
rehearsal and fidelity), ``envace report`` (`agents.evaluation.plots`: the plots of a run folder) and ``envace
failures`` (`agents.evaluation.failures`: where failed episodes left the reference solution)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from agents.config import NOT_GIVEN, add_dataclass_arguments, dataclass_from_args
from agents.evaluation.evaluate import (
    FIDELITY_FIELDS,
    SUMMARY_FIELDS,
    EvalConfig,
    evaluate,
    fidelity_tables,
    format_table,
)

__all__ = ["add_eval_parsers", "cmd_eval", "cmd_failures", "cmd_report"]


def _model_from_args(args: argparse.Namespace) -> str:
    if args.checkpoint:
        folder = Path(args.checkpoint) / "model"
        if not folder.is_dir():
            raise SystemExit(f"--checkpoint {args.checkpoint!r} has no model/ folder")
        return str(folder)
    return args.model


def cmd_eval(args: argparse.Namespace) -> int:
    """``envace eval``: run `evaluate` and print the summary (and fidelity) tables."""
    from agents.training.distributed import refuse_launcher

    refuse_launcher("eval")
    if args.checkpoint and args.model is not NOT_GIVEN:
        raise SystemExit("give --model or --checkpoint, not both")
    if args.checkpoint:
        args.model = _model_from_args(args)
    config = dataclass_from_args(EvalConfig, args)
    t0 = time.perf_counter()
    result = evaluate(config)
    print(f"[eval] {len(result.episodes)} tasks in {time.perf_counter() - t0:.0f} s; results in {config.out}")
    print(format_table(result.summary, SUMMARY_FIELDS))
    if config.fidelity:
        tables = fidelity_tables(result.fidelity_calls)
        print("[eval] rehearsal fidelity per tool")
        print(format_table(tables["tool"], FIDELITY_FIELDS))
        print("[eval] rehearsal fidelity per category")
        print(format_table(tables["category"], FIDELITY_FIELDS))
        print("[eval] rehearsal fidelity on error and ordinary real outputs")
        print(format_table(tables["output"], FIDELITY_FIELDS))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """``envace report RUN_DIR``: write the applicable plots to ``RUN_DIR/plots/``
    (`agents.evaluation.plots.report`)."""
    from agents.evaluation.plots import report

    paths = report(args.run_dir)
    if not paths:
        print(f"[report] nothing to plot in {args.run_dir} (no metrics.jsonl, summary.json or fidelity CSV)")
        return 1
    for p in paths:
        print(f"[report] wrote {p}")
    return 0


def cmd_failures(args: argparse.Namespace) -> int:
    """``envace failures``: the failure taxonomy of evaluation folders side by side
    (`agents.evaluation.failures`)."""
    from agents.evaluation.failures import failure_modes, failures_table

    if args.labels is not None and len(args.labels) != len(args.folders):
        raise SystemExit(
            f"envace failures: {len(args.labels)} --labels for {len(args.folders)} folders; give one label per folder"
        )
    try:
        results = [
            (label, failure_modes(folder))
            for folder, label in zip(args.folders, args.labels or _short_names(args.folders))
        ]
    except (FileNotFoundError, KeyError, ValueError) as err:
        raise SystemExit(f"envace failures: {err.args[0] if isinstance(err, KeyError) else err}") from None
    for line in failures_table(results):
        print(line)
    if args.by_category:
        categories = list(dict.fromkeys(c for _, r in results for c in r["kinds"]))
        for category in categories:
            print()
            for line in failures_table(results, category):
                print(line)
    return 0


def _short_names(folders: list[str]) -> list[str]:
    """Each folder's last path parts, as few as tell the folders apart (``seed0/eval``, ``seed1/eval``)."""
    parts = [Path(folder).resolve().parts for folder in folders]
    for n in range(1, max(len(p) for p in parts) + 1):
        names = ["/".join(p[-n:]) for p in parts]
        if len(set(names)) == len(names):
            return names
    return [str(folder) for folder in folders]  # (the same folder twice)


def add_eval_parsers(sub: Any) -> None:
    """Add the ``eval``, ``report`` and ``failures`` sub-commands to an argparse sub-parser collection."""
    ev = sub.add_parser(
        "eval",
        help="evaluate a policy on a suite's real backends (success per category), optionally with test-time "
        "rehearsal or rehearsal fidelity",
    )
    add_dataclass_arguments(ev, EvalConfig)
    ev.add_argument(
        "--checkpoint", default=None, help="RUN_DIR/checkpoints/step_N: evaluate its model/ folder (instead of --model)"
    )
    ev.set_defaults(func=cmd_eval)
    rep = sub.add_parser(
        "report", help="write plots (training curves, accuracy vs rehearsal N, fidelity) to RUN_DIR/plots/"
    )
    rep.add_argument("run_dir", help="a training run folder or a folder of eval outputs")
    rep.set_defaults(func=cmd_report)
    fail = sub.add_parser(
        "failures",
        help="where the failed episodes of evaluation folders first left the suite's reference solution, side by side",
    )
    fail.add_argument("folders", nargs="+", help="evaluation folders (envace eval --out, a pipeline's eval_* stage)")
    fail.add_argument("--labels", nargs="+", default=None, help="a column label per folder (default: folder names)")
    fail.add_argument("--by-category", action="store_true", help="also one table per task category")
    fail.set_defaults(func=cmd_failures)
