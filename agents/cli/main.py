"""The ``envace`` command line: the parser (`build_parser`) and the console script's entry point (`main`).

Subcommands (each has ``--help``; each lives in its own module of `agents.cli`):

* ``envace pipeline``: the main job (``make demo``): eval, SFT warm start, role-wise GRPO, eval, plots
  (`agents.cli.pipeline`, running `agents.pipeline`).
* ``envace sft``: warm start of both roles on demonstrations from real executions (`agents.cli.sft`, running
  `agents.training.sft`).
* ``envace eval`` / ``envace report``: real-backend evaluation, test-time rehearsal, fidelity, plots
  (`agents.cli.eval`, running `agents.evaluation.evaluate` and `agents.evaluation.plots`).
* ``envace train``: role-wise GRPO over ``EnvACE-Rehearse-v0`` (`agents.cli.train`, running
  `agents.training.trainer`); ``--help`` lists every `agents.config.TrainConfig` field, ``--config FILE.yaml``
  loads them, options override the file.
* ``envace serve``: an OpenAI-compatible chat-completions server over a local model (`agents.cli.serve`, running
  `agents.serving`), e.g. a judge's endpoint.
* ``envace serve-tools``: the model's REHEARSE role as a stdio MCP server, a world model any MCP client can call
  (`agents.cli.serve_tools`, running `agents.tool_serving`).
* ``envace smoke``: a one-turn smoke run of the default model on a real BFCL task (`agents.cli.smoke`).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

__all__ = ["main", "build_parser"]


def _setup_env() -> None:
    """The command line's reading of the process environment.

    ``$ENVACE_CACHE`` (a folder) moves the cache: the default `agents.models.ModelStore` converts and loads
    models under it (`agents.models.default_cache_root`; set again here in case the variable changed after
    import), and bfcl-eval writes under ``$ENVACE_CACHE/bfcl`` (bfcl-eval itself reads ``BFCL_PROJECT_ROOT``
    when it is imported, so that one variable is how it is told).
    """
    from agents.models import ModelStore, default_cache_root, default_store, set_default_store

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if os.environ.get("ENVACE_CACHE"):
        root = default_cache_root()
        os.environ.setdefault("BFCL_PROJECT_ROOT", str(root / "bfcl"))
        if default_store().cache_root != root:
            set_default_store(ModelStore(root))


def build_parser() -> argparse.ArgumentParser:
    """The ``envace`` argument parser (one sub-parser per command)."""
    from agents.config import HintingArgumentParser

    parser = HintingArgumentParser(prog="envace", description="EnvACE: world rehearsal for agentic RL")
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    sub = parser.add_subparsers(dest="command", required=True)
    from agents.cli.eval import add_eval_parsers
    from agents.cli.pipeline import register_pipeline_parser
    from agents.cli.serve import register_serve_parser
    from agents.cli.serve_tools import register_serve_tools_parser
    from agents.cli.sft import register_sft_parser
    from agents.cli.smoke import register_smoke_parser
    from agents.cli.train import register_train_parser

    register_smoke_parser(sub)
    register_train_parser(sub)
    add_eval_parsers(sub)
    register_sft_parser(sub)
    register_pipeline_parser(sub)
    register_serve_parser(sub)
    register_serve_tools_parser(sub)
    return parser


def _user_errors() -> tuple[type[BaseException], ...]:
    """Errors that mean "this input cannot run" (a bad option, an unsolvable budget, a busy or changed run
    folder, a missing file, a config file that is not YAML or gives a key twice): reported in one line, exit
    code 2, like argparse's own errors."""
    from agents.training.checkpoint import CheckpointError
    from agents.training.run_folder import RunFolderError

    return (ValueError, FileNotFoundError, NotADirectoryError, RunFolderError, CheckpointError)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``envace`` console script.

    Returns the exit code: 0 on success, 2 for a bad input (one line on stderr naming what to change; the
    traceback only with ``--debug``), as argparse does for a bad option.
    """
    _setup_env()
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except _user_errors() as err:
        if args.debug:
            raise
        message = str(err)
        prefix = f"envace {args.command}"
        print(message if message.startswith(prefix) else f"{prefix}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
