"""``envace eval`` (`agents.evaluation.evaluate`: a policy on real backends, optionally with test-time
rehearsal and fidelity) and ``envace report`` (`agents.evaluation.plots`: the plots of a run folder)."""

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

__all__ = ["add_eval_parsers", "cmd_eval", "cmd_report"]


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


def add_eval_parsers(sub: Any) -> None:
    """Add the ``eval`` and ``report`` sub-commands to an argparse sub-parser collection."""
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
