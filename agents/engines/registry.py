"""Generation engines: what samples tokens for `agents.policy.Policy` (both roles, ACT and REHEARSE).

An engine takes token ids in and gives sampled ids, their logprobs under the sampling distribution and a
stop reason out (`agents.engines.generation.Generation`); the trainer tells it when the weights changed. Nothing
else in the agents knows how sampling is done, so a faster engine (vLLM, SGLang on a GPU node) is one new
class and one `register_engine` line; the trainer, the rollout and evaluation pick it by name
(``TrainConfig.engine``, ``EvalConfig.engine``) or take a built one (``RoleWiseGRPOTrainer(engine=...)``).

Registered here:

* ``"hf"`` (`HFEngine`, the default): Transformers forward passes in this process (`agents.engines.generation`),
  with the per-trajectory prefix KV cache (`agents.engines.kv_cache.PrefixKVCache`) that lets multi-turn
  rollouts feed each token once.
* ``"hf-nocache"``: the same without the cache (every context re-encoded in full).
* ``"hf-generate"`` (`HFGenerateEngine`): Transformers' own ``model.generate`` on left-padded full contexts
  (its KV cache lives inside one call, so every call re-encodes the whole context); the rollout benchmarks'
  baseline, and the shape of an engine written against another library.
* ``"auto"`` (the command line's default): ``"vllm"`` where vLLM is installed and the model has at least
  `VLLM_MIN_PARAMETERS` parameters, else ``"hf"`` (`resolve_engine`).
* ``"vllm"`` (`agents.engines.vllm_engine.VLLMEngine`): vLLM in this process (an optional dependency: the
  ``envace-gym[vllm]`` extra, ``make venv-vllm``), token ids in, prefix caching for the cross-turn KV reuse, the
  trained weights pushed after every update; tested against ``"hf"`` on CPU (greedy ids equal, logprobs within
  1e-4 in fp32; docs/guides/engines.md).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import torch

from agents.engines.generation import Generation, generate
from agents.engines.kv_cache import PrefixKVCache
from envace_gym.registry import resolve_entry_point

__all__ = [
    "GenerationEngine",
    "HFEngine",
    "HFGenerateEngine",
    "VLLM_MIN_PARAMETERS",
    "register_engine",
    "make_engine",
    "registered_engines",
    "resolve_engine",
]


@runtime_checkable
class GenerationEngine(Protocol):
    """Batched sampling from token contexts (see the module docstring).

    Attributes:
        weight_version: how many times `weights_updated` was called (0 for fresh weights); a remote engine
            compares it with the trainer's to know when to reload.
    """

    weight_version: int

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
        """One `Generation` per context, in order.

        Args:
            contexts: B token-id sequences, `(B, T_b)` ragged, int.
            max_new_tokens: cap on generated ids per row.
            temperature: sampling temperature; 0 is greedy.
            stop_ids: a row ends after generating any of these (the id is included in its output).
            seeds: per-row sampling seeds (None: unseeded), so a row's sample does not depend on its batch.
            use_cache: False for one-off prompts that no later call extends (a cache would only fill up).
        """
        ...

    def weights_updated(self) -> None:
        """The trained model's weights changed: drop anything computed with the old ones, bump the version."""
        ...


class HFEngine:
    """Transformers sampling in this process (`agents.engines.generation.generate`), with a prefix KV cache.

    Args:
        model: a Transformers causal LM (the trained model itself: weights are shared, not copied).
        pad_id: the id that pads ragged batches.
        kv_cache: True (default): a new `PrefixKVCache` of this engine; False or None: no cache; or a
            `PrefixKVCache` to use (two engines given one cache continue the same entries).
    """

    def __init__(self, model: torch.nn.Module, pad_id: int, kv_cache: PrefixKVCache | bool | None = True) -> None:
        self.model = model
        self.pad_id = int(pad_id)
        if kv_cache is True:
            kv_cache = PrefixKVCache()
        self.kv_cache: PrefixKVCache | None = kv_cache if isinstance(kv_cache, PrefixKVCache) else None
        self.weight_version = 0

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
        """See `GenerationEngine.generate`; ``use_cache=False`` bypasses the prefix cache for this call."""
        return generate(
            self.model,
            contexts,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            stop_ids=list(stop_ids),
            pad_id=self.pad_id,
            seeds=seeds,
            kv_cache=self.kv_cache if use_cache else None,
        )

    def weights_updated(self) -> None:
        """Clear the prefix cache explicitly: `PrefixKVCache.sync` notices most weight changes through
        ``Tensor._version``, but an update that does not bump it (a fused AdamW kernel, ``p.data = ...``)
        would leave keys and values of the old weights, and the next rollout would record logprobs of a
        policy that no longer exists."""
        if self.kv_cache is not None:
            self.kv_cache.clear()
        self.weight_version += 1


