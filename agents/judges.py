"""The model side of the judge rewards (`envace_gym.judging`): `LocalJudge` and `OpenAIJudge`.

Both are `envace_gym.judging.CachedJudge` subclasses: replies are cached by prompt, and ``stats`` counts prompts,
cache hits and generations (the verdict parsers add parsed and unparseable counts). Both answer greedily by
default, so the same prompt gets the same verdict and the cache changes no reward.

* `LocalJudge`: a model of the model store (`agents.models`: ``smollm2-135m``, ``lab-tiny``, ``tiny-random`` or a
  local folder) on our generation engines (`agents.policy.Policy.generate`), batched.
* `OpenAIJudge`: any OpenAI-compatible chat-completions endpoint (vLLM, SGLang, a hosted API, ``envace serve``)
  through the official ``openai`` client. Chosen over hand-written HTTP because the client already implements what
  a reward path needs and is maintained with the API: per-request timeouts, retries with exponential backoff on
  connection errors, timeouts, 408, 409, 429 and 5xx answers, and typed responses.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from envace_gym.judging import CachedJudge, JudgeError
from envace_gym.types import Message

__all__ = ["LocalJudge", "OpenAIJudge"]


class LocalJudge(CachedJudge):
    """A judge played by a local model (`agents.policy.load_policy`: the model store and its engines).

    Args:
        model: a model name of `agents.models` or a local folder.
        models: the `agents.models.ModelStore` that loads it (None: the default store). Models are shared within
            a store: a judge named like the policy being trained reads the trained weights as they change; give
            the judge its own store (or a saved folder) to keep it fixed.
        engine: a generation engine of `agents.engines.registry` (default ``"hf"``).
        max_new_tokens: cap per reply, tokens.
        temperature: 0 (default) is greedy.
        batch_size: prompts per batched decode.
        cache_size: replies kept in the prompt cache.
        policy: an already loaded `agents.policy.Policy` to use instead of loading `model`.
        reply_prefix: text the judge's reply is made to start with (appended after the assistant opener, then
            continued by the model; the reply returned includes it). ``'{"answer":'`` leaves a small model only
            ``true`` or ``false`` to write: SmolLM2-135M answers the checklist prompt in free prose without it
            (every verdict unparseable) and with it in 2-3 tokens. Empty (default): the model writes the whole reply.

    Raises:
        ValueError: ``max_new_tokens`` or ``batch_size`` below 1, a negative temperature, and the errors of
            `agents.models.load_model` for an unknown model.
    """

    def __init__(
        self,
        model: str = "smollm2-135m",
        *,
        models: Any = None,
        engine: str = "hf",
        max_new_tokens: int = 64,
        temperature: float = 0.0,
        batch_size: int = 8,
        cache_size: int = 100_000,
        policy: Any = None,
        reply_prefix: str = "",
    ) -> None:
        super().__init__(cache_size)
        if max_new_tokens < 1 or batch_size < 1:
            raise ValueError(f"max_new_tokens and batch_size must be >= 1, got {max_new_tokens} and {batch_size}")
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature!r}")
        if policy is None:
            from agents.policy import load_policy

            # no prefix cache: judge prompts share little, and cached entries would only hold memory
            policy = load_policy(model, kv_cache=False, engine=engine, models=models)
        self.policy = policy
        self.model = model
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.batch_size = batch_size
        self.reply_prefix = reply_prefix
        self._prefix_ids = self.policy.renderer.content_ids(reply_prefix) if reply_prefix else []

    def __repr__(self) -> str:
        return f"LocalJudge(model={self.model!r}, max_new_tokens={self.max_new_tokens}, prefix={self.reply_prefix!r})"

    def _generate(self, prompts: list[list[Message]]) -> list[str]:
        contexts = [self.policy.renderer.prompt_ids(p, None) + self._prefix_ids for p in prompts]
        out: list[str] = []
        for i in range(0, len(contexts), self.batch_size):
            gens = self.policy.generate(
                contexts[i : i + self.batch_size],
                max_new_tokens=self.max_new_tokens,
                temperature=self.temperature,
                seeds=[0] * len(contexts[i : i + self.batch_size]),
                use_cache=False,
            )
            out += [self.reply_prefix + self.policy.decode(g.token_ids) for g in gens]
        return out


class OpenAIJudge(CachedJudge):
    """A judge behind an OpenAI-compatible chat-completions endpoint, through the official ``openai`` client.

    Args:
        model: the model id the endpoint serves (its ``/v1/models``).
        base_url: the endpoint's API root, e.g. ``http://127.0.0.1:8000/v1`` (``envace serve``, vLLM, SGLang).
        api_key: the key sent as a bearer token; None sends ``"EMPTY"``, which local servers ignore (the library
            reads no environment variable; a hosted API's key is the caller's to pass).
        timeout: seconds per request attempt.
        max_retries: retries after a failed attempt (the client's exponential backoff; connection errors,
            timeouts, 408, 409, 429 and 5xx are retried).
        max_tokens: cap per reply, tokens.
        temperature: 0 (default) is greedy.
        concurrency: requests in flight at once.
        cache_size: replies kept in the prompt cache.

    Raises:
        ValueError: a timeout, ``max_tokens`` or ``concurrency`` below its minimum, a negative ``max_retries``.
    """

    def __init__(
        self,
        model: str,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float = 60.0,
        max_retries: int = 2,
        max_tokens: int = 256,
        temperature: float = 0.0,
        concurrency: int = 4,
        cache_size: int = 100_000,
    ) -> None:
        super().__init__(cache_size)
        if timeout <= 0 or max_tokens < 1 or concurrency < 1 or max_retries < 0:
            raise ValueError(
                f"need timeout > 0, max_tokens >= 1, concurrency >= 1 and max_retries >= 0; got {timeout}, "
                f"{max_tokens}, {concurrency} and {max_retries}"
            )
        import openai

        self.model = model
        self.base_url = base_url
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.concurrency = concurrency
        self.client = openai.OpenAI(
            base_url=base_url, api_key=api_key or "EMPTY", timeout=timeout, max_retries=max_retries
        )

    def __repr__(self) -> str:
        return f"OpenAIJudge(model={self.model!r}, base_url={self.base_url!r})"

    def _ask(self, prompt: Sequence[Message]) -> str:
        import openai

        messages: Any = [{"role": m.role, "content": m.content} for m in prompt]
        try:
            response = self.client.chat.completions.create(
                model=self.model, messages=messages, max_tokens=self.max_tokens, temperature=self.temperature
            )
        except openai.APIError as err:  # after the client's retries: the endpoint is down or refuses the request
            raise JudgeError(f"judge {self.model!r} at {self.base_url}: {type(err).__name__}: {err}") from err
        if not response.choices:
            return ""  # a reply without a choice reads as unparseable, like an empty one
        return response.choices[0].message.content or ""

    def _generate(self, prompts: list[list[Message]]) -> list[str]:
        if len(prompts) == 1 or self.concurrency == 1:
            return [self._ask(p) for p in prompts]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(prompts))) as pool:
            return list(pool.map(self._ask, prompts))
