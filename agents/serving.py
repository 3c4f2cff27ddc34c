"""An OpenAI-compatible chat-completions server over a local model (``envace serve``; the judges' test endpoint).

Routes (the subset of the OpenAI REST API that a judge, or any chat client, needs; non-streaming):

* ``POST /v1/chat/completions``: body as in OpenAI's Chat Completions API (``model``, ``messages`` with string
  content or a list of ``{"type": "text", "text": ...}`` parts, ``max_tokens`` or ``max_completion_tokens``,
  ``temperature`` (0: greedy, the OpenAI default is 1), ``seed``, ``n`` = 1, ``stream`` = false). Other fields
  (``top_p``, ``stop``, ``response_format``, ...) are accepted and ignored. The prompt is the messages rendered with
  the model's chat template (`envace_gym.rendering.ChatRenderer.prompt_ids`); generation stops at the template's
  end-of-message tokens. The reply is a ``chat.completion`` object (built with the ``openai`` package's own
  ``ChatCompletion`` type, so its schema is the client's): one choice, ``finish_reason`` ``"stop"`` or
  ``"length"`` (``max_tokens`` reached), and ``usage`` (prompt, completion and total token counts).
* ``GET /v1/models``: the one served model (``{"object": "list", "data": [{"id": NAME, ...}]}``).
* ``GET /health``: 200 once the model is loaded.

Errors use OpenAI's body, ``{"error": {"message", "type", "param", "code"}}``: 400 for a request that does not
validate (bad JSON, an unknown role, ``n`` > 1, ``stream``, ``tools``, a ``max_tokens`` above the server's
limit), 404 for another model name.

Why Starlette and uvicorn: both are already installed (the ``mcp`` SDK serves over them), maintained by the
Encode team and the base of FastAPI; two routes do not need FastAPI's extra layer, and request bodies are
validated with pydantic (also already installed) as FastAPI would. Generation runs in a worker thread (the
event loop keeps answering) under a lock: one generation at a time, as the engine's model is not shared between
threads.
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from envace_gym.types import Message

__all__ = ["make_chat_app", "ChatServer", "DEFAULT_MAX_TOKENS"]

DEFAULT_MAX_TOKENS = 256
"""Completion tokens of a request that gives no ``max_tokens``."""


class _TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class _ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[_TextPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None


class _ChatRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str
    messages: list[_ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    seed: int | None = None
    n: int | None = Field(default=None, ge=1, le=1)
    stream: bool | None = None
    tools: list[Any] | None = None


def _error(status: int, message: str, param: str | None = None, code: str | None = None) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}}, status_code=status)


def _to_messages(request: _ChatRequest) -> list[Message]:
    out = []
    for m in request.messages:
        text = m.content if isinstance(m.content, str) else "".join(p.text for p in m.content or [])
        role = "system" if m.role == "developer" else m.role  # OpenAI's newer name for the system role
        out.append(Message(role=role, content=text, name=m.name, tool_call_id=m.tool_call_id))
    return out


def make_chat_app(
    policy: Any,
    model_name: str,
    *,
    default_max_tokens: int = DEFAULT_MAX_TOKENS,
    max_tokens_limit: int = 4096,
) -> Starlette:
    """The ASGI app that serves `policy` under `model_name` (module docstring).

    Args:
        policy: an `agents.policy.Policy` (its renderer builds prompts, its engine generates; best built with
            ``kv_cache=False``: requests share no prefix).
        model_name: the id clients send as ``model`` and ``/v1/models`` lists.
        default_max_tokens: completion tokens when a request gives no ``max_tokens``.
        max_tokens_limit: the largest ``max_tokens`` accepted (a larger one is a 400).

    Raises:
        ValueError: a limit below 1, or `default_max_tokens` above `max_tokens_limit`.
    """
    if default_max_tokens < 1 or max_tokens_limit < default_max_tokens:
        raise ValueError(
            f"need 1 <= default_max_tokens <= max_tokens_limit, got {default_max_tokens} and {max_tokens_limit}"
        )
    lock = threading.Lock()
    created = int(time.time())

    def generate(ids: list[int], max_new: int, temperature: float, seed: int | None) -> Any:
        with lock:
            return policy.generate(
                [ids], max_new_tokens=max_new, temperature=temperature, seeds=[seed], use_cache=False
            )[0]

    async def chat(request: Request) -> JSONResponse:
        from openai.types.chat import ChatCompletion

        try:
            body = await request.json()
        except ValueError as err:
            return _error(400, f"the body is not JSON: {err}")
        try:
            req = _ChatRequest.model_validate(body)
        except ValidationError as err:
            first = err.errors()[0]
            param = ".".join(str(p) for p in first["loc"])
            return _error(400, f"{param}: {first['msg']}", param=param)
        if req.stream:
            return _error(400, "stream=true is not supported: this server answers non-streaming requests", "stream")
        if req.tools:
            return _error(400, "tools are not supported by this server", "tools")
        if req.model != model_name:
            return _error(
                404,
                f"the model {req.model!r} does not exist; this server serves {model_name!r}",
                "model",
                "model_not_found",
            )
        max_new = req.max_completion_tokens or req.max_tokens or default_max_tokens
        if max_new > max_tokens_limit:
            return _error(400, f"max_tokens {max_new} is above this server's limit {max_tokens_limit}", "max_tokens")
        try:
            ids = policy.renderer.prompt_ids(_to_messages(req), None)
        except Exception as err:  # the chat template refuses the sequence (e.g. roles out of order)
            return _error(400, f"the model's chat template cannot render these messages: {err}", "messages")
        temperature = 1.0 if req.temperature is None else req.temperature
        gen = await run_in_threadpool(generate, ids, max_new, temperature, req.seed)
        completion = ChatCompletion.model_validate(
            {
                "id": f"chatcmpl-{uuid.uuid4().hex}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model_name,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": policy.decode(gen.token_ids)},
                        "finish_reason": "stop" if gen.stopped else "length",
                    }
                ],
                "usage": {
                    "prompt_tokens": len(ids),
                    "completion_tokens": len(gen.token_ids),
                    "total_tokens": len(ids) + len(gen.token_ids),
                },
            }
        )
        return JSONResponse(completion.model_dump(mode="json", exclude_none=True))

    async def models(request: Request) -> JSONResponse:
        return JSONResponse(
            {
                "object": "list",
                "data": [{"id": model_name, "object": "model", "created": created, "owned_by": "envace"}],
            }
        )

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
        ]
    )


class ChatServer:
    """Run an ASGI app with uvicorn in a background thread, on a socket bound before it starts (so ``port=0``
    picks a free port with no race), until `stop` (or the end of a ``with`` block).

    Args:
        app: the ASGI app (`make_chat_app`).
        host: the address to bind (default loopback only).
        port: the port (0: a free one; `port` then holds the one bound).
        log_level: uvicorn's log level.

    Attributes:
        base_url: ``http://HOST:PORT/v1``, what an OpenAI client takes as ``base_url``.

    Raises:
        OSError: the address cannot be bound (in use, not local).
        RuntimeError: the server did not start within 30 s.
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning") -> None:
        import uvicorn

        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind((host, port))
        self.host = host
        self.port = int(self.socket.getsockname()[1])
        self.server = uvicorn.Server(uvicorn.Config(app, log_level=log_level))
        self.thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    def start(self) -> ChatServer:
        """Start serving in a daemon thread and wait until uvicorn accepts connections."""
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server on {self.base_url} did not start")
            time.sleep(0.02)
        return self

    def serve_forever(self) -> None:
        """Serve in this thread until interrupted (Ctrl-C: uvicorn's own graceful shutdown)."""
        self.server.run(sockets=[self.socket])

    def stop(self) -> None:
        """Ask uvicorn to shut down and wait for its thread."""
        self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(timeout=30)
        self.socket.close()

    def __enter__(self) -> ChatServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