class HFGenerateEngine:
    """``model.generate(do_sample=...)`` on the full left-padded contexts; logprobs from ``output_logits``.

    One seed per call (the first row's), so a row's sample depends on its batch, unlike `HFEngine`.

    Args:
        model: a Transformers causal LM.
        pad_id: the id that pads ragged batches.
    """

    def __init__(self, model: torch.nn.Module, pad_id: int) -> None:
        self.model = model
        self.pad_id = int(pad_id)
        self.weight_version = 0

    @torch.no_grad()
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
        """See `GenerationEngine.generate` (``use_cache`` has nothing to bypass here)."""
        stops = list(stop_ids)
        width = max(len(c) for c in contexts)
        ids = torch.full((len(contexts), width), self.pad_id, dtype=torch.long)  # (B, L)
        mask = torch.zeros((len(contexts), width), dtype=torch.long)  # (B, L)
        for i, c in enumerate(contexts):
            ids[i, width - len(c) :] = torch.tensor(list(c))
            mask[i, width - len(c) :] = 1
        if seeds and seeds[0] is not None:
            torch.manual_seed(int(seeds[0]))
        hf_model: Any = self.model  # a Transformers causal LM: generate is not on nn.Module
        out = hf_model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max_new_tokens,
            do_sample=temperature > 0,
            temperature=temperature if temperature > 0 else None,
            top_k=0,
            top_p=1.0,
            eos_token_id=stops,
            pad_token_id=self.pad_id,
            return_dict_in_generate=True,
            output_logits=True,
        )
        new = out.sequences[:, width:]  # (B, C)
        logits = torch.stack(out.logits, dim=1).float()  # (B, C, V)
        lps = (
            torch.log_softmax(logits / (temperature or 1.0), dim=-1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
        )  # (B, C)
        gens = []
        for i in range(len(contexts)):
            row, lp = new[i].tolist(), lps[i].tolist()
            n = next((j + 1 for j, t in enumerate(row) if t in stops), len(row))
            gens.append(Generation(row[:n], lp[:n], bool(row) and row[n - 1] in stops))
        return gens

    def weights_updated(self) -> None:
        """Nothing is cached across calls; only the version moves."""
        self.weight_version += 1


VLLM_MIN_PARAMETERS = 10_000_000
"""The model size from which ``"auto"`` picks vLLM (where installed) over the HF engine. Measured on 2 CPU cores
(`benchmarks.perf.engines_equal_work`, rendered on docs/results.md): on lab-tiny (0.9M parameters) the HF engine's
decode step is faster at B = 8 to 128 (vLLM's fixed cost per step dominates); on SmolLM2-135M, on BFCL prompts and on
the lab vocabulary (smollm2-lab), vLLM's decode step is faster. The threshold lies between the two sizes measured."""


def resolve_engine(name: str, model: torch.nn.Module) -> str:
    """The registered engine `name` stands for over `model`: ``"auto"`` is ``"vllm"`` where vLLM is importable and
    `model` has at least `VLLM_MIN_PARAMETERS` parameters, else ``"hf"``; any other name is itself."""
    if name != "auto":
        return name
    big = sum(p.numel() for p in model.parameters()) >= VLLM_MIN_PARAMETERS
    return "vllm" if big and importlib.util.find_spec("vllm") is not None else "hf"


EngineFactory = Callable[..., GenerationEngine]
_ENGINES: dict[str, str | EngineFactory] = {
    "auto": lambda model, pad_id, **kwargs: make_engine(resolve_engine("auto", model), model, pad_id, **kwargs),
    "hf": HFEngine,
    "hf-nocache": lambda model, pad_id: HFEngine(model, pad_id, kv_cache=False),
    "hf-generate": HFGenerateEngine,
    "vllm": "agents.engines.vllm_engine:make_vllm_engine",  # vLLM is imported only when built
}


def register_engine(name: str, factory: str | EngineFactory) -> None:
    """Register ``factory(model, pad_id) -> GenerationEngine`` under `name` (a ``"module:attr"`` string is
    imported on first use)."""
    _ENGINES[name] = factory


def registered_engines() -> list[str]:
    """Names of every registered engine."""
    return sorted(_ENGINES)


def make_engine(name: str, model: torch.nn.Module, pad_id: int, **kwargs: Any) -> GenerationEngine:
    """Build the engine registered as `name` over `model`.

    Raises:
        ValueError: no engine has that name (the message lists them).
    """
    if name not in _ENGINES:
        raise ValueError(f"unknown generation engine {name!r}; registered: {registered_engines()}")
    return resolve_entry_point(_ENGINES[name])(model, pad_id, **kwargs)
