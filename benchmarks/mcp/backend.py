"""`MCPBackend`: any MCP server as a real tool backend, through the official ``mcp`` SDK (stdio transport).

One backend is one server session: `MCPBackend` launches the server command as a subprocess, performs
MCP's initialize handshake (``mcp.Client(..., mode="legacy")``), lists the server's tools into
`envace_gym.types.ToolSpec` schemas and sends each call as ``tools/call``. Built per rollout (`for_task`,
or ``Suite.make_backend``), it gives every rollout its own server process, hence its own state.

Failure is an observation, never an exception or a hang: a call the server does not answer within
``call_timeout_s``, a server that crashes, exits or never starts, and a result the SDK cannot read all
give an ``"Error: ..."`` text; the server is then stopped, and the next call starts a clean one (the text
says that the server's state is lost). A JSON-RPC error the server answers with (an unknown tool, bad
arguments) is ``"Error: <its message>"`` and keeps the session. A tool result flagged ``isError`` is
returned as ``"Error: <its text>"``.

Local tools (``local_tools``): calls to these names are answered in this process by the given function
and never sent to the server, for tools a server implements in a way this project does not run (the τ²
airline server's ``calculate`` evaluates its argument with Python's ``eval``; `benchmarks.mcp.tau2` maps it
to `benchmarks.tau2.environment.safe_calculate`).

Hidden tools (``hidden_tools``) are left out of `tools` and refused by `execute`; the client itself calls them with
`control` (a server's control tools, such as the task and reset tools of a served world model).

The SDK is asynchronous; every backend of a process shares one event loop that runs in a daemon thread,
and `execute` waits for its call with a time limit.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TextIO

from envace_gym.types import Task, ToolCall, ToolSpec

__all__ = ["MCPBackend", "result_text"]

_LOOP: asyncio.AbstractEventLoop | None = None
_LOOP_LOCK = threading.Lock()


def _loop() -> asyncio.AbstractEventLoop:
    """The process's MCP event loop (started on first use, in a daemon thread)."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None:
            _LOOP = asyncio.new_event_loop()
            threading.Thread(target=_LOOP.run_forever, name="mcp-client-loop", daemon=True).start()
        return _LOOP


def result_text(result: Any) -> str:
    """The text an MCP ``CallToolResult`` shows the model: its text contents joined by newlines (other
    content as its JSON), or the structured content as JSON when there is no content."""
    parts = []
    for item in getattr(result, "content", None) or []:
        text = getattr(item, "text", None)
        parts.append(text if isinstance(text, str) else json.dumps(item.model_dump(mode="json"), ensure_ascii=False))
    if not parts and getattr(result, "structured_content", None) is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(parts)


