"""The policy: one Transformers causal LM playing both roles, ACT and REHEARSE (docs/design.md §1).

* `Policy.act(contexts, ...)`: batched ACT generation; returns `GeneratedText` actions that carry their
  token ids and logprobs into `env.step` (token in, token out).
* `PolicyRehearser`: the `envace_gym.rehearsal.Rehearser` interface on the same model, in the ``inline``
  mode (continue the trajectory's own token sequence after the tool-message opener) or the ``separate``
  mode (a dedicated simulator prompt whose completion is its own training row).
* `make_policy_rehearser(model=..., prompt_mode=...)`: the factory `EnvACE-Rehearse-v0` resolves by name;
  `load_policy` memoises policies in a `agents.models.ModelStore`, so every env of a program that asks for
  the same model shares one model and one prefix KV cache.

Model names: ``"smollm2-135m"`` (default), a local Hugging Face folder, or ``"tiny-random"`` (the 2-layer
random model of `agents.models.tiny_random_model`, for tests and quick checks).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import torch

from agents.engines.generation import Generation
from agents.engines.kv_cache import PrefixKVCache
from agents.engines.registry import GenerationEngine, HFEngine, make_engine, resolve_engine
from agents.models import ModelStore, default_store
from envace_gym.rehearsal import PromptMode, RehearseRequest, RehearseResponse, requests_by_setting
from envace_gym.rendering import ChatRenderer
from envace_gym.types import GeneratedText, Message

__all__ = ["Policy", "PolicyRehearser", "make_policy_rehearser", "load_policy", "SIMULATOR_INSTRUCTION"]

SIMULATOR_INSTRUCTION = (
    "You are the tool environment. You receive the tool schemas, the conversation so far and one tool call. "
    "Reply with exactly the output the tool would return for that call (usually JSON), nothing else. "
    "If the call is invalid, reply with the error message the tool would return."
)
"""System prompt of the ``separate`` prompt mode's simulator prompt."""


class Policy:
    """A causal LM with its tokenizer, chat renderer and generation engine.

    Args:
        model: a Transformers causal LM (the object the trainer updates).
        tokenizer: its tokenizer (must have a chat template).
        kv_cache: for the default engine (`agents.engines.registry.HFEngine`): the per-trajectory prefix KV cache
            used by `act` and by inline rehearsal. True (default): a new cache of this policy's engine (a
            `PolicyRehearser` over this policy continues the same entries); False or None: no caching, every
            context is re-encoded in full (the fallback, and the benchmarks' baseline); or a cache object to
            share with another policy. Used by the ``"hf"`` engine only.
        engine: the `agents.engines.registry.GenerationEngine` that samples, or the name of a registered one built over
            `model` (None or ``"hf"``: ``HFEngine(model, pad_id, kv_cache)``; ``"auto"``: see
            `agents.engines.registry.resolve_engine`).

    Attributes:
        renderer: `envace_gym.rendering.ChatRenderer` of the tokenizer; its end-of-message ids stop generation.
        engine: the engine in use.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        kv_cache: PrefixKVCache | bool | None = True,
        engine: GenerationEngine | str | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.renderer = ChatRenderer(tokenizer)
        self.stop_ids = list(self.renderer.stop_token_ids)
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else self.stop_ids[0])
        if isinstance(engine, str):
            engine = resolve_engine(engine, model)
        if engine is None or engine == "hf":
            engine = HFEngine(model, self.pad_id, kv_cache)
        elif isinstance(engine, str):
            engine = make_engine(engine, model, self.pad_id)
        self.engine: GenerationEngine = engine

    @property
    def kv_cache(self) -> PrefixKVCache | None:
        """The engine's prefix KV cache, or None (caching off, or an engine without one)."""
        return getattr(self.engine, "kv_cache", None)

    def generate(
        self,
        contexts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        seeds: Sequence[int | None] | None = None,
        use_cache: bool = True,
    ) -> list[Generation]:
        """Batched sampling from token contexts with the engine (`GenerationEngine.generate`), stopping at
        the renderer's end-of-message ids.

        ``use_cache=False`` bypasses the engine's cache for this call (one-off prompts such as the
        ``separate`` mode's simulator prompts, which no later call extends).
        """
        return self.engine.generate(
            contexts,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            stop_ids=self.stop_ids,
            seeds=seeds,
            use_cache=use_cache,
        )

    def decode(self, token_ids: Sequence[int]) -> str:
        """The text of generated ids, without a trailing end-of-message id."""
        ids = list(token_ids)
        if ids and ids[-1] in self.stop_ids:
            ids = ids[:-1]
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def act(
        self,
        contexts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int = 256,
        temperature: float = 1.0,
        seeds: Sequence[int | None] | None = None,
    ) -> list[GeneratedText]:
        """ACT for every context (each ends with the assistant-message opener); one batched decode.

        Returns:
            One `GeneratedText` per context: the message text, its generated ids `(C,)` and logprobs `(C,)`.
        """
        gens = self.generate(contexts, max_new_tokens=max_new_tokens, temperature=temperature, seeds=seeds)
        return [GeneratedText(self.decode(g.token_ids), g.token_ids, g.logprobs, stopped=g.stopped) for g in gens]


