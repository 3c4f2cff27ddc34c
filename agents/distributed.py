"""Data-parallel processes of one training run, as `accelerate launch` (or ``torchrun``) started them.

`DataParallel.from_environment` reads the launcher's environment (``WORLD_SIZE``, ``RANK``, ...). With one
process it is a no-op object, so a plain ``envace train`` imports and starts nothing extra. With several it
wraps an `accelerate.Accelerator`: the process group (NCCL on GPUs; gloo on CPU, where the Accelerator is
built with ``cpu=True`` because Accelerate only starts a CPU process group when told the run is on CPU),
the device of this rank, reductions (`accelerate.utils.reduce`, `accelerate.utils.gather_object`) and the
DistributedDataParallel wrapper (`accelerate.Accelerator.prepare_model`), which all-reduces gradients during
``backward``.

How the trainers use it (`agents.trainer`, `agents.sft`): rank r plays or trains the r-th contiguous shard of
the global batch (a GRPO group's K trajectories stay on one rank, so the group baselines need no
communication); every loss divides by the count of the whole batch (`agents.grpo.aggregation_count`, summed
over ranks) and is multiplied by the world size before ``backward`` (DDP averages gradients over ranks),
so the all-reduced gradient is the gradient one process would compute on the whole batch (with
``num_minibatches > 1`` each rank shuffles its own rows into the minibatches, so those differ from a single
process's); metrics are computed on what all ranks gathered; rank 0 alone writes the run folder, and every
rank must read it (on several nodes ``run_dir`` is on a shared filesystem).
"""

from __future__ import annotations

import contextlib

import os
from typing import Any, Sequence

import torch

__all__ = ["DataParallel", "refuse_launcher"]


