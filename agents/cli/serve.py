"""``envace serve``: an OpenAI-compatible chat-completions server over a local model (`agents.serving`), e.g. the
endpoint of an `agents.judges.OpenAIJudge`::

    envace serve --model smollm2-135m --port 8000      # then base_url = http://127.0.0.1:8000/v1
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

__all__ = ["register_serve_parser", "cmd_serve"]


def cmd_serve(args: argparse.Namespace) -> int:
    """``envace serve``: load the model, bind, print the base URL, serve until Ctrl-C."""
    from agents.policy import load_policy
    from agents.serving import ChatServer, make_chat_app

    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in 0..65535, got {args.port}")
    if not 1 <= args.default_max_tokens <= args.max_tokens_limit:  # before the model loads
        raise ValueError(
            f"need 1 <= --default-max-tokens <= --max-tokens-limit, got {args.default_max_tokens} and "
            f"{args.max_tokens_limit}"
        )
    name = args.served_model_name or args.model
    policy = load_policy(args.model, kv_cache=False, engine=args.engine)
    app = make_chat_app(
        policy, name, default_max_tokens=args.default_max_tokens, max_tokens_limit=args.max_tokens_limit
    )
    server = ChatServer(app, host=args.host, port=args.port, log_level=args.log_level)
    # the bound port (--port 0 picks one) on one line, so a script that starts the server can read it
    print(f"[serve] {name} at {server.base_url} (POST /chat/completions, GET /models); Ctrl-C stops", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:  # uvicorn shuts down gracefully, then re-raises the Ctrl-C it caught
        pass
    print("[serve] stopped", file=sys.stderr)
    return 0


def register_serve_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``serve`` sub-command to an ``add_subparsers()`` object; returns its parser."""
    p = sub.add_parser("serve", help="serve a local model over an OpenAI-compatible /v1/chat/completions endpoint")
    p.add_argument(
        "--model",
        default="smollm2-135m",
        help="model name ('smollm2-135m', 'lab-tiny', 'tiny-random') or a local folder",
    )
    p.add_argument("--served-model-name", default=None, help="the id clients send as 'model' (default: --model)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    p.add_argument("--port", type=int, default=8000, help="port (0: a free one, printed at start)")
    p.add_argument(
        "--engine",
        default="auto",
        help="generation engine of agents.engines.registry (auto: vllm where installed for models of 10M "
        "parameters or more, else hf)",
    )
    p.add_argument("--default-max-tokens", type=int, default=256, help="completion tokens when a request gives none")
    p.add_argument("--max-tokens-limit", type=int, default=4096, help="the largest max_tokens a request may ask")
    p.add_argument("--log-level", default="warning", choices=("critical", "error", "warning", "info", "debug"))
    p.set_defaults(func=cmd_serve)
    return p
