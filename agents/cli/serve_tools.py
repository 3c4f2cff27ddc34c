"""``envace serve-tools``: the policy's REHEARSE role as a stdio MCP server (`agents.tool_serving`), a world model that
any MCP client can train or evaluate against::

    envace serve-tools --model runs/sft/checkpoints/step_000600/model --suite lab
    envace serve-tools --model smollm2-135m --like "mcp-server-time"     # copy a real server's tool list

An MCP client starts the command itself (stdio transport); stdout carries the protocol, every message of the
command goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import sys
from typing import Any

__all__ = ["register_serve_tools_parser", "cmd_serve_tools"]


def cmd_serve_tools(args: argparse.Namespace) -> int:
    """``envace serve-tools``: check the options, list the tools (the suite's, or the ``--like`` server's), load
    the model, serve over stdio until the client closes the connection."""
    from agents.tool_serving import RehearsedSession, copied_tools, serve_stdio, suite_tools

    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.temperature < 0:
        raise ValueError(f"--temperature must be >= 0 (0 is greedy), got {args.temperature}")
    if args.max_context_tokens < 1:
        raise ValueError(f"--max-context-tokens must be >= 1, got {args.max_context_tokens}")
    if args.threads < 0:
        raise ValueError(f"--threads must be >= 0 (0: torch's default), got {args.threads}")
    # before the model loads, so that a bad suite or a server that does not start costs no load
    if args.like is not None:
        served = copied_tools(shlex.split(args.like))
    else:
        served = suite_tools(args.suite, args.categories, args.split)
    # stdout is the protocol stream: whatever loading prints goes to stderr
    with contextlib.redirect_stdout(sys.stderr):
        import torch

        from agents.policy import PolicyRehearser, load_policy

        if args.threads:
            torch.set_num_threads(args.threads)
        rehearser = PolicyRehearser(load_policy(args.model, engine=args.engine), prompt_mode=args.prompt_mode)
        session = RehearsedSession(
            served,
            rehearser,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            seed=args.seed,
            max_context_tokens=args.max_context_tokens,
        )
    source = f"like {args.like!r}" if args.like is not None else f"suite {args.suite!r}"
    print(
        f"[serve-tools] {args.model} rehearses {len(served.tools)} tools ({source}) over stdio",
        file=sys.stderr,
        flush=True,
    )
    serve_stdio(session)
    return 0


def register_serve_tools_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``serve-tools`` sub-command to an ``add_subparsers()`` object; returns its parser."""
    p = sub.add_parser(
        "serve-tools",
        help="serve the model's REHEARSE role as a stdio MCP server (a world model any MCP client can call)",
        description=(
            "A stdio MCP server whose tools are answered by the model's rehearsal, conditioned on the session's "
            "history; nothing is executed. Control tools: envace_start_task (task_id, or prompt and system) and "
            "envace_reset."
        ),
    )
    p.add_argument(
        "--model",
        default="smollm2-135m",
        help="model name ('smollm2-135m', 'lab-tiny', 'tiny-random') or a local folder (a checkpoint's model/)",
    )
    tools = p.add_mutually_exclusive_group(required=True)
    tools.add_argument("--suite", help="serve this registered suite's tools; its tasks can be named by id")
    tools.add_argument(
        "--like",
        metavar="CMD",
        help="serve the tools of this real MCP server (its command line, one string), copied from one listing",
    )
    p.add_argument("--categories", nargs="*", default=None, help="suite categories whose tasks are served")
    p.add_argument("--split", default="all", choices=("train", "test", "all"), help="the split whose tasks are served")
    p.add_argument(
        "--prompt-mode",
        default="inline",
        choices=("inline", "separate"),
        help="rehearsal prompt: continue the history's tokens, or a separate simulator prompt",
    )
    p.add_argument("--max-new-tokens", type=int, default=256, help="cap on each answer's tokens")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature of the answers (0: greedy)")
    p.add_argument("--seed", type=int, default=0, help="seed of each fresh history's sampling")
    p.add_argument(
        "--max-context-tokens",
        type=int,
        default=16_384,
        help="the longest history the model continues; later calls get an error answer",
    )
    p.add_argument("--engine", default="hf", help="generation engine of agents.engines.registry")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.set_defaults(func=cmd_serve_tools)
    return p
