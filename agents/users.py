"""A local Transformers model as the user of simulated-user suites (τ²): `policy_user_generator`, `use_model_user`.

The user's tokens are never trained: the env renders the user's messages as PROMPT tokens of the policy's
trajectory; the user model's own generation is a separate, untrained call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from envace_gym.types import Message

__all__ = ["policy_user_generator", "use_model_user", "simulated_user"]


def policy_user_generator(
    policy: Any, max_new_tokens: int = 128, temperature: float = 0.0
) -> Callable[[Sequence[Message], int], str]:
    """``(messages, seed) -> reply``: the policy's model answers the chat `messages` as the assistant,
    rendered with its chat template, sampled at `temperature` with `seed`, at most `max_new_tokens` tokens."""

    def generate(messages: Sequence[Message], seed: int) -> str:
        prompt = policy.renderer.prompt_ids(list(messages), None)
        (gen,) = policy.generate(
            [prompt], max_new_tokens=max_new_tokens, temperature=temperature, seeds=[seed], use_cache=False
        )
        return policy.decode(gen.token_ids)

    return generate


@contextlib.contextmanager
def use_model_user(
    suite: Any, policy: Any, seed: int = 0, max_new_tokens: int = 128, temperature: float = 0.0, max_turns: int = 10
) -> Iterator[bool]:
    """Within the block, a suite with a simulated user (one with a ``user_factory``, e.g. τ²) has `policy`'s
    model play the user (`benchmarks.tau2.users.ModelUser`); yields whether it did. Each episode's user is
    seeded by `seed` and the task id, so reruns give the same users; the K rollouts of a GRPO group (one
    task) therefore meet the same user, which at the default temperature 0 (τ²'s) is the same anyway."""
    if not hasattr(suite, "user_factory"):
        yield False
        return
    from benchmarks.tau2.users import ModelUser

    generate = policy_user_generator(policy, max_new_tokens=max_new_tokens, temperature=temperature)
    saved = suite.user_factory
    suite.user_factory = lambda task: ModelUser(
        task.metadata["tau2_task"]["user_scenario"],
        generate,
        seed=seed * 1_000_003 + _stable(task.id),
        max_turns=max_turns,
    )
    try:
        yield True
    finally:
        suite.user_factory = saved


def _stable(text: str) -> int:
    import hashlib

    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little")


@contextlib.contextmanager
def simulated_user(config: Any, policy: Any, models: Any = None) -> Iterator[Any]:
    """`use_model_user` for a config with the ``user_*`` fields (`agents.evaluation.evaluate.EvalConfig`,
    `agents.config.TrainConfig`) on its ``suite``: the user is ``config.user_model`` (loaded with
    ``config.engine`` from `models`) or `policy` itself. Yields the user's policy."""
    from envace_gym.suites import make_suite

    user = policy
    if config.user_model:
        from agents.policy import load_policy

        user = load_policy(config.user_model, engine=config.engine, models=models)
    with use_model_user(
        make_suite(config.suite),
        user,
        seed=config.seed,
        max_new_tokens=config.user_max_new_tokens,
        temperature=config.user_temperature,
        max_turns=config.user_max_turns,
    ):
        yield user