class PolicyRehearser:
    """`envace_gym.rehearsal.Rehearser` backed by a `Policy` (the REHEARSE role of the shared model).

    Args:
        policy: the policy whose model rehearses (the same object the trainer updates: weights are shared).
        prompt_mode: ``"inline"`` or ``"separate"`` (see `envace_gym.rehearsal`).

    Raises:
        ValueError: an unknown prompt mode.
    """

    def __init__(self, policy: Policy, prompt_mode: PromptMode = "inline") -> None:
        if prompt_mode not in ("inline", "separate"):
            raise ValueError(f"prompt_mode must be 'inline' or 'separate', got {prompt_mode!r}")
        self.policy = policy
        self.tokenizer = policy.tokenizer
        self.prompt_mode: PromptMode = prompt_mode

    def simulator_prompt_ids(self, request: RehearseRequest) -> list[int]:
        """The ``separate`` mode's prompt: the simulator instruction with the tool schemas, the history as
        text, and the call; rendered with the chat template and ending with the assistant opener."""
        schemas = json.dumps([t.to_openai()["function"] for t in request.tools], ensure_ascii=False)
        history = "\n".join(f"[{m.role}] {m.content}" for m in request.messages)
        call = json.dumps({"name": request.call.name, "arguments": request.call.arguments}, ensure_ascii=False)
        messages = [
            Message(role="system", content=f"{SIMULATOR_INSTRUCTION}\n\nTools:\n{schemas}"),
            Message(role="user", content=f"Conversation so far:\n{history}\n\nTool call:\n{call}\n\nTool output:"),
        ]
        return self.policy.renderer.prompt_ids(messages, None)

    def rehearse(self, requests: Sequence[RehearseRequest]) -> list[RehearseResponse]:
        """Answer every request with one batched decode per (max_new_tokens, temperature) setting.

        ``inline`` requests continue their trajectory's cached KV (`Policy.kv_cache`); ``separate`` simulator
        prompts are encoded without the cache.

        Raises:
            ValueError: an ``inline`` request without ``context_ids``.
        """
        prompts: list[list[int]] = []
        for r in requests:
            if self.prompt_mode == "inline":
                if not r.context_ids:
                    raise ValueError("inline rehearsal needs the request's context_ids")
                prompts.append(list(r.context_ids))
            else:
                prompts.append(self.simulator_prompt_ids(r))
        out: list[RehearseResponse | None] = [None] * len(requests)
        for (max_new, temperature), idx in requests_by_setting(requests).items():
            gens = self.policy.generate(
                [prompts[i] for i in idx],
                max_new_tokens=max_new,
                temperature=temperature,
                seeds=[requests[i].seed for i in idx],
                use_cache=self.prompt_mode == "inline",
            )
            for i, g in zip(idx, gens):
                out[i] = RehearseResponse(
                    text=self.policy.decode(g.token_ids),
                    token_ids=g.token_ids,
                    logprobs=g.logprobs,
                    prompt_ids=prompts[i] if self.prompt_mode == "separate" else None,
                    stopped=g.stopped,
                )
        return [o for o in out if o is not None]


def load_policy(
    model: str = "smollm2-135m", kv_cache: bool = True, engine: str = "hf", models: ModelStore | None = None
) -> Policy:
    """The `Policy` over a shared model of `models` (None: `agents.models.default_store()`): ``"smollm2-135m"``,
    a local folder or ``"tiny-random"``. The same arguments give the same policy object, engine and cache.

    Args:
        model: the model name or folder.
        kv_cache: for the ``"hf"`` engine, as in `Policy` (True: the policy's prefix cache; False: none).
        engine: a generation engine registered in `agents.engines.registry` (default ``"hf"``).
        models: the store that holds the model and the policy.

    Raises:
        ValueError: an unknown engine; and the errors of `agents.models.load_model` for an unknown name or
            a missing folder.
    """
    store = models or default_store()

    def build() -> Policy:
        return Policy(store.model(model), store.tokenizer(model), kv_cache=kv_cache, engine=engine)

    return store.shared(("policy", model, bool(kv_cache), engine), build)


def make_policy_rehearser(
    model: str = "smollm2-135m",
    prompt_mode: PromptMode = "inline",
    policy: Policy | None = None,
    models: ModelStore | None = None,
) -> PolicyRehearser:
    """The factory registered as rehearser ``"policy"`` (`envace_gym.rehearsal.make_rehearser`): a rehearser over
    `policy`, or over ``load_policy(model, models=models)``."""
    return PolicyRehearser(policy if policy is not None else load_policy(model, models=models), prompt_mode=prompt_mode)
