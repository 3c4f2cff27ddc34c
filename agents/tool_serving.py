"""The policy's REHEARSE role as a stdio MCP server (``envace serve-tools``): a world model any MCP client can call.

An MCP client (an agent, a trainer's tool environment, `benchmarks.mcp.MCPBackend`) lists the served tools and
calls them; every answer is the model's rehearsal of that tool's output, conditioned on the session's history.
Nothing is executed: the calls and the generated text are only ever tokens.

Tools. A suite's tools (``--suite NAME``: every tool of its tasks, first definition of a name wins,
`suite_tools`), or the tools of a real MCP server, copied from one listing of it (``--like CMD``: names,
descriptions and input schemas, `copied_tools`), plus two control tools (`CONTROL_TOOLS`).

Session. One stdio connection is one session (`RehearsedSession`). Its history is an episode of a rehearsing
`envace_gym.envs.rehearse.RehearseEnv` in which each client call is one ACT message holding that call in Hermes
format (``format_tool_calls([call], "hermes")``, the form the suites' demonstrations and prompts use), so the
env builds the rehearsal prompt: a served answer sees exactly the prompt an in-process rehearsal sees after the
same calls (the inline continuation of the token sequence, or the separate simulator prompt), and with greedy
decoding gives the same text. Calls are answered one at a time, in the order they arrive.

Control tools (listed with the others; a client hides them from its model, e.g.
``MCPBackend(cmd, hidden_tools=CONTROL_TOOLS)``, and calls them itself with ``MCPBackend.control``):

* ``envace_start_task``: a fresh history conditioned on a task: ``task_id`` names a task of the suite (its first
  user turn opens the history: for the lab, the system message that lists the shelves and the instruction), or
  ``prompt`` (and optionally ``system``) give the opening as free text. With neither, no task.
* ``envace_reset``: a fresh history with the same task.

Without a task the history opens with one empty system message (a chat template renders no empty conversation),
so the prompt holds the tools and the calls only. Only a task's first user turn is shown: a tool call cannot
tell the server that the client's turn ended.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from envace_gym.parsing import format_tool_calls
from envace_gym.rehearsal import Rehearser
from envace_gym.types import Message, Task, ToolCall, ToolSpec

__all__ = [
    "CONTROL_TOOLS",
    "START_TASK",
    "RESET",
    "ServedTools",
    "suite_tools",
    "copied_tools",
    "RehearsedSession",
    "make_tool_server",
    "serve_stdio",
]

START_TASK = "envace_start_task"
RESET = "envace_reset"
CONTROL_TOOLS = (START_TASK, RESET)
"""The server's own tools, which set the session's task and history (module docstring); never rehearsed."""

_CONTROL_SPECS = [
    ToolSpec(
        name=START_TASK,
        description=(
            "Start a fresh history conditioned on a task: task_id (a task of the served suite), or prompt and "
            "optionally system (free text). Neither: no task."
        ),
        parameters={
            "type": "object",
            "properties": {
                "task_id": {"type": "string", "description": "a task id of the served suite"},
                "prompt": {"type": "string", "description": "the user's instruction, as free text"},
                "system": {"type": "string", "description": "a system message before the prompt"},
            },
        },
    ),
    ToolSpec(
        name=RESET,
        description="Start a fresh history with the same task.",
        parameters={"type": "object", "properties": {}},
    ),
]

_INSTRUCTIONS = (
    "Every tool answer is rehearsed by a world model (envace serve-tools) from the calls so far; nothing is "
    f"executed. {START_TASK} conditions the session on a task, {RESET} clears its history."
)


@dataclass
class ServedTools:
    """What a server offers: the tools, the suite whose envs build the history, and its tasks by id.

    Attributes:
        suite: the suite name the rehearsing env is made with (``"mcp"`` for copied tools).
        tools: the served tools, in listing order.
        suite_options: options of that suite's factory (the ``mcp`` suite's ``server``).
        tasks: task id -> task, the tasks ``envace_start_task`` can name (empty for copied tools).

    Raises:
        ValueError: a tool is named like a control tool, or two tools share a name.
    """

    suite: str
    tools: list[ToolSpec]
    suite_options: dict[str, Any] = field(default_factory=dict)
    tasks: dict[str, Task] = field(default_factory=dict)

    def __post_init__(self) -> None:
        names = [t.name for t in self.tools]
        clash = sorted(set(names) & set(CONTROL_TOOLS))
        if clash:
            raise ValueError(f"the served tools include {clash}, the names of the server's control tools")
        if len(set(names)) != len(names):
            raise ValueError(f"two served tools share a name: {names}")


def suite_tools(suite: str, categories: Sequence[str] | None = None, split: str = "all") -> ServedTools:
    """The tools of `suite`'s tasks in `categories` (None: the suite's default) and `split`, each name once (its
    first definition, in task order), with those tasks by id.

    Raises:
        ValueError: an unknown suite (the message lists the registered ones), category or split, or no task.
    """
    from envace_gym.suites import make_suite

    tasks = make_suite(suite).tasks(list(categories) if categories else None, split)
    if not tasks:
        raise ValueError(f"suite {suite!r} has no task in categories={categories!r} split={split!r}")
    tools: dict[str, ToolSpec] = {}
    for task in tasks:
        for tool in task.tools:
            tools.setdefault(tool.name, tool)
    return ServedTools(suite=suite, tools=list(tools.values()), tasks={t.id: t for t in tasks})


def copied_tools(command: Sequence[str], start_timeout_s: float = 60.0) -> ServedTools:
    """The tools of the real MCP server `command`, from one session that lists them and is then closed
    (`benchmarks.mcp.MCPSuite.server_tools`); the history's env uses the ``mcp`` suite on that command.

    Raises:
        ValueError: an empty command, or the server did not start or list its tools.
    """
    from envace_gym.suites import make_suite

    if not command:
        raise ValueError("--like needs the command line of an MCP server, e.g. --like 'mcp-server-time'")
    options: dict[str, Any] = {"server": list(command), "start_timeout_s": start_timeout_s}
    suite: Any = make_suite("mcp", **options)  # a benchmarks.mcp.MCPSuite
    try:
        tools = suite.server_tools()
    except RuntimeError as err:
        raise ValueError(f"--like: {err}") from None
    return ServedTools(suite="mcp", tools=tools, suite_options=options)


class RehearsedSession:
    """One MCP session's world: its task and its history of calls and rehearsed answers (module docstring).

    Args:
        served: the tools, suite and tasks (`suite_tools`, `copied_tools`).
        rehearser: the REHEARSE role (`agents.policy.PolicyRehearser`), its prompt mode the env's.
        max_new_tokens: cap on each answer's tokens.
        temperature: sampling temperature of the answers; 0 is greedy.
        seed: seeds every fresh history's sampling: the same task and calls give the same answers.
        max_context_tokens: the longest history the rehearser is asked to continue; a call past it is answered
            with an error text (`envace_gym.envs.tool_use.ToolUseEnv`).

    Raises:
        ValueError: a bad number (as `envace_gym.envs.tool_use.ToolUseEnv` raises it).
    """

    def __init__(
        self,
        served: ServedTools,
        rehearser: Rehearser,
        *,
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        seed: int = 0,
        max_context_tokens: int | None = 16_384,
    ) -> None:
        self.served = served
        self.rehearser = rehearser
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.seed = seed
        self.max_context_tokens = max_context_tokens
        self.task = self._free_task(None, None)
        self.env: Any = None
        self.reset()

    @property
    def tools(self) -> list[ToolSpec]:
        """The rehearsed tools, then the control tools: what the server lists."""
        return list(self.served.tools) + list(_CONTROL_SPECS)

    def _free_task(self, prompt: str | None, system: str | None) -> Task:
        if prompt is None and system is None:
            opening, task_id = [Message("system", "")], "no_task"
        else:
            opening = ([Message("system", system)] if system else []) + ([Message("user", prompt)] if prompt else [])
            task_id = "free_text"
        return Task(
            id=task_id,
            suite=self.served.suite,
            turns=[opening],
            tools=list(self.served.tools),
            verifier="none",
            metadata={"category": "served"},
        )

    def reset(self) -> str:
        """A fresh history with the current task; returns what the control tool answers."""
        from envace_gym.envs.rehearse import RehearseEnv

        self.env = RehearseEnv(
            suite=self.served.suite,
            tasks=[self.task],
            rehearser=self.rehearser,
            prompt_mode=self.rehearser.prompt_mode,
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            max_steps_per_turn=sys.maxsize,  # one turn holds every call of the session
            max_context_tokens=self.max_context_tokens,
            **self.served.suite_options,
        )
        self.env.verify = False  # no episode is ever scored here
        self.env.reset(seed=self.seed, options={"task_id": self.task.id})
        return f"fresh history; task: {self.task.id if self.task.id != 'no_task' else 'none'}"

    def start_task(self, task_id: str | None = None, prompt: str | None = None, system: str | None = None) -> str:
        """Condition a fresh history on a suite task (`task_id`) or on free text (`prompt`, `system`); with none
        of them, on no task. Returns what the control tool answers.

        Raises:
            ValueError: `task_id` together with free text, or an id that is not among the served tasks.
        """
        if task_id is not None:
            if prompt is not None or system is not None:
                raise ValueError(f"{START_TASK} takes either task_id or prompt/system, not both")
            if task_id not in self.served.tasks:
                where = (
                    f"the {len(self.served.tasks)} tasks of suite {self.served.suite!r} served here"
                    if self.served.tasks
                    else "no suite task: these tools were copied from a server; give prompt (and system) instead"
                )
                raise ValueError(f"unknown task_id {task_id!r}; {where}")
            self.task = self.served.tasks[task_id]
        else:
            self.task = self._free_task(prompt, system)
        return self.reset()

    def answer(self, name: str, arguments: Mapping[str, Any]) -> str:
        """The rehearsed output of the call ``name(**arguments)`` after the session's history (which then holds
        it). A call of any name is rehearsed: the model answers an unknown tool as it learned to."""
        if self.env.episode_over:  # unreachable with one unbounded turn; kept so a change cannot hang a client
            return f"Error: this session's history has ended; call {RESET} or {START_TASK}"
        action = format_tool_calls([ToolCall(name=name, arguments=dict(arguments))], "hermes")
        *_, info = self.env.step(action)
        return str(info["new_messages"][-1]["content"])

    def handle(self, name: str, arguments: Mapping[str, Any]) -> tuple[str, bool]:
        """The answer to one ``tools/call``: ``(text, is_error)``; control tools are run, any other is rehearsed.
        A control tool's bad arguments give ``(message, True)``; a rehearsed answer is never flagged an error
        (its text is the model's, whatever it says)."""
        if name == START_TASK:
            unknown = sorted(set(arguments) - {"task_id", "prompt", "system"})
            if unknown:
                return f"{START_TASK} takes task_id, prompt and system; got {unknown}", True
            values = {k: v for k, v in arguments.items() if v is not None}
            if not all(isinstance(v, str) for v in values.values()):
                return f"{START_TASK}: task_id, prompt and system must be strings", True
            try:
                return self.start_task(**values), False
            except ValueError as err:
                return str(err), True
        if name == RESET:
            return self.reset(), False
        return self.answer(name, arguments), False


def make_tool_server(session: RehearsedSession, name: str = "envace-serve-tools") -> Any:
    """The low-level MCP ``Server`` (``mcp.server.lowlevel.Server``) that lists ``session.tools`` and answers
    each ``tools/call`` with ``session.handle``, one call at a time (in a worker thread, so the event loop keeps
    serving the protocol while the model generates)."""
    import anyio
    import mcp_types as types
    from mcp.server.lowlevel import Server

    listed = [types.Tool(name=t.name, description=t.description, input_schema=t.parameters) for t in session.tools]
    one_at_a_time = anyio.Lock()

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=listed)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        async with one_at_a_time:
            text, error = await anyio.to_thread.run_sync(session.handle, params.name, dict(params.arguments or {}))
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=error)

    return Server(name, instructions=_INSTRUCTIONS, on_list_tools=list_tools, on_call_tool=call_tool)


def serve_stdio(session: RehearsedSession, name: str = "envace-serve-tools") -> None:
    """Serve `session` over this process's stdin and stdout until the client closes stdin (the SDK points fd 1 at
    stderr meanwhile, so no stray print reaches the protocol stream)."""
    import anyio
    from mcp.server.stdio import stdio_server

    server = make_tool_server(session, name)

    async def run() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(run)
