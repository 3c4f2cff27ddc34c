"""`RealTools`: answer tool calls with a real backend instead of the policy's rehearsal."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
from gymnasium.utils import RecordConstructorArgs

from envace_gym.responders import RealBackend
from envace_gym.suites import ToolBackend
from envace_gym.types import Task

__all__ = ["RealTools"]


class RealTools(gym.Wrapper, RecordConstructorArgs):
    """Swap rehearsal for a real tool backend (evaluation time); nothing else changes.

    Wrapping a `RehearseEnv` makes every tool call of the following episodes go to a fresh real backend
    built by `backend_factory` (by default the suite's, e.g. an isolated BFCL instance set per episode);
    the observation tokens are then OBSERVATION segments (no loss). Parsing, turns, termination, reward
    and the token bookkeeping stay those of the wrapped env, so the same action sequence yields the
    rehearsed observation without the wrapper and the real one with it. Wrapping a `ToolUseEnv` gives it a
    fresh `RealBackend` of `backend_factory`. The swap (``env.unwrapped.set_responder(RealBackend(backend_factory))``,
    `envace_gym.responders`) takes effect at the next `reset`.

    Examples:
        >>> import gymnasium as gym, envace_gym  # doctest: +SKIP
        >>> env = RealTools(gym.make("EnvACE-Rehearse-v0"))  # doctest: +SKIP

    Args:
        env: an env whose ``unwrapped`` is a `ToolUseEnv` or `RehearseEnv`.
        backend_factory: Task -> ToolBackend; None uses ``env.unwrapped.suite.make_backend``.
        backend: instead of a factory, one backend: each episode gets ``backend.for_task(task)`` when it
            has that method (`benchmarks.mcp.MCPBackend`: a new server session), else this same backend.

    Raises:
        TypeError: the wrapped env is not a tool-use env, `backend_factory` is not callable, or both
            `backend_factory` and `backend` are given.

    Change log:
        * v0.1.0: initial version.
    """

    def __init__(
        self,
        env: gym.Env,
        backend_factory: Callable[[Task], ToolBackend] | None = None,
        backend: ToolBackend | None = None,
    ) -> None:
        RecordConstructorArgs.__init__(self, backend_factory=backend_factory, backend=backend)
        gym.Wrapper.__init__(self, env)
        base: Any = env.unwrapped  # duck-typed: a ToolUseEnv or RehearseEnv (checked below)
        if not callable(getattr(base, "set_responder", None)):
            raise TypeError(f"RealTools wraps a ToolUseEnv or RehearseEnv, got {type(base).__name__}")
        if backend is not None:
            if backend_factory is not None:
                raise TypeError("give backend_factory or backend, not both")
            # a backend that can open a fresh session per episode (MCPBackend.for_task) keeps episodes apart
            for_task = getattr(backend, "for_task", None)
            backend_factory = for_task if callable(for_task) else (lambda task: backend)
        if backend_factory is not None and not callable(backend_factory):
            raise TypeError(f"backend_factory must be callable (Task -> ToolBackend), got {backend_factory!r}")
        base.set_responder(RealBackend(backend_factory))

    def reset(self, **kwargs: Any):
        """Reset the wrapped env (its next episode uses the real backend)."""
        return self.env.reset(**kwargs)
