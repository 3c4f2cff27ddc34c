"""What the SFT and GRPO trainers share to set up training: the process (threads, allocator, seed), the
learning-rate schedule, AdamW settings restored from a checkpoint, and length-bucketed batches of rows.

`agents.training.sft.SFTTrainer` and `agents.training.trainer.RoleWiseGRPOTrainer` both import from here, so neither
imports the other.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from agents.training.allocator import release_malloc_mmap_threshold, set_malloc_mmap_threshold

__all__ = ["prepare_process", "make_lr_scheduler", "apply_optimizer_settings", "bucket_batches"]


def make_lr_scheduler(optimizer: torch.optim.Optimizer, schedule: str, warmup_steps: int, total_steps: int):
    """A `LambdaLR`: linear warmup over `warmup_steps`, then constant, linear decay to 0, or cosine to 0."""

    def factor(step: int) -> float:
        if warmup_steps and step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        progress = min(max(progress, 0.0), 1.0)
        if schedule == "linear":
            return 1.0 - progress
        if schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        return 1.0

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def apply_optimizer_settings(
    optimizers: dict[str, torch.optim.Optimizer],
    schedulers: dict[str, Any],
    lr: float,
    weight_decay: float,
    betas: tuple[float, float],
) -> None:
    """Put the config's AdamW settings into optimizers restored from a checkpoint (which carry the old ones, and
    ``run.allow_config_change`` may have changed them); the learning rate follows each schedule at its step."""
    for name, opt in optimizers.items():
        sched = schedulers[name]
        sched.base_lrs = [lr for _ in opt.param_groups]
        for group, factor in zip(opt.param_groups, sched.lr_lambdas):
            group.update(initial_lr=lr, weight_decay=weight_decay, betas=tuple(betas))
            group["lr"] = lr * factor(sched.last_epoch)
        sched._last_lr = [g["lr"] for g in opt.param_groups]


def prepare_process(threads: int, malloc_mmap_threshold_kb: int, seed: int) -> None:
    """Process-wide set-up of a trainer (GRPO and SFT alike), before any model is loaded.

    Sets torch's CPU threads (0: leave the default), glibc's mmap threshold in KiB (0: glibc's dynamic one, or
    where an earlier trainer in this process fixed it, 32 MiB, where the dynamic one settles;
    `agents.training.allocator`) and torch's global seed.
    """
    if threads:
        torch.set_num_threads(threads)
    if malloc_mmap_threshold_kb:
        set_malloc_mmap_threshold(malloc_mmap_threshold_kb * 1024)
    else:
        release_malloc_mmap_threshold()
    torch.manual_seed(seed)


def bucket_batches(
    lengths: Sequence[int], batch_tokens: int, max_rows: int, seed: int, epoch: int, group_by_length: bool = True
) -> list[list[int]]:
    """Length-bucketed batches of example indices (`agents.training.sft`, implementation detail 3), or with
    `group_by_length` False a permutation drawn from ``np.random.default_rng([seed, epoch, 1])`` cut into batches of
    ``min(max_rows, max(1, batch_tokens // max(lengths)))`` rows (the last may be shorter): the same count
    every epoch, and each batch a mix of lengths.

    Args:
        lengths: ``(E,)`` sequence lengths in tokens.
        batch_tokens: budget of padded tokens per batch (rows x the batch's longest length).
        max_rows: cap on rows per batch.
        seed, epoch: bucketed, the batch order is a permutation drawn from ``np.random.default_rng([seed,
            epoch])``; shuffled, the examples' order is (above).
        group_by_length: True: length buckets; False: shuffled batches of one row count.

    Returns:
        The batches: lists of indices into `lengths`; every index appears once. Bucketed, each batch is sorted
        by length and the partition does not depend on (seed, epoch), only the order of the batches does;
        shuffled, both do.

    Raises:
        ValueError: ``batch_tokens < 1`` or ``max_rows < 1``.
    """
    if batch_tokens < 1 or max_rows < 1:
        raise ValueError(f"batch_tokens and max_rows must be >= 1, got {batch_tokens}, {max_rows}")
    if not group_by_length:
        rows = min(max_rows, max(1, batch_tokens // max(lengths, default=1)))
        shuffled = np.random.default_rng([seed, epoch, 1]).permutation(len(lengths)).tolist()
        return [shuffled[i : i + rows] for i in range(0, len(shuffled), rows)]
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    batches: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        if cur and ((len(cur) + 1) * lengths[i] > batch_tokens or len(cur) >= max_rows):
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    perm = np.random.default_rng([seed, epoch]).permutation(len(batches))
    return [batches[j] for j in perm]
