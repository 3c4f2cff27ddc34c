"""``envace sft``: the supervised warm start of both roles on demonstrations (`agents.training.sft`); every
option is an `agents.training.sft.SFTConfig` field."""

from __future__ import annotations

import argparse
from typing import Any

from agents.config import add_dataclass_arguments, dataclass_from_args
from agents.training.sft import SFTConfig, SFTTrainer

__all__ = ["register_sft_parser", "add_sft_arguments", "sft_config_from_args", "cmd_sft"]


def add_sft_arguments(parser: argparse.ArgumentParser) -> None:
    """``--config FILE`` and one ``--field-name`` option per `SFTConfig` field, its help from the field."""
    add_dataclass_arguments(parser, SFTConfig)


def sft_config_from_args(args: argparse.Namespace) -> SFTConfig:
    """The `SFTConfig` of parsed arguments (``--config`` YAML, then explicit options; unset ones keep defaults).

    Raises:
        ValueError: an unknown YAML field or an invalid value (`SFTConfig.__post_init__`).
    """
    return dataclass_from_args(SFTConfig, args)


def cmd_sft(args: argparse.Namespace) -> int:
    """``envace sft``: build the data, train, save; prints the data counts and the last step's metrics."""
    config = sft_config_from_args(args)  # fails fast, before any model loads
    trainer = SFTTrainer(config)
    if not trainer.parallel.is_main:  # under `accelerate launch`, rank 0 speaks for the run
        trainer.train(progress=False)
        return 0
    if trainer.step:
        print(f"[sft] resumed from step {trainer.step} in {config.run_dir}")
    toks = {r: sum(d.tokens_per_role()[r] for d in trainer.demos) for r in ("ACT", "REHEARSE")}
    print(
        f"[sft] {len(trainer.demos)} sequences ({toks['ACT']} ACT, {toks['REHEARSE']} REHEARSE tokens), "
        f"{trainer.batches_per_epoch} batches/epoch, {trainer.total_steps} steps"
    )
    history = trainer.train()
    if history:
        last = history[-1]
        print(
            f"[sft] step {last['step']}: loss {last['train/loss']:.4f} (act {last['train/loss/act']:.4f}, "
            f"rehearse {last['train/loss/rehearse']:.4f}); metrics in {config.run_dir}/metrics.jsonl"
        )
    return 0


def register_sft_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``sft`` sub-command to an ``add_subparsers()`` object; returns its parser."""
    p = sub.add_parser(
        "sft",
        help="supervised warm-start of ACT and REHEARSE tokens on demonstrations (every option is an SFTConfig field)",
    )
    add_sft_arguments(p)
    p.set_defaults(func=cmd_sft)
    return p
