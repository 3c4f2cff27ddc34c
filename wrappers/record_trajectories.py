"""`RecordTrajectories`: write each finished episode as one JSON Lines record."""

from __future__ import annotations

import json
import os
from typing import Any

import gymnasium as gym
from gymnasium.utils import RecordConstructorArgs

__all__ = ["RecordTrajectories"]


class RecordTrajectories(gym.Wrapper, RecordConstructorArgs):
    """Append every finished episode (terminated or truncated) to a JSONL file.

    One record per episode, with the keys ``task_id``, ``messages`` (OpenAI chat dicts), ``roles`` (the
    role name of each token segment, in order; empty for a text-only env), ``tokens_per_role`` (token
    counts keyed PROMPT/ACT/REHEARSE/OBSERVATION/TEMPLATE), ``reward``, ``terminated``, ``truncated``,
    ``num_parse_errors`` and, with ``include_tokens=True``, ``trajectory`` (the full
    `envace_gym.types.Trajectory` dict, token ids and logprobs included, loadable with
    ``Trajectory.from_dict``). The file is flushed after each record, so an interrupted run loses nothing
    already finished. The wrapper also puts the record under ``info["trajectory_record"]`` on the final step.

    Args:
        env: an env whose ``unwrapped`` is a `ToolUseEnv` or `RehearseEnv`.
        path: the JSONL file (parent folders are created; records are appended).
        include_tokens: also store the whole trajectory with token ids and logprobs.

    Raises:
        TypeError: the wrapped env keeps no trajectory.

    Change log:
        * v0.1.0: initial version.
    """

    def __init__(self, env: gym.Env, path: str | os.PathLike[str], include_tokens: bool = False) -> None:
        RecordConstructorArgs.__init__(self, path=str(path), include_tokens=include_tokens)
        gym.Wrapper.__init__(self, env)
        if not hasattr(env.unwrapped, "trajectory"):
            raise TypeError(f"RecordTrajectories wraps a ToolUseEnv or RehearseEnv, got {type(env.unwrapped).__name__}")
        self.path = os.fspath(path)
        self.include_tokens = include_tokens
        parent = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(parent, exist_ok=True)

    def step(self, action: str):
        """Step; on the final step write the episode's record."""
        obs, reward, terminated, truncated, info = self.env.step(action)
        if terminated or truncated:
            record = self._record(info)
            try:
                line = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
            except UnicodeEncodeError:  # a lone surrogate: the ASCII escapes keep it and the file valid
                line = (json.dumps(record) + "\n").encode("ascii")
            with open(self.path, "ab") as f:  # one write of a whole line, then to disk: a kill cuts at most it
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
            info = dict(info, trajectory_record=record)
        return obs, reward, terminated, truncated, info

    def _record(self, info: dict[str, Any]) -> dict[str, Any]:
        base: Any = self.env.unwrapped  # duck-typed: a ToolUseEnv or RehearseEnv (checked in __init__)
        traj = base.trajectory
        record = {
            "task_id": traj.task.id,
            "messages": [m.to_dict() for m in traj.messages],
            "roles": [s.role.name for s in traj.segments],
            "tokens_per_role": traj.tokens_per_role(),
            "reward": traj.reward,
            "terminated": traj.terminated,
            "truncated": traj.truncated,
            "num_parse_errors": info.get("num_parse_errors", 0),
        }
        if self.include_tokens:
            record["trajectory"] = traj.to_dict()
        return record
