"""``envace train``: role-wise GRPO over ``EnvACE-Rehearse-v0`` (`agents.training.trainer`); ``--help`` lists
every `agents.config.TrainConfig` field, ``--config FILE.yaml`` loads them, options override the file."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["cmd_train", "register_train_parser"]


def cmd_train(args: argparse.Namespace) -> int:
    """``envace train``: role-wise GRPO (`agents.training.trainer.RoleWiseGRPOTrainer`) with a `TrainConfig`."""
    from agents.config import config_from_args, flat_fields
    from agents.training.trainer import RoleWiseGRPOTrainer

    config = config_from_args(args)  # fails fast, before any model loads
    trainer = RoleWiseGRPOTrainer(config)
    if not trainer.parallel.is_main:  # under `accelerate launch`, rank 0 speaks for the run
        trainer.train(progress=False)
        return 0
    if trainer.step >= config.num_steps:
        print(
            f"[train] {config.run_dir} already holds {trainer.step} of num_steps={config.num_steps} steps; nothing to "
            "do "
            "(raise --num-steps to continue)"
        )
    elif trainer.step:
        print(f"[train] resumed from step {trainer.step} in {config.run_dir}")
    print("[train] " + " ".join(f"{k}={v}" for k, v in flat_fields(config).items()))
    history = trainer.train()
    if history:
        last = history[-1]
        print(
            f"[train] step {last['step']}: reward {last['rollout/reward_mean']:.3f}, loss {last['train/loss']:.4f}, "
            f"{last['perf/step_s']:.1f} s/step; metrics in {config.run_dir}/metrics.jsonl"
        )
    return 0


def register_train_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``train`` sub-command (every option a `agents.config.TrainConfig` field); returns its parser."""
    from agents.config import add_config_arguments

    train = sub.add_parser("train", help="role-wise GRPO on the rehearse envs (every option is a TrainConfig field)")
    add_config_arguments(train)
    train.set_defaults(func=cmd_train)
    return train
