"""``--engine vllm``: generation through vLLM, colocated with training (EXPERIMENTAL: never run here).

vLLM is not installable on the machines this project is built and checked on (CPU only, and the GPU
machines reachable from them cannot take its wheel and its own torch build). This engine is written against
vLLM's documented offline API and has not run. Its tests run only where ``import vllm`` works. Read it as a
starting point, not as a measured engine.

What it does, behind `agents.engines.registry.GenerationEngine`:
- token ids in: one ``TokensPrompt(prompt_token_ids=...)`` per context;
- sampled ids and their logprobs out: ``SamplingParams(logprobs=0)``, the sampled token's logprob, with
  ``logprobs_mode="processed_logprobs"`` so that it is taken after temperature, as the trainer recomputes it;
- one seed per row (``SamplingParams(seed=...)``), stop ids as ``stop_token_ids``;
- the cross-turn KV reuse is vLLM's automatic prefix caching (``enable_prefix_caching=True``): a
  trajectory's next ACT context extends the last one, so its prefix blocks are found in the cache;
- colocated with the trainer: ``gpu_memory_utilization`` leaves the rest of the GPU to training,
  `sleep` / `wake_up` free vLLM's weights and KV cache between rollout and update (``enable_sleep_mode``),
  and `weights_updated` pushes the policy's current weights into vLLM after every optimizer step, through
  ``LLM.apply_model`` and the model's ``load_weights``.

The trainer measures what this engine's logprobs differ from its own recompute (``train/logprob_mismatch``)
and can correct for it with truncated importance sampling (``--importance-sampling-cap``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from agents.engines.generation import Generation

__all__ = ["VLLMEngine", "make_vllm_engine"]


class VLLMEngine:
    """A `agents.engines.registry.GenerationEngine` over an in-process ``vllm.LLM`` (see the module docstring).

    Args:
        model: the trained Transformers model; its ``name_or_path`` folder is what vLLM loads, and its
            parameters are pushed to vLLM by `weights_updated`.
        pad_id: unused (vLLM does not pad); part of the engine factory signature.
        gpu_memory_utilization: the share of the GPU vLLM may take (weights and KV cache).
        dtype: vLLM's weight dtype (``"bfloat16"``; the trainer's weights may stay float32).
        sleep_between_updates: free vLLM's memory around each update (`sleep` after generating is the
            trainer's call; `generate` wakes it).

    Raises:
        ImportError: vLLM is not installed (``pip install vllm`` on a CUDA machine).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        pad_id: int,
        *,
        gpu_memory_utilization: float = 0.3,
        dtype: str = "bfloat16",
        sleep_between_updates: bool = True,
        seed: int = 0,
    ) -> None:
        try:
            from vllm import LLM
        except ImportError as err:  # pragma: no cover - depends on the machine
            raise ImportError(
                "--engine vllm needs vLLM (pip install vllm, on a CUDA machine); it is not a dependency of envace-gym"
            ) from err
        self.model = model
        self.weight_version = 0
        self.sleep_between_updates = sleep_between_updates
        self._asleep = False
        path = getattr(model, "name_or_path", None) or getattr(model.config, "_name_or_path", None)
        if not path:
            raise ValueError("the vLLM engine loads the model from its folder; load it with from_pretrained first")
        self.llm = LLM(
            model=str(path),
            dtype=dtype,
            seed=seed,
            enable_prefix_caching=True,
            gpu_memory_utilization=gpu_memory_utilization,
            enable_sleep_mode=sleep_between_updates,
            logprobs_mode="processed_logprobs",
        )

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
        """One `Generation` per context; see `agents.engines.registry.GenerationEngine.generate`."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        self.wake_up()
        seeds = list(seeds) if seeds is not None else [None] * len(contexts)
        params = [
            SamplingParams(
                max_tokens=max_new_tokens,
                temperature=temperature,
                seed=s,
                logprobs=0,
                stop_token_ids=list(stop_ids),
                skip_special_tokens=False,
                detokenize=False,
            )
            for s in seeds
        ]
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(c)) for c in contexts], params, use_tqdm=False)
        gens = []
        for out in outputs:
            sample = out.outputs[0]
            ids = list(sample.token_ids)
            logprobs = [float(step[token].logprob) for step, token in zip(sample.logprobs or [], ids)]
            gens.append(Generation(token_ids=ids, logprobs=logprobs, stopped=bool(ids) and ids[-1] in set(stop_ids)))
        return gens

    def weights_updated(self) -> None:
        """Push the trained model's current parameters into vLLM (after every optimizer step)."""
        self.wake_up()
        weights = [(name, p.detach()) for name, p in self.model.named_parameters()]
        self.llm.apply_model(lambda vllm_model: vllm_model.load_weights(weights))
        self.llm.reset_prefix_cache()  # cached KV was computed with the old weights
        self.weight_version += 1

    def sleep(self) -> None:
        """Free vLLM's weights and KV cache for the update (level 1 keeps the weights in CPU memory)."""
        if self.sleep_between_updates and not self._asleep:
            self.llm.sleep(level=1)
            self._asleep = True

    def wake_up(self) -> None:
        """Reload what `sleep` freed."""
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False


def make_vllm_engine(model: torch.nn.Module, pad_id: int, **kwargs: Any) -> VLLMEngine:
    """The ``"vllm"`` engine factory (`agents.engines.registry.register_engine`)."""
    return VLLMEngine(model, pad_id, **kwargs)
