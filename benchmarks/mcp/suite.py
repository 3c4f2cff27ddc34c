"""`MCPSuite`: tasks on the tools of any MCP server (the ``mcp`` suite).

    env = gym.make("EnvACE-Tool-v0", suite="mcp", server=["mcp-server-time"],
                   tasks=[{"id": "paris", "prompt": "What time is it in Paris?"}])

Each task is a user prompt (one user turn, optionally a system message) with the server's tools, listed
once from a first session; every rollout gets its own server session (`MCPBackend.for_task`). A generic
server defines no reward, so `verify` calls the ``verifier`` given (``(trajectory, backend) ->
VerifierResult``) and without one scores 0 with ``details["note"]`` saying so.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from benchmarks.mcp.backend import MCPBackend
from envace_gym.suites import VerifierResult
from envace_gym.types import Message, Task, Trajectory

__all__ = ["MCPSuite"]


class MCPSuite:
    """The ``mcp`` suite (module docstring).

    Args:
        server: the server's command line.
        tasks: task dicts (``id``, ``prompt``, optional ``system``, ``metadata``) or `Task` objects (their
            tools replaced by the server's); every split holds all of them.
        verifier: ``(trajectory, backend) -> VerifierResult``; None scores every episode 0.
        **backend_options: `MCPBackend` options (``call_timeout_s``, ``hidden_tools``, ``local_tools``, ...).

    Raises:
        ValueError: a task dict without ``id`` or ``prompt``, or two tasks with one id.
    """

    name = "mcp"

    def __init__(
        self,
        server: Sequence[str],
        tasks: Sequence[Mapping[str, Any] | Task] = (),
        verifier: Callable[[Trajectory, Any], VerifierResult] | None = None,
        **backend_options: Any,
    ) -> None:
        self.backend = MCPBackend(server, **backend_options)
        self.verifier = verifier
        self._given = list(tasks)
        self._tasks: list[Task] | None = None
        self._tools: list | None = None

    def server_tools(self) -> list:
        """The server's tools (listed once, from a session that is then closed; rollouts get their own)."""
        if self._tools is None:
            self._tools = self.backend.tools()
            self.backend.close()
        return list(self._tools)

    def make_task(self, item: Mapping[str, Any] | Task) -> Task:
        """A task on the server's tools from a dict (``id``, ``prompt``, optional ``system``, ``metadata``)
        or a `Task` (its tools replaced by the server's). The envs call it for task dicts they are given.

        Raises:
            ValueError: a dict without ``id`` or ``prompt``.
        """
        if isinstance(item, Task):
            return Task(
                id=item.id,
                suite=self.name,
                turns=item.turns,
                tools=self.server_tools(),
                verifier=item.verifier,
                metadata=dict(item.metadata),
            )
        if "id" not in item or "prompt" not in item:
            raise ValueError(f"an mcp task needs an 'id' and a 'prompt', got {dict(item)!r}")
        opening = ([Message("system", item["system"])] if item.get("system") else []) + [
            Message("user", item["prompt"])
        ]
        return Task(
            id=str(item["id"]),
            suite=self.name,
            turns=[opening],
            tools=self.server_tools(),
            verifier="mcp.given",
            metadata={"category": "mcp", **dict(item.get("metadata", {}))},
        )

    def _build(self) -> list[Task]:
        if self._tasks is None:
            out = [self.make_task(item) for item in self._given]
            ids = [t.id for t in out]
            if len(set(ids)) != len(ids):
                raise ValueError(f"mcp task ids must be unique, got {ids}")
            self._tasks = out
        return self._tasks

    def tasks(self, categories: Sequence[str] | None = None, split: str = "train") -> list[Task]:
        """Every given task (categories and splits do not divide them)."""
        return list(self._build())

    def make_backend(self, task: Task) -> MCPBackend:
        """A new server session for one rollout."""
        return self.backend.for_task(task)

    def verify(self, trajectory: Trajectory, backend: Any = None) -> VerifierResult:
        """The given verifier's result; without one, 0 (a generic MCP server defines no reward)."""
        if self.verifier is None:
            return VerifierResult(reward=0.0, valid=False, details={"note": "no verifier was given to the mcp suite"})
        return self.verifier(trajectory, backend)
