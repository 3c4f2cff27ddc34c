"""Sweep every registered EnvACE-* id (Gymnasium's tests/envs/test_envs.py habit): make with the tiny
model, check_env, and two envs with one seed give identical rollouts."""

from __future__ import annotations

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import envace_gym  # noqa: F401

ENVACE_IDS = sorted(i for i in gym.registry if i.startswith("EnvACE-") and "Discrete" not in i)
"""The text-action envs (the lab's discrete twins have their own tests: tests/benchmarks/lab/test_lab_discrete*.py)."""
TINY = {"EnvACE-Rehearse-v0": dict(model="tiny-random", max_new_tokens=8)}
ACTIONS = ["[ls()]", "<tool_call>{bad json</tool_call>", "[cd(folder='document')]", "Done.", ""]


def test_ids_are_registered_with_string_entry_points():
    assert ENVACE_IDS == ["EnvACE-Rehearse-v0", "EnvACE-Tool-v0"]
    for env_id in ENVACE_IDS:
        spec = gym.spec(env_id)
        assert isinstance(spec.entry_point, str) and spec.entry_point.startswith("envace_gym.envs.")
    assert gym.spec("EnvACE-LabDiscrete-v0").entry_point == "benchmarks.lab.discrete:LabDiscreteEnv"
    assert gym.spec("EnvACE-LabHiddenDiscrete-v0").entry_point == "benchmarks.lab.discrete_hidden:LabHiddenDiscreteEnv"
    assert isinstance(gym.spec("EnvACE-Rehearse-v0").vector_entry_point, str)


def test_tool_env_makes_with_no_kwargs():
    env = gym.make("EnvACE-Tool-v0")
    obs, info = env.reset(seed=0)
    assert info["task_id"].startswith("multi_turn_base_") and obs


def test_another_suite_needs_only_its_name():
    """The ids default to the suite's own categories, not BFCL's: every lab family, train split."""
    from benchmarks.lab.hidden import HIDDEN_CATEGORIES as CATEGORIES

    env = gym.make("EnvACE-Tool-v0", suite="lab")
    assert {t.metadata["category"] for t in env.unwrapped.tasks} == set(CATEGORIES)
    assert len(env.unwrapped.tasks) == 6 * 2000
    obs, info = env.reset(seed=0)
    assert env.unwrapped.task.metadata["category"] in CATEGORIES and info["task_id"] == env.unwrapped.task.id and obs
    rehearse = gym.make("EnvACE-Rehearse-v0", suite="lab", model="tiny-random")
    assert [t.id for t in rehearse.unwrapped.tasks] == [t.id for t in env.unwrapped.tasks]


@pytest.mark.parametrize("env_id", ENVACE_IDS)
def test_check_env(env_id):
    env = gym.make(env_id, **TINY.get(env_id, {}))
    check_env(env.unwrapped, skip_render_check=True)


@pytest.mark.parametrize("env_id", ENVACE_IDS)
def test_same_seed_same_rollout(env_id):
    def rollout():
        env = gym.make(env_id, **TINY.get(env_id, {}))
        obs, info = env.reset(seed=123)
        out = [obs, info["task_id"]]
        for a in ACTIONS:
            obs, r, term, trunc, info = env.step(a)
            out.append((obs, r, term, trunc))
            if term or trunc:
                break
        return out

    assert rollout() == rollout()


@pytest.mark.slow
def test_rehearse_env_makes_with_no_kwargs_on_smollm2():
    """`gym.make("EnvACE-Rehearse-v0")` with no arguments: BFCL multi_turn_base train split, SmolLM2-135M."""
    env = gym.make("EnvACE-Rehearse-v0")
    obs, info = env.reset(seed=0)
    base = env.unwrapped
    assert base.prompt_mode == "inline" and base.max_new_tokens == 256
    assert info["num_tokens"] > 1000  # a real BFCL prompt with its tool schemas
    base.max_new_tokens = 8
    obs, reward, term, trunc, info = env.step("[ls()]")
    assert len(info["rehearsals"]) == 1 and 0 < len(info["rehearsals"][0].token_ids) <= 8
