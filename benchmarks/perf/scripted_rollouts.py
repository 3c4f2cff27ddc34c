"""The scripted BFCL multi-turn rollouts the rollout benchmarks share (`benchmarks.perf.rollout_tokens`,
`benchmarks.perf.rollout_speed`, `benchmarks.perf.kv_sharing`): the same tasks, the same scripted first call
of every user turn and the same seeds on every side, so two engines or caches do the same work.

A helper module, not a script: the benchmarks import it instead of importing each other.
"""

from __future__ import annotations

import json
import time
from typing import Any

import gymnasium as gym

import envace_gym  # noqa: F401  (registers the ids)
from agents.policy import Policy, PolicyRehearser
from agents.rollout import collect_rollouts
from benchmarks.bfcl import BFCLSuite
from benchmarks.bfcl.verify import ground_truth_tool_calls

__all__ = ["TURNS", "ScriptedFirstCall", "scripts_for", "pick_tasks", "make_venv", "scripted_inline_rollouts"]

TURNS = 4
"""User turns every picked task has (`pick_tasks`)."""


class ScriptedFirstCall:
    """The model's ACT policy, except that the first ACT of every user turn is the ground-truth call.

    The model still samples every ACT (so its tokens are counted like any call); the scripted text then
    replaces the first sample of each turn (the env tokenises it: plain text, no logprobs).
    """

    def __init__(self, policy: Any, vector_env: Any, scripts: dict[str, list[str]]) -> None:
        self.policy, self.envs, self.scripts = policy, vector_env.envs, scripts
        self._scripted: set[tuple[int, int]] = set()  # (id(trajectory), turn) already scripted

    def act(self, contexts, *, max_new_tokens, temperature, seeds):
        out = self.policy.act(contexts, max_new_tokens=max_new_tokens, temperature=temperature, seeds=seeds)
        for j, ctx in enumerate(contexts):
            env = next(e for e in self.envs if e.trajectory is not None and e.trajectory.token_ids == list(ctx))
            key = (id(env.trajectory), env.turn)
            script = self.scripts.get(env.task.id, [])
            if key not in self._scripted and env.turn < len(script):
                self._scripted.add(key)
                out[j] = script[env.turn]
        return out


def scripts_for(tasks) -> dict[str, list[str]]:
    """Per task: the first ground-truth call of each turn as a ``<tool_call>`` JSON action."""
    out = {}
    for t in tasks:
        calls = ground_truth_tool_calls(t)
        out[t.id] = [
            "<tool_call>" + json.dumps({"name": c[0].name, "arguments": c[0].arguments}) + "</tool_call>"
            if c
            else "OK."
            for c in calls
        ]
    return out


def pick_tasks(n: int) -> list:
    tasks = [t for t in BFCLSuite().tasks(["multi_turn_base"], split="all") if t.num_turns >= TURNS]
    tasks = [t for t in tasks if all(ground_truth_tool_calls(t)[:TURNS])]
    tasks.sort(key=lambda t: len(json.dumps([s.to_openai() for s in t.tools])))  # shortest schemas first
    return tasks[:n]


def make_venv(policy: Policy, prompt_mode: str, n: int, new: int, tasks) -> Any:
    rehearser = PolicyRehearser(policy, prompt_mode=prompt_mode)
    return gym.make_vec(
        "EnvACE-Rehearse-v0",
        num_envs=n,
        vectorization_mode="vector_entry_point",
        suite="bfcl",
        tasks=tasks,
        rehearser=rehearser,
        prompt_mode=prompt_mode,
        max_new_tokens=new,
        temperature=1.0,
        max_steps_per_turn=2,
    )


def scripted_inline_rollouts(policy: Policy, tasks, k: int, turns: int, new: int, seed: int) -> tuple[list, float, int]:
    """K inline rehearsed rollouts of each of `tasks` with `policy`, the first ACT of every user turn
    scripted (`ScriptedFirstCall`), at most ``2 × turns`` messages; returns ``(trajectories, wall seconds,
    generated tokens)`` (tokens of segments with logprobs, i.e. the sampled ones)."""
    venv = make_venv(policy, "inline", len(tasks) * k, new, tasks)
    actor = ScriptedFirstCall(policy, venv, scripts_for(tasks))
    t0 = time.perf_counter()
    trajs, _ = collect_rollouts(
        actor, venv, [t.id for t in tasks], k, max_new_tokens=new, temperature=1.0, seed=seed, max_steps=2 * turns
    )
    wall = time.perf_counter() - t0
    generated = sum(len(s.token_ids) for t in trajs for s in t.segments if s.logprobs is not None)
    return trajs, wall, generated
