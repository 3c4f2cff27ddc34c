"""``EnvACE-LabHiddenDiscrete-v0``: the hidden-rules lab world's discrete twin passes Gymnasium's and
stable-baselines3's checks, is solved by the reference program reading only its observations, shows no hidden
value before the output that reveals it, masks no mistake, and trains with sb3-contrib's MaskablePPO."""

from __future__ import annotations

import copy
import dataclasses

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env as gym_check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env

import envace_gym  # noqa: F401
from benchmarks.lab.hidden import shelves_from_prompt, solve
from benchmarks.lab.tasks import HIDDEN_CATEGORIES, ITEMS
from benchmarks.lab.world import DOCKS
from envace_gym.types import ToolCall

TASKS_PER_FAMILY = 8


@pytest.fixture(scope="module")
def env():
    return gym.make("EnvACE-LabHiddenDiscrete-v0", split="test").unwrapped


def _index(env, call: ToolCall) -> int:
    return env.actions.index((call.name, *call.arguments.values()))


def _block(env, obs: np.ndarray, name: str) -> np.ndarray:
    names = [n for n, _ in env.describe()]
    start = sum(w for _, w in env.describe()[: names.index(name)])
    return obs[start : start + env.describe()[names.index(name)][1]]


def _label(env, obs: np.ndarray, k: int) -> str | None:
    """The label the k-th pack returned, read off the observation (None: not packed; "other": not a label)."""
    v = _block(env, obs, f"box {k}")[len(ITEMS) + 1 : len(ITEMS) + 1 + len(env.labels) + 2]
    i = int(v.argmax())
    return None if i == 0 else env.labels[i - 1] if i <= len(env.labels) else "other"


def _free(env, obs: np.ndarray, shelf: str) -> int | None:
    i = int(_block(env, obs, f"shelf {shelf} free").argmax())
    return None if i == 0 else i - 1


def test_the_twin_passes_gymnasium_and_sb3_checks():
    env = gym.make("EnvACE-LabHiddenDiscrete-v0")
    gym_check_env(env.unwrapped, skip_render_check=True)
    sb3_check_env(env.unwrapped)
    twin = env.unwrapped
    assert env.observation_space.shape == (sum(w for _, w in twin.describe()),) == (1388,)
    # every call the world parses: 24 locate, 4 list_shelf, 96 move, 24 pack, 48 labels x 4 docks, then done
    assert env.action_space.n == len(ITEMS) * 6 + 4 + 48 * len(DOCKS) + 1 == 341
    assert ("ship", "C4-3", "west") in twin.actions and twin.actions[-1] == ("done",)
    with pytest.raises(ValueError, match="stated rules"):
        gym.make("EnvACE-LabHiddenDiscrete-v0", suite="lab-stated")


def test_the_reference_program_reading_only_observations_scores_one_on_every_family(env):
    """`benchmarks.lab.hidden.solve` with an ``ask`` that plays the call as an action and reads the answer off the
    next observation (the label of the k-th pack, a shelf's free slots): the observation carries what the
    reference needs, the calls are the reference's, and each scores 1 under the suite's reward."""
    before, made = env.real_calls, 0
    for category in HIDDEN_CATEGORIES:
        for task in [t for t in env.tasks if t.metadata["category"] == category][:TASKS_PER_FAMILY]:
            obs, _ = env.reset(options={"task_id": task.id})
            packs = 0

            def ask(call: ToolCall, env=env, task_id=task.id) -> dict:
                nonlocal obs, packs
                action = _index(env, call)
                assert env.action_masks()[action], (task_id, call)
                obs, reward, terminated, truncated, _ = env.step(action)
                assert reward == 0.0 and not (terminated or truncated) and env.observation_space.contains(obs)
                if call.name == "pack":
                    packs += 1
                    return {"box": _label(env, obs, packs)}
                if call.name == "list_shelf":
                    return {"free": _free(env, obs, call.arguments["shelf"])}
                return {}

            calls = [
                c for turn in solve(category, shelves_from_prompt(task), task.metadata["slots"], ask) for c in turn
            ]
            assert calls == [c for turn in env.suite.ground_truth(task) for c in turn], task.id
            made += len(calls)
            _, reward, terminated, _, info = env.step(env.actions.index(("done",)))
            assert terminated and reward == 1.0, (task.id, info["verifier"])
            assert info["real_calls"] == len(calls)
    assert env.real_calls - before == made


