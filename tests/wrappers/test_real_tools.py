"""RealTools: the same actions get real observations; rehearsal is never used; bad arguments fail fast."""

from __future__ import annotations

import gymnasium as gym
import pytest

import envace_gym  # noqa: F401
import tests.testing_env  # noqa: F401
from envace_gym.types import Role
from tests.testing_env import ScriptedBackend
from wrappers import RealTools

TINY = dict(model="tiny-random", max_new_tokens=8, suite="scripted", categories=None)


class CountingRehearser:
    """Wraps a rehearser and counts calls (RealTools must never call it)."""

    def __init__(self, inner):
        self.inner, self.calls = inner, 0
        self.tokenizer, self.prompt_mode = inner.tokenizer, inner.prompt_mode

    def rehearse(self, requests):
        self.calls += 1
        return self.inner.rehearse(requests)


def test_real_tools_never_rehearses_and_records_observations():
    from agents.policy import make_policy_rehearser

    counting = CountingRehearser(make_policy_rehearser(model="tiny-random"))
    env = RealTools(gym.make("EnvACE-Rehearse-v0", **{**TINY, "rehearser": counting}))
    env.reset(seed=0, options={"task_id": "scripted_0"})
    obs, *_ = env.step("[add(value=2), echo(text='x')]")
    assert counting.calls == 0
    assert obs == '<tool_response>\n{"total": 2}\n</tool_response>\n<tool_response>\n{"text": "x"}\n</tool_response>'
    roles = {s.role for s in env.unwrapped.trajectory.segments}
    assert Role.OBSERVATION in roles and Role.REHEARSE not in roles


def test_custom_backend_factory_and_tool_env():
    env = RealTools(
        gym.make("EnvACE-Tool-v0", suite="scripted", categories=None),
        backend_factory=lambda task: ScriptedBackend(start=100),
    )
    env.reset(seed=0, options={"task_id": "scripted_0"})
    obs, *_ = env.step("[add(value=1)]")
    assert '"total": 101' in obs


def test_bad_arguments_fail_fast():
    with pytest.raises(TypeError, match="ToolUseEnv"):
        RealTools(gym.make("CartPole-v1"))
    with pytest.raises(TypeError, match="callable"):
        RealTools(gym.make("EnvACE-Tool-v0", suite="scripted", categories=None), backend_factory="nope")
