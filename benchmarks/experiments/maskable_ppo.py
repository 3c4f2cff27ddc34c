"""The model-free baseline on EnvACE-Lab, one seed: sb3-contrib's MaskablePPO on the world's discrete twin
(``EnvACE-LabDiscrete-v0`` for the stated rules, ``EnvACE-LabHiddenDiscrete-v0`` for the hidden rules),
trained on the train split against the real backend and scored on the test split.

A helper module, not a script: `benchmarks.experiments.lab_sb3_baseline` runs it over seeds and
`benchmarks.experiments.lab_ablations` adds it as a row, without importing each other.
"""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np

import envace_gym  # noqa: F401  (registers the ids)

__all__ = ["TWINS", "discrete_twin", "run_seed"]

TWINS = {"stated": "EnvACE-LabDiscrete-v0", "hidden": "EnvACE-LabHiddenDiscrete-v0"}
"""The discrete twin's env id per lab rule set (`benchmarks.lab.tasks.LabConfig.rules`)."""


def discrete_twin(suite: str) -> str | None:
    """The env id of registered suite `suite`'s discrete twin, or None when it has none: not a lab suite, a lab
    variant with more than one user turn (a twin's observation holds the whole instruction from the start, which
    would show a later turn's request before the text policy sees it), a told variant (``lab-told``: the twin's
    observation holds none of the facts its prompt tells, so it would see less than the text policy), or a blind
    one (``lab-blind``: the twin's actions include the looks the blind world refuses)."""
    from envace_gym.suites import make_suite

    config = getattr(make_suite(suite), "config", None)
    rules = getattr(config, "rules", None)
    if getattr(config, "user_turns", 1) != 1 or getattr(config, "told", False) or getattr(config, "blind", False):
        return None
    return TWINS.get(rules) if isinstance(rules, str) else None


def run_seed(
    seed: int, timesteps: int, categories: list[str] | None, limit: int | None = None, suite: str = "lab-stated"
) -> dict:
    """Train one MaskablePPO on the train split of `suite`'s discrete twin and score it on the test tasks:
    every one, or the first `limit` of each category (the tasks ``envace eval --limit`` plays).

    Raises:
        ValueError: `suite` has no discrete twin (`discrete_twin`).
    """
    from sb3_contrib import MaskablePPO

    env_id = discrete_twin(suite)
    if env_id is None:
        raise ValueError(f"suite {suite!r} has no discrete twin (a lab suite has: {TWINS})")
    train = gym.make(env_id, suite=suite, categories=categories, split="train").unwrapped
    test = gym.make(env_id, suite=suite, categories=categories, split="test").unwrapped
    t0 = time.perf_counter()
    from stable_baselines3.common.logger import Logger

    model = MaskablePPO("MlpPolicy", train, seed=seed, n_steps=1024, batch_size=256, verbose=0)
    # SB3's default logger makes an empty SB3-<time> folder in the temp dir on every learn(); nothing is logged
    model.set_logger(Logger(folder=None, output_formats=[]))
    model.learn(timesteps)
    train_s = time.perf_counter() - t0
    wins: dict[str, list[float]] = {}
    for task in test.tasks:
        if limit is not None and len(wins.get(task.metadata["category"], [])) >= limit:
            continue
        obs, _ = test.reset(options={"task_id": task.id})
        done, reward = False, 0.0
        while not done:
            action, _ = model.predict(obs, action_masks=test.action_masks(), deterministic=True)
            obs, reward, terminated, truncated, _ = test.step(int(action))
            done = terminated or truncated
        wins.setdefault(task.metadata["category"], []).append(reward)
    every = [r for rs in wins.values() for r in rs]
    return {
        "seed": seed,
        "test_success": float(np.mean(every)),
        "per_category": {c: float(np.mean(r)) for c, r in wins.items()},
        "train_real_calls": train.real_calls,
        "train_s": train_s,
        "test_tasks": len(every),
    }
