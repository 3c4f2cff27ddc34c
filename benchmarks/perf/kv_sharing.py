"""Stored prefix KV with shared prefixes vs whole copies, on B x K multi-turn BFCL rollouts, side by side.

Both sides run the same `agents.rollout.collect_rollouts` loop as `rollout_speed.py` (same tasks, same
scripted first call per user turn, inline prompt mode, the same seeds) with our cached engine; only the
`agents.engines.kv_cache.PrefixKVCache` differs:

* ``shared`` (the default, ``share_prefixes=True``): an entry stores only the KV its parent does not hold,
  so the K trajectories of a group keep one copy of their prompt after the first turn;
* ``whole`` (``share_prefixes=False``): every trajectory's entry holds its whole prefix (K copies).

The two sides sample the same ids (the stored keys and values are the same numbers either way): the script
checks that every trajectory is identical, so the work is equal by construction. It prints, per side, the
stored KV tokens after each generate call (peak and mean over calls, and the peak in MB at the model's
bytes per token), the wall time and the time per generated token; then shared over whole. Sides alternate
``--rounds`` times in this one process; times are medians.

Usage::

    BFCL_PROJECT_ROOT=~/.cache/envace_gym/bfcl HF_HUB_OFFLINE=1 .venv/bin/python -m benchmarks.perf.kv_sharing \
        --model smollm2-135m --tasks 2 --k 4 --turns 4 --new 64
    ... -m benchmarks.perf.kv_sharing --model tiny-random --turns 2 --new 8   # quick check
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from agents.engines.kv_cache import PrefixKVCache
from agents.engines.registry import HFEngine
from agents.policy import Policy, load_policy
from benchmarks.perf.scripted_rollouts import pick_tasks, scripted_inline_rollouts


class StoredTokens:
    """An engine that records its prefix cache's stored tokens after every generate call."""

    def __init__(self, engine: HFEngine) -> None:
        self.engine, self.after_call = engine, []

    def __getattr__(self, name: str):
        return getattr(self.engine, name)

    def generate(self, contexts, **kwargs):
        out = self.engine.generate(contexts, **kwargs)
        self.after_call.append(self.engine.kv_cache.num_tokens)
        return out


def run(side: str, model_name: str, tasks, k: int, turns: int, new: int, seed: int) -> dict:
    base = load_policy(model_name)
    engine = StoredTokens(HFEngine(base.model, base.pad_id, kv_cache=PrefixKVCache(share_prefixes=side == "shared")))
    policy = Policy(base.model, base.tokenizer, engine=engine)
    trajs, wall, generated = scripted_inline_rollouts(policy, tasks, k, turns, new, seed)
    cfg = base.model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    bytes_per_token = 2 * cfg.num_hidden_layers * kv_heads * head_dim * base.model.dtype.itemsize  # keys and values
    stored = engine.after_call
    return {
        "side": side,
        "wall_s": wall,
        "generated_tokens": generated,
        "s_per_token": wall / max(generated, 1),
        "calls": len(stored),
        "stored_peak_tokens": max(stored),
        "stored_mean_tokens": statistics.mean(stored),
        "stored_peak_mb": max(stored) * bytes_per_token / 2**20,
        "trajectories": [t.token_ids for t in trajs],
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tasks", type=int, default=2, help="B")
    ap.add_argument("--k", type=int, default=4, help="K trajectories per task")
    ap.add_argument("--turns", type=int, default=4, help="user turns per trajectory")
    ap.add_argument("--new", type=int, default=64, help="new tokens per generated segment, at most")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    tasks = pick_tasks(args.tasks)
    load_policy(args.model)  # load once, outside the timings
    res = {"shared": [], "whole": []}
    for r in range(args.rounds):
        outs = {}
        for side in ("shared", "whole") if r % 2 == 0 else ("whole", "shared"):
            outs[side] = out = run(side, args.model, tasks, args.k, args.turns, args.new, args.seed + r)
            res[side].append(out)
            print(
                f"round {r} {side:6s} wall {out['wall_s']:8.2f}s  generated {out['generated_tokens']:6d}  "
                f"calls {out['calls']:3d}  stored tokens peak {out['stored_peak_tokens']:7d} "
                f"({out['stored_peak_mb']:.0f} MB) mean {out['stored_mean_tokens']:9.0f}",
                flush=True,
            )
        if outs["shared"]["trajectories"] != outs["whole"]["trajectories"]:
            raise SystemExit("the two sides played different trajectories: the comparison is not of equal work")
    med = {
        side: {
            key: statistics.median(x[key] for x in v)
            for key in ("wall_s", "s_per_token", "stored_peak_tokens", "stored_mean_tokens", "stored_peak_mb")
        }
        for side, v in res.items()
    }
    ratios = {
        f"{key}_shared_over_whole": round(med["shared"][key] / med["whole"][key], 3)
        for key in ("stored_peak_tokens", "stored_mean_tokens", "wall_s")
    }
    summary = {
        "model": args.model,
        "tasks": [t.id for t in tasks],
        "k": args.k,
        "turns": args.turns,
        "new": args.new,
        "generated_tokens": res["shared"][0]["generated_tokens"],
        "median": med,
        "ratios": ratios,
    }
    print(json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    main()