def _hidden_variant(task):
    """The same prompt and instruction over a world whose hidden rules differ (one capacity of 9 for every
    shelf, labels ``box-<n>``): only the hidden values differ."""
    metadata = copy.deepcopy(task.metadata)
    metadata["initial_state"].update(rules="stated", capacity=9)
    return dataclasses.replace(task, id=task.id + "_variant", metadata=metadata)


def test_no_hidden_value_is_observed_before_the_output_that_reveals_it():
    real = gym.make("EnvACE-LabHiddenDiscrete-v0", categories=["full_job"], split="test").unwrapped
    other = gym.make("EnvACE-LabHiddenDiscrete-v0", categories=["full_job"], split="test").unwrapped
    task = real.tasks[0]
    other.tasks = [_hidden_variant(task)]
    assert real.suite.make_backend(task).execute(ToolCall("list_shelf", {"shelf": "A"})) != other.suite.make_backend(
        other.tasks[0]
    ).execute(ToolCall("list_shelf", {"shelf": "A"}))  # the worlds do differ
    a, _ = real.reset(options={"task_id": task.id})
    b, _ = other.reset(options={"task_id": task.id + "_variant"})
    assert np.array_equal(a, b) and np.array_equal(real.action_masks(), other.action_masks())
    assert all(_free(real, a, s) is None for s in real.shelves) and _label(real, a, 1) is None
    slots = task.metadata["slots"]
    shelf_y = next(s for s, items in task.metadata["initial_state"]["shelves"].items() if slots["y"] in items)
    # calls that reveal no hidden value keep the two observations equal
    for call in (ToolCall("locate", {"item": slots["a"]}), ToolCall("locate", {"item": slots["b"]})):
        a, *_ = real.step(_index(real, call))
        b, *_ = other.step(_index(other, call))
        assert np.array_equal(a, b), call
    # list_shelf reveals the free slots (the shelf's contents are the same), pack the label
    look = ToolCall("list_shelf", {"shelf": shelf_y})
    a, *_ = real.step(_index(real, look))
    b, *_ = other.step(_index(other, look))
    assert _free(real, a, shelf_y) != _free(other, b, shelf_y)
    assert np.array_equal(_block(real, a, f"shelf {shelf_y} listed"), _block(other, b, f"shelf {shelf_y} listed"))
    pack = ToolCall("pack", {"item": slots["a"]})
    a, *_ = real.step(_index(real, pack))
    b, *_ = other.step(_index(other, pack))
    assert _label(real, a, 1) in real.labels and _label(other, b, 1) == "other"


def test_masks_hide_absent_items_but_no_mistake(env):
    task = next(
        t for t in env.tasks if t.metadata["category"] == "make_room" and len(env.suite.ground_truth(t)[0]) == 3
    )
    env.reset(options={"task_id": task.id})
    mask = env.action_masks()
    present = {i for items in task.metadata["initial_state"]["shelves"].values() for i in items}
    absent = next(i for i in ITEMS if i not in present)
    assert not mask[env.actions.index(("pack", absent))] and not mask[env.actions.index(("move", absent, "A"))]
    assert all(mask[i] for i, a in enumerate(env.actions) if a[0] in ("list_shelf", "ship", "done"))
    move = env.suite.ground_truth(task)[0][2]  # onto Y's shelf, which is full, without making room first
    assert mask[_index(env, move)]  # allowed: the irreversible mistake to learn to avoid
    obs, *_ = env.step(_index(env, move))
    assert _block(env, obs, "last call failed")[0] == 1.0
    now = _block(env, obs, "item now").reshape(len(ITEMS), -1)
    assert now[ITEMS.index(move.arguments["item"]), -1] == 1.0  # the output said it broke
    _, reward, terminated, _, info = env.step(env.actions.index(("done",)))
    assert terminated and reward == 0.0 and info["verifier"]["broken"] == [move.arguments["item"]]


def test_maskable_ppo_trains_on_the_real_backend_and_its_calls_are_counted():
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.logger import Logger

    env = gym.make("EnvACE-LabHiddenDiscrete-v0", categories=["ship"]).unwrapped
    model = MaskablePPO("MlpPolicy", env, seed=0, n_steps=128, batch_size=64, n_epochs=1, verbose=0)
    model.set_logger(Logger(folder=None, output_formats=[]))  # the default makes an empty folder in the temp dir
    model.learn(256)
    assert 0 < env.real_calls <= 256  # every call the agent made went to a real backend, closings excluded
    obs, _ = env.reset(seed=0)
    action, _ = model.predict(obs, action_masks=env.action_masks(), deterministic=True)
    assert env.action_masks()[int(action)] and np.isfinite(obs).all()