class MCPBackend:
    """A `envace_gym.suites.ToolBackend` backed by one MCP server session (module docstring).

    Args:
        command: the server's command line, e.g. ``["mcp-server-time"]`` or ``[sys.executable, "server.py"]``.
        env: environment variables for the server process, over the SDK's default inherited set.
        call_timeout_s: seconds a call may take before it becomes an error observation and a restart.
        start_timeout_s: seconds the launch and handshake may take.
        hidden_tools: tool names not offered to the model (e.g. a server's own control tools).
        local_tools: ``{name: fn(arguments) -> str}`` answered in this process, never by the server.
        text: turns a ``CallToolResult`` into the observation text (default `result_text`).
        state_dir_env: the name of an environment variable that points the server at a new empty
            temporary folder for each process it starts (for servers that keep their state in files, so
            that no two sessions share it); None: no such variable.

    Raises:
        ValueError: an empty command or a non-positive time limit.
    """

    def __init__(
        self,
        command: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        call_timeout_s: float = 30.0,
        start_timeout_s: float = 30.0,
        hidden_tools: Sequence[str] = (),
        local_tools: Mapping[str, Callable[[dict[str, Any]], str]] | None = None,
        text: Callable[[Any], str] = result_text,
        state_dir_env: str | None = None,
    ) -> None:
        if not command or not all(isinstance(c, str) and c for c in command):
            raise ValueError(
                f"command must be a non-empty list of strings (the server's command line), got {command!r}"
            )
        if call_timeout_s <= 0 or start_timeout_s <= 0:
            raise ValueError(f"call_timeout_s and start_timeout_s must be > 0, got {call_timeout_s}, {start_timeout_s}")
        self.command = list(command)
        self.env = dict(env) if env is not None else None
        self.call_timeout_s = float(call_timeout_s)
        self.start_timeout_s = float(start_timeout_s)
        self.hidden_tools = set(hidden_tools)
        self.local_tools = dict(local_tools or {})
        self.text = text
        self.state_dir_env = state_dir_env
        self._session: tuple[asyncio.Task, asyncio.Queue] | None = None
        self._tools: list[ToolSpec] | None = None
        self._digest = b""
        self.restarts = 0
        self.calls = 0

    # ------------------------------------------------------------------ session
    def for_task(self, task: Task | None = None) -> MCPBackend:
        """A new backend (a new server session) with the same settings: one per rollout."""
        return MCPBackend(
            self.command,
            env=self.env,
            call_timeout_s=self.call_timeout_s,
            start_timeout_s=self.start_timeout_s,
            hidden_tools=sorted(self.hidden_tools),
            local_tools=self.local_tools,
            text=self.text,
            state_dir_env=self.state_dir_env,
        )

    def start(self) -> None:
        """Launch the server and do the handshake (done by the first call when not called).

        The whole session lives in one task of the shared loop (`_serve`), since the SDK's transport must
        be entered and left by the same task; calls are handed to it through a queue.

        Raises:
            RuntimeError: the server did not start or answer the handshake within ``start_timeout_s``.
        """
        if self._session is not None:
            return
        loop = _loop()
        ready: Future = Future()
        queue_box: list[asyncio.Queue] = []

        async def make() -> asyncio.Task:
            queue: asyncio.Queue = asyncio.Queue()
            queue_box.append(queue)
            return asyncio.ensure_future(self._serve(queue, ready))

        task = asyncio.run_coroutine_threadsafe(make(), loop).result(5.0)
        try:
            ready.result(self.start_timeout_s)
        except BaseException as err:
            loop.call_soon_threadsafe(task.cancel)
            reason = (
                f"no handshake within {self.start_timeout_s:g} s"
                if isinstance(err, FutureTimeout)
                else f"{type(err).__name__}: {err}"
            )
            raise RuntimeError(f"MCP server {' '.join(self.command)!r} did not start: {reason}") from None
        self._session = (task, queue_box[0])

    async def _serve(self, queue: asyncio.Queue, ready: Future) -> None:
        from mcp import Client
        from mcp.client.stdio import StdioServerParameters, stdio_client

        env = dict(self.env or {})
        state_dir = None
        if self.state_dir_env:
            state_dir = tempfile.TemporaryDirectory(prefix="mcp-state-")
            env[self.state_dir_env] = state_dir.name
        params = StdioServerParameters(command=self.command[0], args=self.command[1:], env=env or None)
        pending: Future | None = None
        try:
            # the server's stderr is ours, named at each start: the SDK's default is the sys.stderr of the moment
            # it was imported, which may be a stream without a file descriptor by now (a test's captured stderr)
            async with Client(stdio_client(params, errlog=_server_errlog()), mode="legacy") as client:
                ready.set_result(None)
                while True:
                    item = await queue.get()
                    if item is None:
                        break
                    request, pending = item
                    try:
                        pending.set_result(await request(client))
                    except Exception as err:
                        pending.set_exception(err)
                    pending = None
        except BaseException as err:  # the server exited or the session was cancelled
            for f in (ready, pending):
                if f is not None and not f.done():
                    f.set_exception(err if isinstance(err, Exception) else RuntimeError("the session was stopped"))
            if not isinstance(err, Exception):
                raise
        finally:
            while not queue.empty():  # calls that arrived after the session ended get an answer, not a wait
                item = queue.get_nowait()
                if item is not None and not item[1].done():
                    item[1].set_exception(RuntimeError("the server session had ended"))
            if state_dir is not None:
                state_dir.cleanup()

    def __deepcopy__(self, memo: dict) -> MCPBackend:
        """A new, unstarted session with the same settings (`for_task`): a server's state cannot be copied."""
        return self.for_task()

    def _call(self, request: Callable[[Any], Any], timeout: float) -> Any:
        """Run ``await request(client)`` in the session; raises TimeoutError after `timeout` seconds."""
        if self._session is not None and self._session[0].done():  # the session ended since the last call
            self.close(force=True)
            raise RuntimeError("the server had exited")
        self.start()
        if self._session is None:  # unreachable: start() either sets the session or raises
            raise RuntimeError("the MCP session did not start")
        task, queue = self._session
        done: Future = Future()
        _loop().call_soon_threadsafe(queue.put_nowait, (request, done))
        try:
            return done.result(timeout)
        except FutureTimeout:
            raise TimeoutError(f"no answer within {timeout:g} s") from None

    def close(self, force: bool = False) -> None:
        """Stop the server (its process tree); a later call starts a new one.

        Args:
            force: cancel the session at once (a hung or dead server) instead of ending it in order.
        """
        session, self._session = self._session, None
        if session is None:
            return
        task, queue = session
        loop = _loop()
        if force:
            loop.call_soon_threadsafe(
                task.cancel
            )  # cancelling the session's task leaves the transport, which stops the process
        else:
            loop.call_soon_threadsafe(queue.put_nowait, None)
        finished = asyncio.run_coroutine_threadsafe(asyncio.wait({task}, timeout=10.0), loop)
        try:
            done, _ = finished.result(12.0)
            if not done:
                loop.call_soon_threadsafe(task.cancel)
        except BaseException:
            loop.call_soon_threadsafe(task.cancel)

    def __del__(self) -> None:
        # no waiting here (this may run at interpreter exit): cancel the session's task; a server whose pipe
        # closes with this process ends on its own
        session = getattr(self, "_session", None)
        if session is not None and _LOOP is not None and _LOOP.is_running():
            try:
                _LOOP.call_soon_threadsafe(session[0].cancel)
            except RuntimeError:
                pass

    # ------------------------------------------------------------------ ToolBackend
    def tools(self) -> list[ToolSpec]:
        """The server's tools as schemas (hidden and local tools left out / kept as the server lists them).

        Raises:
            RuntimeError: the server did not start or did not list its tools in time.
        """
        if self._tools is None:
            try:
                listing = self._call(lambda client: client.list_tools(), self.call_timeout_s)
            except Exception as err:
                self.close(force=True)
                raise RuntimeError(f"MCP server {' '.join(self.command)!r} did not list its tools: {err}") from err
            self._tools = [
                ToolSpec(
                    name=t.name,
                    description=t.description or "",
                    parameters=dict(t.input_schema or {"type": "object", "properties": {}}),
                )
                for t in listing.tools
                if t.name not in self.hidden_tools
            ]
        return list(self._tools)

    def execute(self, call: ToolCall) -> str:
        """The observation for `call` (never raises; see the module docstring for failures)."""
        self.calls += 1
        if call.name in self.local_tools:
            try:
                out = str(self.local_tools[call.name](dict(call.arguments)))
            except Exception as err:  # a local tool's error is an observation, like the server's
                out = f"Error: {err}"
            return self._record(call, out)
        if call.name in self.hidden_tools:
            return self._record(call, f"Error: Tool '{call.name}' not found.")
        return self._record(call, self._remote(call))

    def control(self, name: str, arguments: Mapping[str, Any] | None = None) -> str:
        """Call one of the server's tools for the client itself, hidden ones included (a server's control
        tools: a served world model's ``envace_start_task``), outside the rollout: neither `snapshot` nor
        ``calls`` counts it. Never raises; failures are ``"Error: ..."`` texts as in `execute`."""
        return self._remote(ToolCall(name=name, arguments=dict(arguments or {})))

    def _remote(self, call: ToolCall) -> str:
        """The server's answer to `call` as text (the failures of the module docstring as ``"Error: ..."``)."""
        from mcp.shared.exceptions import MCPError
        from mcp_types import CONNECTION_CLOSED

        try:
            result = self._call(lambda client: client.call_tool(call.name, dict(call.arguments)), self.call_timeout_s)
        except MCPError as err:
            if err.code != CONNECTION_CLOSED:  # the server answered with a JSON-RPC error (e.g. an unknown tool)
                return f"Error: {err}"
            self.close(force=True)  # the server process ended: restart on the next call
            self.restarts += 1
            return f"Error: the tool server exited during {call.name}; it was restarted and its state is lost"
        except Exception as err:  # timeout, a server that never started: restart on the next call
            self.close(force=True)
            self.restarts += 1
            reason = str(err) or type(err).__name__
            return f"Error: the tool server failed on {call.name} ({reason}); it was restarted and its state is lost"
        out = self.text(result)
        if getattr(result, "is_error", False) and not out.startswith("Error"):
            out = f"Error: {out}"
        return out

    def _record(self, call: ToolCall, out: str) -> str:
        entry = json.dumps([call.name, call.arguments, out], sort_keys=True, default=str).encode()
        self._digest = hashlib.sha256(self._digest + entry).digest()  # a running digest of the answered calls
        return out

    def snapshot(self) -> bytes:
        """A digest of the calls answered so far and their results, in order (an MCP server's state is not
        readable in general: two sessions that gave the same answers to the same calls compare equal)."""
        return self._digest


def _server_errlog() -> TextIO:
    """Where a server subprocess writes its stderr: ``sys.stderr`` when it has a file descriptor, else the
    interpreter's original stderr (``sys.__stderr__``; a subprocess can only inherit a real descriptor), else
    the null device (an interpreter started without a stderr)."""
    try:
        sys.stderr.fileno()
        return sys.stderr
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both OSError and ValueError
        if sys.__stderr__ is not None:
            return sys.__stderr__
        return open(os.devnull, "w")  # noqa: SIM115 (the server's lifetime, not a block's)
