"""``envace pipeline``: the main job (``make demo``): eval, SFT warm start, role-wise GRPO, eval, plots
(`agents.pipeline`); every option is an `agents.pipeline.PipelineConfig` field."""

from __future__ import annotations

import argparse
from typing import Any

from agents.config import add_dataclass_arguments, dataclass_from_args
from agents.pipeline import PipelineConfig, run_pipeline

__all__ = ["register_pipeline_parser", "cmd_pipeline"]


def cmd_pipeline(args: argparse.Namespace) -> int:
    """``envace pipeline``."""
    from agents.training.distributed import refuse_launcher

    refuse_launcher("pipeline")
    run_pipeline(dataclass_from_args(PipelineConfig, args))
    return 0


def register_pipeline_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``pipeline`` sub-command (every option a `PipelineConfig` field)."""
    p = sub.add_parser("pipeline", help="the main job: eval, SFT warm start, role-wise GRPO, eval, plots")
    add_dataclass_arguments(p, PipelineConfig)
    p.set_defaults(func=cmd_pipeline)
    return p
