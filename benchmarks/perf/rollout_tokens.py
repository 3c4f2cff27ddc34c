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
import time

import torch

import envace_gym  # noqa: F401
from agents.policy import Policy, load_policy
from agents.rollout import collect_rollouts
from benchmarks.perf.scripted_rollouts import TURNS, ScriptedFirstCall, make_venv, pick_tasks, scripts_for


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
