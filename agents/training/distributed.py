"""Data-parallel processes of one training run, as `accelerate launch` (or ``torchrun``) started them.

`DataParallel.from_environment` reads the launcher's environment (``WORLD_SIZE``, ``RANK``, ...). With one
process it is a no-op object, so a plain ``envace train`` imports and starts nothing extra. With several it
wraps an `accelerate.Accelerator`: the process group (NCCL on GPUs; gloo on CPU, where the Accelerator is
built with ``cpu=True`` because Accelerate only starts a CPU process group when told the run is on CPU),
the device of this rank, reductions (`accelerate.utils.reduce`, `accelerate.utils.gather_object`) and the
DistributedDataParallel wrapper (`accelerate.Accelerator.prepare_model`), which all-reduces gradients during
``backward``.

How the trainers use it (`agents.training.trainer`, `agents.training.sft`): rank r plays or trains the r-th contiguous
shard of the global batch (a GRPO group's K trajectories stay on one rank, so the group baselines need no
communication); every loss divides by the count of the whole batch (`agents.grpo.aggregation_count`, summed
over ranks) and is multiplied by the world size before ``backward`` (DDP averages gradients over ranks),
so the all-reduced gradient is the gradient one process would compute on the whole batch (with
``num_minibatches > 1`` each rank shuffles its own rows into the minibatches, so those differ from a single
process's); metrics are computed on what all ranks gathered; rank 0 alone writes the run folder, and every
rank must read it (on several nodes ``run_dir`` is on a shared filesystem).

Sharded weights (FSDP2). An accelerate config with ``distributed_type: FSDP`` and ``fsdp_version: 2``
(``configs/accelerate/fsdp_*.yaml``) makes `wrap` shard the weights, gradients and AdamW state over the ranks
with torch's ``fully_shard`` (each decoder layer, then the whole module), the call Accelerate's own FSDP2 path
makes, here made by the trainer because Accelerate keeps FSDP off CPU process groups and the one code path
must run in CI. The launcher's ``fsdp_*`` keys are read through `accelerate.utils.FullyShardedDataParallelPlugin`.
Generation needs whole weights and ranks decode different numbers of tokens, so rollouts run inside
`gathered`, which all-gathers every layer once and keeps it whole until the block ends; every forward outside
it all-gathers layer by layer, so all ranks run the same number of them (`forwards_needed`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Sequence
from typing import Any, cast

import torch

__all__ = ["DataParallel", "as_float", "fsdp_plugin_from_environment", "refuse_launcher"]


class DataParallel:
    """This process's place among the data-parallel processes of a run.

    Attributes:
        rank: this process's index, 0 .. world_size - 1.
        world_size: number of processes (1: not distributed).
        is_main: True on rank 0 (the one that writes checkpoints, metrics and logs).
        device: where this rank's model lives (`torch.device`).
        accelerator: the `accelerate.Accelerator` when ``world_size > 1``, else None.
        fsdp: the launcher's `accelerate.utils.FullyShardedDataParallelPlugin` when its config asks for FSDP
            (`wrap` then shards the weights), else None.
    """

    def __init__(
        self, accelerator: Any | None = None, device: str | torch.device = "cpu", fsdp: Any | None = None
    ) -> None:
        self.accelerator = accelerator
        self.fsdp = fsdp
        if accelerator is None:
            self.rank, self.world_size, self.device = 0, 1, torch.device(device)
        else:
            self.rank = int(accelerator.process_index)
            self.world_size = int(accelerator.num_processes)
            self.device = torch.device(accelerator.device)
        self.is_main = self.rank == 0

    @classmethod
    def from_environment(cls, device: str = "auto") -> DataParallel:
        """One process unless a launcher set ``WORLD_SIZE > 1``; then an `accelerate.Accelerator`.

        Args:
            device: ``"auto"`` (CUDA when available, else CPU), ``"cpu"``, ``"cuda"`` or ``"cuda:N"``. Under a
                launcher each process takes the GPU of its local rank (``"cpu"`` or no CUDA: CPU processes
                over gloo), whatever index is given.

        Raises:
            ValueError: a CUDA device is asked for where CUDA is not available, or the launcher's FSDP
                settings are ones the trainer does not take (`fsdp_plugin_from_environment`).
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
        fsdp = fsdp_plugin_from_environment()
        return cls(Accelerator(cpu=device == "cpu" or not cuda, kwargs_handlers=handlers), fsdp=fsdp)

    @property
    def distributed(self) -> bool:
        """True when more than one process takes part."""
        return self.world_size > 1

    @property
    def shards_weights(self) -> bool:
        """True when `wrap` shards the weights over the ranks (FSDP2; several processes)."""
        return self.fsdp is not None and self.distributed

    def shard(self, n: int, what: str = "items") -> tuple[int, int]:
        """``(start, stop)`` of this rank's contiguous share of ``n`` items.

        Raises:
            ValueError: ``n`` is not a multiple of the world size (the message names ``what``).
        """
        if n % self.world_size:
            raise ValueError(
                f"{n} {what} do not split evenly over {self.world_size} processes; use a multiple of {self.world_size}"
            )
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
            raise RuntimeError(
                f"the processes disagree on {what}: {values} by rank; every rank must read the same "
                "run folder (on several nodes, put run_dir on a shared filesystem)"
            )

    def barrier(self) -> None:
        """Wait until every rank reaches this point."""
        if self.distributed and self.accelerator is not None:  # (distributed implies an accelerator)
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
        it, all-reduces the sum); a no-op context with one process, and under FSDP, where every backward
        reduce-scatters into the sharded gradients (which accumulate): deferring it would keep whole
        unsharded gradients on every rank, the memory FSDP is there to save."""
        if not self.distributed or self.shards_weights:
            return contextlib.nullcontext()
        ddp: Any = module  # a DDP wrapper (`wrap`): no_sync is not on nn.Module
        return ddp.no_sync()

    def wrap(self, module: torch.nn.Module, example: tuple | None = None) -> torch.nn.Module:
        """``module`` for the backward pass: DDP-wrapped when distributed (gradients all-reduced, averaged over
        ranks, during ``backward``), sharded in place with FSDP2 when the launcher asks for it, else
        ``module`` itself.

        Under FSDP each submodule whose class is named by ``fsdp_transformer_layer_cls_to_wrap`` (default:
        the Transformers models' ``_no_split_modules``, their decoder layers) is sharded, then ``module``
        as the root; one forward of `example` (positional arguments) through it makes FSDP take ``module``
        as the root before generation calls the inner layers directly. Build optimizers after this: the
        parameters become ``DTensor`` shards.

        Raises:
            ValueError: FSDP finds no layer of the named classes in ``module``.
        """
        if not self.distributed or self.accelerator is None:  # (distributed implies an accelerator)
            return module
        if not self.shards_weights:
            return self.accelerator.prepare_model(module)
        from torch.distributed.fsdp import FSDPModule, fully_shard

        fsdp = self.fsdp
        if fsdp is None:  # unreachable: shards_weights implies an FSDP plugin
            raise AssertionError("shards_weights without an FSDP plugin")
        names = set(fsdp.transformer_cls_names_to_wrap or ())
        if not names:
            for m in module.modules():
                names.update(getattr(m, "_no_split_modules", None) or ())
        layers = [m for m in module.modules() if type(m).__name__ in names]
        if not layers:
            raise ValueError(
                f"FSDP found no layer of class {sorted(names)} in {type(module).__name__} to shard; "
                "set fsdp_transformer_layer_cls_to_wrap in the accelerate config"
            )
        options = {"reshard_after_forward": fsdp.reshard_after_forward, "offload_policy": fsdp.cpu_offload}
        for layer in layers:
            fully_shard(layer, **options)
        # the root keeps its weights whole from its forward to its backward, which needs them next (FSDP's
        # choice for a root when left to it: reshard_after_forward=None)
        fully_shard(module, **{**options, "reshard_after_forward": None if options["reshard_after_forward"] else False})
        if example is not None:
            with torch.no_grad():
                module(*example)
            # the root stays whole after a forward: the optimizer must see the shards (`fully_shard` made it an
            # FSDPModule)
            cast(FSDPModule, module).reshard()
        return module

    @contextlib.contextmanager
    def gathered(self, roots: Iterable[torch.nn.Module]):
        """A context in which the FSDP-sharded `roots` (`wrap` results) hold whole weights on every rank, so
        their modules may run any number of forwards, through any inner module, with no collective (a
        rollout: ranks decode different numbers of tokens). It all-gathers each sharded module on entry
        (a collective: every rank enters) and frees the whole copies on exit. A no-op unless
        `shards_weights`."""
        if not self.shards_weights:
            yield
            return
        from torch.distributed.fsdp import FSDPModule

        fsdp = self.fsdp
        if fsdp is None:  # unreachable: shards_weights implies an FSDP plugin
            raise AssertionError("shards_weights without an FSDP plugin")
        roots = list(roots)
        parts = [m for root in roots for m in root.modules() if isinstance(m, FSDPModule)]
        for m in parts:
            m.set_reshard_after_forward(False, recurse=False)
            m.unshard()
        try:
            yield
        finally:
            for m in parts:
                m.reshard()
                if not any(m is root for root in roots):  # a root keeps its weights whole after its forward (`wrap`)
                    m.set_reshard_after_forward(bool(fsdp.reshard_after_forward), recurse=False)
            for root in roots:
                # forget the order in which the block ran the layers: FSDP prefetches the next backward's
                # all-gathers by it, and a rank that ran other layers (or none) here would prefetch others
                cast(FSDPModule, root).reset_iter_state()  # a root is an FSDPModule (`wrap`)

    def forwards_needed(self, n: int) -> int:
        """How many forward passes this rank runs when it has `n` to run: `n`, or under FSDP (where each
        forward and backward all-gathers) the most any rank has, so that every rank joins every collective;
        the extra passes carry no loss."""
        if not self.shards_weights:
            return n
        return max(int(v) for v in self.gather(int(n)))

    def model_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
        """`model`'s whole state dict on the CPU for rank 0 to save: None (take ``model.state_dict()``)
        unless `shards_weights`; then gathered from the shards (a collective: every rank calls it; ranks
        other than 0 get an empty dict)."""
        if not self.shards_weights:
            return None
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        # full_state_dict: plain tensors (the stubs also allow sharded ones)
        state = cast(
            dict[str, torch.Tensor],
            get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)),
        )
        # a tied weight (the LM head sharing the embedding) is gathered once per name: keep the first name only,
        # as a plain model's save_pretrained does
        seen: set[int] = set()
        for name, p in model.named_parameters(remove_duplicate=False):
            if id(p) in seen:
                state.pop(name, None)
            seen.add(id(p))
        return state

    def optimizer_state_dict(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
        """Like `model_state_dict`, for the optimizer of `model`: whole, keyed by parameter name (the form
        `torch.distributed.checkpoint.state_dict.get_optimizer_state_dict` gives), on rank 0."""
        if not self.shards_weights:
            return None
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        return get_optimizer_state_dict(
            model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )


def as_float(value: torch.Tensor) -> float:
    """A scalar tensor as a float; a sharded ``DTensor`` (an FSDP gradient norm) is made whole first."""
    if hasattr(value, "full_tensor"):
        value = value.full_tensor()
    return float(value)


def fsdp_plugin_from_environment() -> Any | None:
    """The launcher's FSDP settings (`accelerate.utils.FullyShardedDataParallelPlugin`, read from the
    ``FSDP_*`` variables ``accelerate launch`` sets), or None when its config does not ask for FSDP.

    Raises:
        ValueError: a setting the trainer does not take: ``fsdp_version`` other than 2, an
            ``fsdp_auto_wrap_policy`` other than ``TRANSFORMER_BASED_WRAP``, accelerate's
            ``fsdp_activation_checkpointing`` (the trainer's ``--memory.gradient-checkpointing`` does it), mixed
            precision (the trainer's ``--dtype`` sets the precision), a state dict type other than
            ``FULL_STATE_DICT``, ``fsdp_cpu_ram_efficient_loading``; or a torch without the FSDP calls used.
    """
    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() != "true":
        return None
    from accelerate.utils import FullyShardedDataParallelPlugin
    from torch.distributed.fsdp import FSDPModule

    if not hasattr(FSDPModule, "reset_iter_state"):
        raise ValueError(
            f"an FSDP accelerate config with torch {torch.__version__}: the trainer's FSDP needs "
            "FSDPModule.reset_iter_state (torch 2.13 is the tested version); use a DDP config"
        )
    if os.environ.get("ACCELERATE_MIXED_PRECISION", "no") != "no":
        raise ValueError(
            f"mixed_precision {os.environ['ACCELERATE_MIXED_PRECISION']} in an FSDP accelerate config: "
            "set mixed_precision 'no' and choose the weights' dtype with --dtype"
        )
    if os.environ.get("FSDP_STATE_DICT_TYPE", "FULL_STATE_DICT").upper() != "FULL_STATE_DICT":
        raise ValueError(
            f"fsdp_state_dict_type {os.environ['FSDP_STATE_DICT_TYPE']} in the accelerate config: "
            "checkpoints hold whole tensors, gathered on rank 0; set fsdp_state_dict_type: FULL_STATE_DICT"
        )
    if os.environ.get("FSDP_CPU_RAM_EFFICIENT_LOADING", "false").lower() == "true":
        raise ValueError(
            "fsdp_cpu_ram_efficient_loading in the accelerate config: every rank loads the model "
            "before it is sharded; set it false"
        )
    plugin = FullyShardedDataParallelPlugin()
    if os.environ.get("FSDP_AUTO_WRAP_POLICY", "TRANSFORMER_BASED_WRAP").upper() != "TRANSFORMER_BASED_WRAP":
        raise ValueError(
            f"fsdp_auto_wrap_policy {os.environ['FSDP_AUTO_WRAP_POLICY']} in the accelerate config: the "
            "trainer shards decoder layer by layer; set fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP"
        )
    if plugin.fsdp_version != 2:
        raise ValueError(
            f"fsdp_version {plugin.fsdp_version} in the accelerate config: the trainer shards with "
            "FSDP2 (torch's fully_shard); set fsdp_version: 2"
        )
    if plugin.activation_checkpointing:
        raise ValueError(
            "fsdp_activation_checkpointing in the accelerate config: the trainer checkpoints the "
            "decoder layers itself (--memory.gradient-checkpointing, on by default); set it false"
        )
    if plugin.mixed_precision_policy is not None:
        raise ValueError(
            "an FSDP mixed-precision policy in the accelerate config: set mixed_precision 'no' and "
            "choose the weights' dtype with --dtype"
        )
    return plugin


def refuse_launcher(command: str) -> None:
    """Raise for a command that runs in one process when a launcher started several.

    Raises:
        ValueError: ``WORLD_SIZE > 1`` (the message names what to launch instead).
    """
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ValueError(
            f"envace {command} runs in one process (every rank would repeat it); launch "
            "`envace train` or `envace sft` with accelerate, and run this command without it"
        )
