"""``EnvACE-LabDiscrete-v0``: the lab world's discrete twin passes Gymnasium's and stable-baselines3's checks,
scores the reference solutions 1, masks only what cannot be called, and trains with sb3-contrib's MaskablePPO."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env as gym_check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env

import envace_gym  # noqa: F401


def _index(env, call) -> int:
    key = (call.name, *call.arguments.values())
    return env.actions.index(key)


@pytest.fixture(scope="module")
def env():
    return gym.make("EnvACE-LabDiscrete-v0", split="all").unwrapped


def test_the_twin_passes_gymnasium_and_sb3_checks():
    env = gym.make("EnvACE-LabDiscrete-v0")
    gym_check_env(env.unwrapped, skip_render_check=True)
    sb3_check_env(env.unwrapped)
    assert env.observation_space.shape == (sum(w for _, w in env.unwrapped.describe()),)


def test_reference_solutions_score_one_and_real_calls_are_counted(env):
    suite = env.suite
    before = env.real_calls
    made = 0
    for task in env.tasks[::5]:
        obs, _ = env.reset(options={"task_id": task.id})
        for call in (c for turn in suite.ground_truth(task) for c in turn):
            assert env.action_masks()[_index(env, call)]
            obs, reward, terminated, truncated, info = env.step(_index(env, call))
            assert not (terminated or truncated) and reward == 0.0 and env.observation_space.contains(obs)
            made += 1
        answer = task.metadata["answer"]
        close = env.actions.index(("reply", answer) if answer is not None else ("done",))
        _, reward, terminated, _, info = env.step(close)
        assert terminated and reward == 1.0, (task.id, info["verifier"])
    assert env.real_calls - before == made


def test_masks_hide_absent_items_but_not_mistakes(env):
    task = next(t for t in env.suite.tasks(["make_room"], "all") if len(env.suite.ground_truth(t)[0]) == 3)
    env.reset(options={"task_id": task.id})
    mask = env.action_masks()
    present = {i for items in task.metadata["initial_state"]["shelves"].values() for i in items}
    absent = next(i for i in env.actions if i[0] == "pack" and i[1] not in present)
    assert not mask[env.actions.index(absent)] and not mask[env.actions.index(("reply", "0"))]
    move = env.suite.ground_truth(task)[0][2]  # the last reference call, without making room first
    assert mask[_index(env, move)]  # moving onto the full shelf is allowed: it is the mistake to avoid
    obs, *_ = env.step(_index(env, move))
    names = [n for n, _ in env.describe()]
    offset = sum(w for _, w in env.describe()[: names.index("last call failed")])
    assert obs[offset] == 1.0  # the observation shows the failure
    _, reward, terminated, _, info = env.step(env.actions.index(("done",)))
    assert terminated and reward == 0.0 and info["verifier"]["broken"] == [move.arguments["item"]]


def test_maskable_ppo_trains_on_the_real_backend_and_its_calls_are_counted():
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.logger import Logger

    env = gym.make("EnvACE-LabDiscrete-v0", categories=["ship"]).unwrapped
    model = MaskablePPO("MlpPolicy", env, seed=0, n_steps=128, batch_size=64, n_epochs=1, verbose=0)
    model.set_logger(Logger(folder=None, output_formats=[]))  # the default makes an empty folder in the temp dir
    model.learn(256)
    assert 0 < env.real_calls <= 256  # every call the agent made went to a real backend, closings excluded
    obs, _ = env.reset(seed=0)
    action, _ = model.predict(obs, action_masks=env.action_masks(), deterministic=True)
    assert env.action_masks()[int(action)]
    assert np.isfinite(obs).all()
