"""Model tokens processed per 4-turn BFCL multi-turn trajectory: inline + KV cache vs re-encoding vs separate rows.

One run plays the SAME rollouts (same tasks, seeds, scripted actions) three or four ways and counts the tokens
the model is fed (a forward pre-hook on the model: real tokens = the attention-mask ones of the query columns;
``positions`` also counts padding columns):

* ``inline_cached``: inline prompt mode, `agents.engines.kv_cache.PrefixKVCache` on (the default): every ACT and
  REHEARSE call feeds only the tokens its trajectory has not processed yet.
* ``inline_reencode``: inline prompt mode, caching off (``Policy(kv_cache=False)``): every call re-encodes
  its whole context (what a plain ``model.generate`` per turn does).
* ``separate``: the separate-rows layout (ACT row + one simulator prompt per rehearsal); the ACT policy
  uses the cache, simulator prompts are one-off and uncached.
* ``separate_reencode``: separate rows, caching off.

Workload: B tasks of BFCL ``multi_turn_base`` with >= 4 user turns, K samples each, at most 4 turns (the
vector env is capped so that every trajectory plays exactly 4 user turns). Each turn: ACT 1 is scripted
(the task's first ground-truth call of that turn as ``<tool_call>{json}</tool_call>``, replacing the
model's sample, so every turn rehearses), the REHEARSE response is the model's (``--new`` tokens), ACT 2
is the model's own answer (a random model writes no tool call, which ends the turn).

Usage (tiny random model, about a minute on 2 cores)::

    BFCL_PROJECT_ROOT=/tmp/envace_bfcl_root HF_HUB_OFFLINE=1 .venv/bin/python -m benchmarks.perf.rollout_tokens
    ... -m benchmarks.perf.rollout_tokens --tasks 2 --k 4 --new 64 --model tiny-random
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import gymnasium as gym  # noqa: E402
import torch  # noqa: E402

import envace_gym  # noqa: E402,F401
from agents.policy import Policy, PolicyRehearser, load_policy  # noqa: E402
from agents.rollout import collect_rollouts  # noqa: E402
from benchmarks.bfcl import BFCLSuite  # noqa: E402
from benchmarks.bfcl.verify import ground_truth_tool_calls  # noqa: E402

TURNS = 4


class TokenCounter:
    """Forward pre-hook counting the tokens fed to a model: ``real`` (attention mask ones of the query
    columns) and ``positions`` (query columns × rows, padding included), plus the number of forwards."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.real = self.positions = self.forwards = 0
        self._h = model.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            return
        mask = kwargs.get("attention_mask")
        q = ids.shape[1]  # query columns of this forward
        self.positions += ids.numel()
        self.real += int(mask[:, -q:].sum()) if mask is not None else ids.numel()
        self.forwards += 1

    def close(self) -> None:
        self._h.remove()


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


def run_once(model_name: str, prompt_mode: str, cached: bool, tasks, k: int, new: int, seed: int) -> dict:
    """One rollout of B=len(tasks) × K trajectories; returns token counts per trajectory and wall time."""
    base = load_policy(model_name)
    policy = Policy(base.model, base.tokenizer, kv_cache=True if cached else False)
    if policy.kv_cache is not None:
        policy.kv_cache.clear()
    venv = make_venv(policy, prompt_mode, len(tasks) * k, new, tasks)
    actor = ScriptedFirstCall(policy, venv, scripts_for(tasks))
    counter = TokenCounter(policy.model)
    t0 = time.perf_counter()
    try:
        trajs, stats = collect_rollouts(
            actor, venv, [t.id for t in tasks], k, max_new_tokens=new, temperature=1.0, seed=seed, max_steps=2 * TURNS
        )
    finally:
        counter.close()
    wall = time.perf_counter() - t0
    n = len(trajs)
    return {
        "mode": f"{prompt_mode}_{'cached' if cached else 'reencode'}",
        "tokens_per_traj": counter.real / n,
        "positions_per_traj": counter.positions / n,
        "forwards": counter.forwards,
        "traj_len_mean": sum(len(t.token_ids) for t in trajs) / n,
        "wall_s": round(wall, 2),
        "samples": [t.token_ids[-20:] for t in trajs[:1]],
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-random")
    ap.add_argument("--tasks", type=int, default=2)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    tasks = pick_tasks(args.tasks)
    rows = [
        run_once(args.model, "inline", True, tasks, args.k, args.new, args.seed),
        run_once(args.model, "inline", False, tasks, args.k, args.new, args.seed),
        run_once(args.model, "separate", True, tasks, args.k, args.new, args.seed),
        run_once(args.model, "separate", False, tasks, args.k, args.new, args.seed),
    ]
    by = {r["mode"]: r for r in rows}
    for r in rows:
        print(
            f"{r['mode']:20s} tokens/traj {r['tokens_per_traj']:10.1f}  positions/traj {r['positions_per_traj']:10.1f}"
            f"  forwards {r['forwards']:4d}  traj_len {r['traj_len_mean']:8.1f}  wall {r['wall_s']:7.2f}s"
        )
    same = by["inline_cached"]["samples"] == by["inline_reencode"]["samples"]
    ratios = {
        "reencode_over_cached": by["inline_reencode"]["tokens_per_traj"] / by["inline_cached"]["tokens_per_traj"],
        "separate_over_cached": by["separate_cached"]["tokens_per_traj"] / by["inline_cached"]["tokens_per_traj"],
        "separate_reencode_over_cached": by["separate_reencode"]["tokens_per_traj"]
        / by["inline_cached"]["tokens_per_traj"],
        "same_trajectories_cached_vs_reencode": same,
    }
    print(
        json.dumps(
            {
                "tasks": [t.id for t in tasks],
                "k": args.k,
                "new": args.new,
                "model": args.model,
                "ratios": {k: round(v, 2) if isinstance(v, float) else v for k, v in ratios.items()},
            }
        )
    )
    return ratios


if __name__ == "__main__":
    main()
