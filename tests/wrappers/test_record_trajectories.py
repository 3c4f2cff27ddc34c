"""RecordTrajectories: one JSONL record per finished episode, loadable back into a Trajectory."""

from __future__ import annotations

import json

import gymnasium as gym

import envace_gym  # noqa: F401
import tests.testing_env  # noqa: F401
from envace_gym.types import Trajectory
from wrappers import RecordTrajectories


def test_records_each_finished_episode(tmp_path):
    path = tmp_path / "sub" / "traj.jsonl"
    env = RecordTrajectories(
        gym.make("EnvACE-Rehearse-v0", model="tiny-random", max_new_tokens=6, suite="scripted", categories=None),
        path,
        include_tokens=True,
    )
    for task_id, actions in [("scripted_0", ["[add(value=2)]", "done"]), ("scripted_0", ["[add(value=5)]", "done"])]:
        env.reset(seed=0, options={"task_id": task_id})
        for a in actions:
            *_, info = env.step(a)
    assert "trajectory_record" in info
    lines = path.read_text().splitlines()
    assert len(lines) == 2
    first, second = (json.loads(x) for x in lines)
    assert first["reward"] == 1.0 and second["reward"] == 0.0
    assert first["tokens_per_role"]["ACT"] > 0 and first["tokens_per_role"]["REHEARSE"] > 0
    assert first["roles"][0] == "PROMPT" and first["messages"][1]["content"] == "[add(value=2)]"
    traj = Trajectory.from_dict(first["trajectory"])
    assert len(traj.token_ids) == sum(first["tokens_per_role"].values())


def test_text_env_records_without_tokens_and_the_tool_env_with_real_observations(tmp_path):
    from envace_gym.envs.text import TextToolUseEnv

    for name, env in (
        ("text", TextToolUseEnv(suite="scripted")),
        ("tool", gym.make("EnvACE-Tool-v0", suite="scripted", categories=None)),
    ):
        path = tmp_path / f"{name}.jsonl"
        env = RecordTrajectories(env, path)
        env.reset(seed=0, options={"task_id": "scripted_0"})
        env.step("[add(value=2)]")
        env.step("done")
        record = json.loads(path.read_text())
        assert record["reward"] == 1.0 and "trajectory" not in record
        if name == "text":
            assert record["roles"] == []
        else:  # the token-level env answered by the real backend: tool output is OBSERVATION, nothing rehearsed
            assert "OBSERVATION" in record["roles"] and record["tokens_per_role"]["REHEARSE"] == 0
