"""Rollout wall time on BFCL multi-turn: our cached inline rollout vs HF ``model.generate`` re-encoding per call.

Both sides run the same `agents.rollout.collect_rollouts` loop on the same tasks with the same scripted
first call per user turn (`benchmarks.perf.scripted_rollouts.ScriptedFirstCall`), inline prompt mode, ``--new`` new
tokens per segment, ``--turns`` user turns per trajectory, B=``--tasks`` x K=``--k``; only the generation
backend differs:

* ``ours``: `agents.policy.Policy` with its `PrefixKVCache` (each call prefills only new tokens; the K
  identical prompts of a group are prefilled once; last-position logits only).
* ``hf``: a `Policy` with the `agents.engines.registry.HFGenerateEngine`, which left-pads the full contexts and calls
  ``model.generate(do_sample=True, ...)`` (HF's own KV cache inside a call, the whole context re-encoded at
  every call), logprobs from ``output_logits``.

Equal work: by default neither side is given an end-of-message id (`FixedLength`), so both generate exactly
``--new`` tokens per segment (a test checks both engines on it). Samples still differ (different RNG use),
so a segment that parses as a tool call on one side may not on the other, which changes the episode and
the number of segments: 3,072 tokens (48 segments of 64) against 2,688 (42 of 64) were measured, so that
ratio was refused. The wall-time ratio is printed only when the two sides generated within 5% of the same tokens; the
time per generated token always is. Runs alternate ``--rounds`` times in this one process; the ratio is of the medians.

Usage::

    BFCL_PROJECT_ROOT=/tmp/envace_bfcl_root HF_HUB_OFFLINE=1 .venv/bin/python -m benchmarks.perf.rollout_speed \\
        --model smollm2-135m --tasks 2 --k 4 --turns 3 --new 64
    ... -m benchmarks.perf.rollout_speed --model tiny-random          # quick check
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from agents.engines.registry import HFEngine, HFGenerateEngine
from agents.policy import Policy, load_policy
from benchmarks.perf.scripted_rollouts import pick_tasks, scripted_inline_rollouts


class FixedLength:
    """An engine that ignores end-of-message ids, so every generated segment is exactly ``max_new_tokens``
    long on both sides (the same work whatever each side samples); everything else is the wrapped engine's."""

    def __init__(self, engine) -> None:
        self.engine = engine

    def __getattr__(self, name: str):
        return getattr(self.engine, name)

    def generate(self, contexts, *, max_new_tokens, temperature, stop_ids, seeds=None, use_cache=True):
        return self.engine.generate(
            contexts,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            stop_ids=[],
            seeds=seeds,
            use_cache=use_cache,
        )


def run(kind: str, model_name: str, tasks, k: int, turns: int, new: int, seed: int, full_length: bool = True) -> dict:
    base = load_policy(model_name)
    engine = (
        HFEngine(base.model, base.pad_id, kv_cache=True)
        if kind == "ours"
        else HFGenerateEngine(base.model, base.pad_id)
    )
    policy = Policy(base.model, base.tokenizer, engine=FixedLength(engine) if full_length else engine)
    trajs, wall, generated = scripted_inline_rollouts(policy, tasks, k, turns, new, seed)
    return {
        "kind": kind,
        "wall_s": wall,
        "generated_tokens": generated,
        "s_per_token": wall / max(generated, 1),
        "traj_len_mean": sum(len(t.token_ids) for t in trajs) / len(trajs),
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tasks", type=int, default=2)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--natural-length",
        dest="full_length",
        action="store_false",
        help="let segments stop at the end-of-message id (the sides then do different work and no "
        "ratio is printed); default: every generated segment is exactly --new tokens",
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    tasks = pick_tasks(args.tasks)
    load_policy(args.model)  # load once, outside the timings
    res = {"ours": [], "hf": []}
    for r in range(args.rounds):
        for kind in ("ours", "hf") if r % 2 == 0 else ("hf", "ours"):
            out = run(kind, args.model, tasks, args.k, args.turns, args.new, args.seed + r, args.full_length)
            res[kind].append(out)
            print(
                f"round {r} {kind:4s} wall {out['wall_s']:8.2f}s  generated {out['generated_tokens']:6d}  "
                f"s/token {out['s_per_token']:.4f}  traj_len {out['traj_len_mean']:.0f}",
                flush=True,
            )
    wall = {k: statistics.median(x["wall_s"] for x in v) for k, v in res.items()}
    per_tok = {k: statistics.median(x["s_per_token"] for x in v) for k, v in res.items()}
    tokens = {k: statistics.median(x["generated_tokens"] for x in v) for k, v in res.items()}
    gap = abs(tokens["ours"] / max(tokens["hf"], 1) - 1)
    ratios = {"per_token_hf_over_ours": round(per_tok["hf"] / per_tok["ours"], 2)}
    if gap <= 0.05:
        ratios["wall_hf_over_ours"] = round(wall["hf"] / wall["ours"], 2)
    else:
        ratios["wall_hf_over_ours"] = None
        ratios["refused"] = f"generated tokens differ by {gap:.1%} (limit 5%): compare s/token"
    print(
        json.dumps(
            {
                "model": args.model,
                "tasks": [t.id for t in tasks],
                "k": args.k,
                "turns": args.turns,
                "new": args.new,
                "full_length": args.full_length,
                "generated_tokens": tokens,
                "wall_s": wall,
                "ratios": ratios,
            }
        ),
        flush=True,
    )
    return ratios


if __name__ == "__main__":
    main()