class DataParallel:
    """This process's place among the data-parallel processes of a run.

    Attributes:
        rank: this process's index, 0 .. world_size - 1.
        world_size: number of processes (1: not distributed).
        is_main: True on rank 0 (the one that writes checkpoints, metrics and logs).
        device: where this rank's model lives (`torch.device`).
        accelerator: the `accelerate.Accelerator` when ``world_size > 1``, else None.
    """

    def __init__(self, accelerator: Any | None = None, device: str | torch.device = "cpu") -> None:
        self.accelerator = accelerator
        if accelerator is None:
            self.rank, self.world_size, self.device = 0, 1, torch.device(device)
        else:
            self.rank = int(accelerator.process_index)
            self.world_size = int(accelerator.num_processes)
            self.device = torch.device(accelerator.device)
        self.is_main = self.rank == 0

    @classmethod
    def from_environment(cls, device: str = "auto") -> "DataParallel":
        """One process unless a launcher set ``WORLD_SIZE > 1``; then an `accelerate.Accelerator`.

        Args:
            device: ``"auto"`` (CUDA when available, else CPU), ``"cpu"``, ``"cuda"`` or ``"cuda:N"``. Under a
                launcher each process takes the GPU of its local rank (``"cpu"`` or no CUDA: CPU processes
                over gloo), whatever index is given.

        Raises:
            ValueError: a CUDA device is asked for where CUDA is not available.
        """
        cuda = torch.cuda.is_available()
        if device.startswith("cuda") and not cuda:
            raise ValueError(f"device={device!r} but CUDA is not available here; use device 'auto' or 'cpu'")
        if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
            return cls(device=("cuda" if cuda else "cpu") if device == "auto" else device)
        from datetime import timedelta

        from accelerate import Accelerator
        from accelerate.utils import DistributedDataParallelKwargs, InitProcessGroupKwargs

        handlers = [
            # gradients live in DDP's all-reduce buckets instead of in a second full copy beside them; no buffer
            # broadcast at each forward (the buffers, rotary tables, are the same on every rank), so ranks may run
            # different numbers of accumulation forwards under no_sync without a collective to pair them
            DistributedDataParallelKwargs(gradient_as_bucket_view=True, broadcast_buffers=False),
            # the other ranks wait in a barrier while rank 0 writes a checkpoint (~100 GB at 8B)
            InitProcessGroupKwargs(timeout=timedelta(minutes=60)),
        ]
        return cls(Accelerator(cpu=device == "cpu" or not cuda, kwargs_handlers=handlers))

    @property
    def distributed(self) -> bool:
        """True when more than one process takes part."""
        return self.world_size > 1

    def shard(self, n: int, what: str = "items") -> tuple[int, int]:
        """``(start, stop)`` of this rank's contiguous share of ``n`` items.

        Raises:
            ValueError: ``n`` is not a multiple of the world size (the message names ``what``).
        """
        if n % self.world_size:
            raise ValueError(f"{n} {what} do not split evenly over {self.world_size} processes; "
                             f"use a multiple of {self.world_size}")
        size = n // self.world_size
        return self.rank * size, (self.rank + 1) * size

    def sum(self, values: Sequence[float]) -> list[float]:
        """Element-wise sum of ``values`` over all ranks (float64; every rank gets the result)."""
        if not self.distributed:
            return [float(v) for v in values]
        from accelerate.utils import reduce

        t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.device)
        return [float(v) for v in reduce(t, reduction="sum").cpu()]

    def any(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is True on at least one (a decision all ranks must share)."""
        return self.sum([float(bool(flag))])[0] > 0

    def all(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is True on all of them."""
        return self.sum([float(bool(flag))])[0] == self.world_size

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (picklable), in rank order, on every rank."""
        if not self.distributed:
            return [obj]
        from accelerate.utils import gather_object

        return list(gather_object([obj]))

    def same_everywhere(self, value: Any, what: str) -> None:
        """Check that every rank holds the same ``value`` (picklable).

        Raises:
            RuntimeError: the ranks differ (the message lists each rank's value and names ``what``).
        """
        values = self.gather(value)
        if any(v != values[0] for v in values):
            raise RuntimeError(f"the processes disagree on {what}: {values} by rank; every rank must read the same "
                               "run folder (on several nodes, put run_dir on a shared filesystem)")

    def barrier(self) -> None:
        """Wait until every rank reaches this point."""
        if self.distributed:
            self.accelerator.wait_for_everyone()

    def adamw(self, params, *, shard: bool = False, **kwargs: Any) -> torch.optim.Optimizer:
        """``torch.optim.AdamW(params, **kwargs)``; with ``shard=True`` and several processes,
        `torch.distributed.optim.ZeroRedundancyOptimizer` over AdamW (ZeRO stage 1, Rajbhandari et al., 2020):
        each rank keeps the AdamW state of 1/W of the parameters, updates those and broadcasts them, so the
        optimizer state per rank shrinks W-fold while every rank still holds all weights (which generation
        needs). Before its state is saved, call `consolidate` on every rank."""
        if not (shard and self.distributed):
            return torch.optim.AdamW(params, **kwargs)
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(list(params), optimizer_class=torch.optim.AdamW, **kwargs)

    def consolidate(self, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        """Gather the state of sharded optimizers (`adamw` with ``shard=True``) on rank 0, so that its
        ``state_dict()`` is the whole state (a collective: every rank calls it). Others are left alone."""
        if not self.distributed:
            return
        from torch.distributed.optim import ZeroRedundancyOptimizer

        for opt in optimizers:
            if isinstance(opt, ZeroRedundancyOptimizer):
                opt.consolidate_state_dict(to=0)

    def no_sync(self, module: torch.nn.Module):
        """A context in which backward passes through `module` (a `wrap` result) accumulate gradients on this
        rank only, without DDP's all-reduce (gradient accumulation: the last micro-batch's backward, outside
        it, all-reduces the sum); a no-op context with one process."""
        if not self.distributed:
            return contextlib.nullcontext()
        return module.no_sync()

    def wrap(self, module: torch.nn.Module) -> torch.nn.Module:
        """``module`` for the backward pass: DDP-wrapped when distributed (gradients all-reduced, averaged over
        ranks, during ``backward``), else ``module`` itself. Its parameters are the same tensors."""
        if not self.distributed:
            return module
        return self.accelerator.prepare_model(module)


def refuse_launcher(command: str) -> None:
    """Raise for a command that runs in one process when a launcher started several.

    Raises:
        ValueError: ``WORLD_SIZE > 1`` (the message names what to launch instead).
    """
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ValueError(f"envace {command} runs in one process (every rank would repeat it); launch "
                         "`envace train` or `envace sft` with accelerate, and run this command without it")
