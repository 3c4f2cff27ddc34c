"""Tool-call parsing and formatting: model text <-> `ToolCall` lists, with `json` and `ast` only.

Two wire formats are supported:

**Hermes** (NousResearch Hermes function calling, also used by Qwen2.5/Qwen3 chat templates). Each call is
one JSON object inside its own tag pair, anywhere in the assistant text::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

``arguments`` must be a JSON object; a JSON *string* holding an object (``"arguments": "{\\"city\\": ...}"``,
as some models emit) is accepted too, and so is ``"parameters"`` in its place (OpenAI's schema key, Llama 3's
call format). A missing ``arguments`` key means no arguments. Other keys are ignored. A block may also hold a
JSON array of such objects (several calls in one block). The block's JSON is decoded before its end is
looked for, so a ``</tool_call>`` inside a JSON string does not end the block.

**Python calls** (the format BFCL's prompting handlers ask for and its AST checker decodes): one Python
list of keyword-only calls with literal arguments, optionally inside a Markdown code fence::

    [get_weather(city='Paris'), math.factorial(n=5)]

It is parsed with ``ast.parse(mode="eval")`` and each argument with ``ast.literal_eval``: literals only
(strings, numbers, including negative ones, ``True``/``False``/``None``, and nested lists, tuples and dicts
of literals). Tuples become lists so that arguments stay JSON. Positional or starred arguments, names,
calls, attribute access, sets, bytes and complex numbers are rejected.

No model text is ever executed (docs/design.md §3): there is no ``eval``/``exec`` anywhere here.

Reasoning inside ``<think>...</think>`` is ignored; an unclosed ``<think>`` makes everything after it
reasoning, and a ``</think>`` with no opening tag (templates that pre-fill ``<think>`` in the generation
prompt) makes everything before it reasoning.

`parse_tool_calls` returns ``[]`` for text without tool-call markup (a plain final answer) and raises
`ToolCallParseError` for markup that is malformed; the error message is written to be shown to the model
as an error observation. Inputs are bounded (`MAX_MARKUP_CHARS`, `MAX_CALLS`, `MAX_DEPTH`) so that no input
can leak a `RecursionError` or `MemoryError`.
"""

from __future__ import annotations

import ast
import json
import keyword
import math
import re
import unicodedata
from typing import Any, Literal

from envace_gym.types import ToolCall

__all__ = [
    "ToolCallParseError",
    "parse_tool_calls",
    "format_tool_calls",
    "text_outside_tool_calls",
    "strip_thinking",
    "MAX_MARKUP_CHARS",
    "MAX_CALLS",
    "MAX_DEPTH",
]

ParseStyle = Literal["auto", "hermes", "python"]
FormatStyle = Literal["hermes", "python"]

MAX_MARKUP_CHARS = 200_000
"""Longest tool-call markup (one Hermes block, or one Python-call list) accepted, in characters."""
MAX_CALLS = 128
"""Most tool calls accepted in one message."""
MAX_DEPTH = 64
"""Deepest nesting of lists/dicts accepted inside one call's arguments (the arguments object is depth 1)."""

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"

HERMES_FORMAT_HINT = (
    'Expected one block per call: <tool_call>{"name": "<function-name>", "arguments": {<args-json-object>}}'
    "</tool_call>, or no <tool_call> block at all for a final answer."
)
PYTHON_FORMAT_HINT = (
    "Expected a Python list of keyword-argument calls with literal values, e.g. "
    "[func_name1(param1=value1, param2='text'), func_name2(param=[1, 2])], or plain text for a final answer."
)


class ToolCallParseError(ValueError):
    """Tool-call markup was found but is malformed.

    The message says what was wrong and which format was expected; it is meant to be returned to the
    model verbatim as an error observation (docs/design.md §3: the environment never crashes).
    """


# --------------------------------------------------------------------------------------------- thinking


def strip_thinking(text: str) -> str:
    """Remove reasoning from `text`.

    Rules, in order: a ``</think>`` that comes before any ``<think>`` drops everything up to and including
    it (the generation prompt opened the block); every ``<think>...</think>`` block is dropped; an
    unclosed ``<think>`` drops everything from it to the end.

    Args:
        text: assistant text.

    Returns:
        str: the text outside reasoning blocks (not otherwise stripped).
    """
    first_open = text.find(_THINK_OPEN)
    first_close = text.find(_THINK_CLOSE)
    if first_close != -1 and (first_open == -1 or first_close < first_open):
        text = text[first_close + len(_THINK_CLOSE) :]
    out: list[str] = []
    pos = 0
    while True:
        start = text.find(_THINK_OPEN, pos)
        if start == -1:
            out.append(text[pos:])
            break
        out.append(text[pos:start])
        end = text.find(_THINK_CLOSE, start + len(_THINK_OPEN))
        if end == -1:
            break
        pos = end + len(_THINK_CLOSE)
    return "".join(out)


_FENCE_LANG_RE = re.compile(r"[A-Za-z0-9_+-]*")


def _unfence(text: str) -> str:
    """The inside of one Markdown code fence that spans the whole (stripped) text, else the text.

    String operations only (linear time): a regular expression here was quadratic on long runs of spaces.
    """
    if len(text) < 6 or not (text.startswith("```") and text.endswith("```")):
        return text
    inner = text[3:-3]
    first, nl, rest = inner.partition("\n")
    if nl and _FENCE_LANG_RE.fullmatch(first.strip()):
        inner = rest  # drop the language tag line ("```python")
    return inner.strip()


# ----------------------------------------------------------------------------------------- validation


def _check_json_value(value: Any, where: str, hint: str) -> Any:
    """Check that `value` is JSON (str keys, finite floats, depth <= MAX_DEPTH); tuples become lists.

    Iterative, so arbitrarily deep input cannot raise RecursionError.

    Raises:
        ToolCallParseError: a non-JSON value, a non-string key, a non-finite float or too deep nesting.
    """
    root: list[Any] = [value]
    # (container, key, value, depth): write the converted value back into container[key].
    stack: list[tuple[Any, Any, Any, int]] = [(root, 0, value, 1)]
    while stack:
        container, key, v, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ToolCallParseError(f"{where}: arguments are nested deeper than {MAX_DEPTH} levels. {hint}")
        if v is None or isinstance(v, (bool, int, str)):
            continue
        if isinstance(v, float):
            if not math.isfinite(v):
                raise ToolCallParseError(f"{where}: {v!r} is not a valid JSON number. {hint}")
            continue
        if isinstance(v, (list, tuple)):
            new = list(v)
            container[key] = new
            stack.extend((new, i, item, depth + 1) for i, item in enumerate(new))
            continue
        if isinstance(v, dict):
            new_d: dict[str, Any] = {}
            for k, item in v.items():
                if not isinstance(k, str):
                    raise ToolCallParseError(
                        f"{where}: dictionary key {k!r} is not a string (JSON keys are strings). {hint}"
                    )
                new_d[k] = item
            container[key] = new_d
            stack.extend((new_d, k, item, depth + 1) for k, item in new_d.items())
            continue
        raise ToolCallParseError(
            f"{where}: a value of type {type(v).__name__} is not allowed; use strings, numbers, booleans, "
            f"null/None, lists and objects/dicts only. {hint}"
        )
    return root[0]


# --------------------------------------------------------------------------------------------- hermes


_DECODER = json.JSONDecoder()
_SPACE = re.compile(r"\s*")


def _skip_space(text: str, i: int) -> int:
    """The index of the first non-whitespace character at or after `i` (``\\s*`` always matches)."""
    m = _SPACE.match(text, i)
    if m is None:  # unreachable: ``\s*`` matches the empty string
        raise AssertionError("\\s* did not match")
    return m.end()


def _json_block(text: str, start: int) -> tuple[Any, int] | None:
    """A JSON value right after ``<tool_call>`` at `start`, closed by ``</tool_call>``: ``(value, end)``.

    Decoding the value first finds its true end, so a ``</tool_call>`` inside a JSON string (a model writing
    about the format, or a file's content) does not cut the block. None when the block is not bare JSON
    followed by the closing tag (a fenced or malformed body is then split at the first ``</tool_call>``).
    """
    i = _skip_space(text, start)
    if i >= len(text) or text[i] not in "{[":
        return None
    try:
        value, j = _DECODER.raw_decode(text, i)
    except (ValueError, RecursionError, MemoryError):
        return None
    if j - i > MAX_MARKUP_CHARS:
        return None
    k = _skip_space(text, j)
    return (value, k + len(_CLOSE)) if text.startswith(_CLOSE, k) else None


def _block_at(text: str, start: int) -> tuple[Any, str | None, int] | None:
    """The ``<tool_call>`` block opening at `start`: ``(json_value, None, end)`` when its body is bare JSON
    (`_json_block`), else ``(None, body, end)`` with the body up to the first ``</tool_call>``; `end` is just
    past the closing tag. None when the block is never closed."""
    block = _json_block(text, start + len(_OPEN))
    if block is not None:
        return block[0], None, block[1]
    end = text.find(_CLOSE, start + len(_OPEN))
    return None if end == -1 else (None, text[start + len(_OPEN) : end], end + len(_CLOSE))


def _parse_hermes(text: str) -> list[ToolCall]:
    calls: list[ToolCall] = []
    pos = 0
    while True:
        start = text.find(_OPEN, pos)
        stray = text.find(_CLOSE, pos)
        if stray != -1 and (start == -1 or stray < start):
            raise ToolCallParseError(f"Found </tool_call> without a matching <tool_call>. {HERMES_FORMAT_HINT}")
        if start == -1:
            return calls
        if len(calls) >= MAX_CALLS:
            raise ToolCallParseError(f"Too many tool calls in one message (more than {MAX_CALLS}).")
        block = _block_at(text, start)
        if block is None:
            raise ToolCallParseError(f"Unclosed <tool_call> block (no </tool_call> after it). {HERMES_FORMAT_HINT}")
        value, body, pos = block
        calls.extend(_calls_from_json(value, len(calls)) if body is None else _parse_hermes_block(body, len(calls)))
        if len(calls) > MAX_CALLS:
            raise ToolCallParseError(f"Too many tool calls in one message (more than {MAX_CALLS}).")


def text_outside_tool_calls(text: str) -> str:
    """The text of a message with its Hermes ``<tool_call>`` blocks removed (what the assistant *said* beside
    its calls), found as `parse_tool_calls` finds them (a ``</tool_call>`` inside a JSON string does not end
    a block; an unclosed block runs to the end). A message without Hermes markup is returned as it is."""
    out, pos = [], 0
    while True:
        start = text.find(_OPEN, pos)
        if start == -1:
            out.append(text[pos:])
            return "".join(out)
        out.append(text[pos:start])
        block = _block_at(text, start)
        if block is None:
            return "".join(out)
        pos = block[2]


def _parse_hermes_block(body: str, index: int) -> list[ToolCall]:
    where = f"Tool call #{index + 1}"
    body = _unfence(body.strip())
    if len(body) > MAX_MARKUP_CHARS:
        raise ToolCallParseError(f"{where} is too long (over {MAX_MARKUP_CHARS} characters).")
    if not body:
        raise ToolCallParseError(f"{where} is empty. {HERMES_FORMAT_HINT}")
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError, MemoryError) as e:  # JSONDecodeError is a ValueError
        detail = e.msg if isinstance(e, json.JSONDecodeError) else f"too deeply nested or too large: {type(e).__name__}"
        raise ToolCallParseError(f"{where} is not valid JSON ({detail}). {HERMES_FORMAT_HINT}") from None
    return _calls_from_json(obj, index)


def _calls_from_json(obj: Any, index: int) -> list[ToolCall]:
    """The calls of one block's JSON: an object is one call; an array of objects is several (some models
    put a whole parallel-call list in one block)."""
    if isinstance(obj, list):
        if not obj:
            raise ToolCallParseError(f"Tool call #{index + 1} is an empty array. {HERMES_FORMAT_HINT}")
        if len(obj) > MAX_CALLS:
            raise ToolCallParseError(f"Too many tool calls in one message (more than {MAX_CALLS}).")
        return [_call_from_object(item, index + i) for i, item in enumerate(obj)]
    return [_call_from_object(obj, index)]


def _call_from_object(obj: Any, index: int) -> ToolCall:
    where = f"Tool call #{index + 1}"
    if not isinstance(obj, dict):
        raise ToolCallParseError(f"{where} must be a JSON object, got {_json_type(obj)}. {HERMES_FORMAT_HINT}")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise ToolCallParseError(f'{where} has no "name" (a non-empty string). {HERMES_FORMAT_HINT}')
    # "parameters" is the key of OpenAI's function schema and of Llama 3's call format; models trained on those
    # write it in calls too, so it is read as the arguments when "arguments" is absent
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except (ValueError, RecursionError, MemoryError):
            raise ToolCallParseError(
                f'{where} ({name}): "arguments" is a string that is not a JSON object. {HERMES_FORMAT_HINT}'
            ) from None
    if not isinstance(args, dict):
        raise ToolCallParseError(
            f'{where} ({name}): "arguments" must be a JSON object, got {_json_type(args)}. {HERMES_FORMAT_HINT}'
        )
    args = _check_json_value(args, f"{where} ({name})", HERMES_FORMAT_HINT)
    return ToolCall(name=name, arguments=args, id=f"call_{index}")


def _json_type(v: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(v), "a number"
    )


# --------------------------------------------------------------------------------------------- python


def _parse_python(text: str) -> list[ToolCall]:
    if len(text) > MAX_MARKUP_CHARS:
        raise ToolCallParseError(f"The tool-call list is too long (over {MAX_MARKUP_CHARS} characters).")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as e:
        raise ToolCallParseError(
            f"The tool-call list is not valid Python syntax ({e.msg}). {PYTHON_FORMAT_HINT}"
        ) from None
    except (ValueError, RecursionError, MemoryError, OverflowError) as e:
        raise ToolCallParseError(
            f"The tool-call list is too deeply nested or too complex to parse ({type(e).__name__}). "
            f"{PYTHON_FORMAT_HINT}"
        ) from None
    body = tree.body
    if not isinstance(body, ast.List):
        raise ToolCallParseError(f"Tool calls must be written as one Python list [...]. {PYTHON_FORMAT_HINT}")
    if len(body.elts) > MAX_CALLS:
        raise ToolCallParseError(f"Too many tool calls in one message (more than {MAX_CALLS}).")
    return [_parse_python_call(node, i) for i, node in enumerate(body.elts)]


def _dotted_name(node: ast.AST) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _parse_python_call(node: ast.AST, index: int) -> ToolCall:
    where = f"Tool call #{index + 1}"
    if not isinstance(node, ast.Call):
        raise ToolCallParseError(
            f"{where} is not a function call: every list item must be name(arg=value, ...). {PYTHON_FORMAT_HINT}"
        )
    name = _dotted_name(node.func)
    if name is None:
        raise ToolCallParseError(f"{where}: the function must be a plain or dotted name. {PYTHON_FORMAT_HINT}")
    where = f"{where} ({name})"
    if node.args:
        raise ToolCallParseError(
            f"{where} has positional arguments; pass every argument by keyword. {PYTHON_FORMAT_HINT}"
        )
    args: dict[str, Any] = {}
    for kw in node.keywords:
        if kw.arg is None:
            raise ToolCallParseError(f"{where} uses **kwargs; pass every argument by keyword. {PYTHON_FORMAT_HINT}")
        args[kw.arg] = _literal(kw.value, f"{where}, argument {kw.arg!r}")
    return ToolCall(name=name, arguments=_check_json_value(args, where, PYTHON_FORMAT_HINT), id=f"call_{index}")


_NOT_LITERAL = {
    ast.Name: "a variable name",
    ast.Call: "a function call",
    ast.Attribute: "attribute access",
    ast.Starred: "a starred expression",
    ast.Subscript: "a subscript",
    ast.Lambda: "a lambda",
    ast.BinOp: "an arithmetic expression",
    ast.JoinedStr: "an f-string",
    ast.Set: "a set",
}


def _literal(node: ast.AST, where: str) -> Any:
    for sub in ast.walk(node):  # specific messages for the common mistakes, before literal_eval
        for kind, what in _NOT_LITERAL.items():
            if isinstance(sub, kind):
                raise ToolCallParseError(
                    f"{where} contains {what}; only literal values are allowed. {PYTHON_FORMAT_HINT}"
                )
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
        raise ToolCallParseError(f"{where} is not a literal value. {PYTHON_FORMAT_HINT}") from None
    return value


# ---------------------------------------------------------------------------------------------- public


def parse_tool_calls(text: str, style: ParseStyle = "auto") -> list[ToolCall]:
    """Parse the tool calls of one assistant message.

    Formats (module docstring): Hermes ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks,
    and BFCL's Python-call list ``[f(a=1), pkg.g(b='x')]``. Reasoning in ``<think>`` blocks is removed
    first (`strip_thinking`).

    Args:
        text: the raw assistant text.
        style: ``"hermes"`` parses ``<tool_call>`` blocks (no block: ``[]``). ``"python"`` parses the text
            as one Python-call list if, stripped and with one enclosing Markdown code fence removed, it
            starts with ``[`` and ends with ``]`` (else ``[]``). ``"auto"`` is ``"hermes"`` when
            ``<tool_call>`` or ``</tool_call>`` occurs outside reasoning, else ``"python"``; so in auto
            mode a final answer that is entirely one bracketed expression is read as a call list.

    Returns:
        list[ToolCall]: the calls in order, with ids ``call_0``, ``call_1``, ... (neither format carries
        ids); ``[]`` when the text has no tool-call markup (a plain final answer), or is ``[]``.

    Raises:
        ToolCallParseError: markup is present but malformed: an unclosed ``<tool_call>`` or a stray
            ``</tool_call>``, a block that is not a JSON object, a missing or empty ``name``, arguments that
            are not an object (or a string holding one), a Python list that does not parse or holds
            anything but keyword calls with literal arguments, or a non-JSON value (set, bytes, complex,
            NaN/infinity, non-string dict key). Also for inputs past the bounds `MAX_MARKUP_CHARS`,
            `MAX_CALLS` and `MAX_DEPTH`.
        ValueError: `style` is not one of the three styles (a programming error, not a model error).

    Examples:
        >>> parse_tool_calls("<think>weather?</think>[get_weather(city='Paris', days=-1)]")
        [ToolCall(name='get_weather', arguments={'city': 'Paris', 'days': -1}, id='call_0')]
        >>> parse_tool_calls('<tool_call>{"name": "f", "arguments": {"a": [1, null]}}</tool_call>')
        [ToolCall(name='f', arguments={'a': [1, None]}, id='call_0')]
        >>> parse_tool_calls("The answer is 42.")
        []
    """
    if style not in ("auto", "hermes", "python"):
        raise ValueError(f"style must be 'auto', 'hermes' or 'python', got {style!r}")
    text = strip_thinking(text)
    if style == "auto":
        style = "hermes" if (_OPEN in text or _CLOSE in text) else "python"
    if style == "hermes":
        return _parse_hermes(text)
    body = _unfence(text.strip())
    if not (body.startswith("[") and body.endswith("]")):
        return []
    return _parse_python(body)


# Escape '<' where it would open a tag the parser looks for, so formatted strings never collide with markup.
_TAG_RE = re.compile(r"<(?=/|think>|tool_call>)")


def _check_identifier(name: str, what: str) -> None:
    if not (name.isidentifier() and not keyword.iskeyword(name) and unicodedata.normalize("NFKC", name) == name):
        raise ValueError(
            f"{what} {name!r} is not a valid Python identifier, so it cannot be written in the python style"
        )


def _py_literal(v: Any) -> str:
    """Python source for a JSON value; strings escape '<' before tag-like text as \\x3c."""
    if v is None or isinstance(v, bool):
        return repr(v)
    if isinstance(v, int):
        return repr(int(v))
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError(f"{v!r} is not a JSON number and cannot be formatted")
        return repr(float(v))
    if isinstance(v, str):
        return _TAG_RE.sub(r"\\x3c", repr(v))
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_py_literal(x) for x in v) + "]"
    if isinstance(v, dict):
        for k in v:
            if not isinstance(k, str):
                raise ValueError(f"dictionary key {k!r} is not a string; arguments must be JSON")
        return "{" + ", ".join(f"{_py_literal(k)}: {_py_literal(x)}" for k, x in v.items()) + "}"
    raise ValueError(f"a value of type {type(v).__name__} is not JSON and cannot be formatted")


def format_tool_calls(calls: list[ToolCall], style: FormatStyle = "hermes") -> str:
    """Write tool calls as model text; the inverse of `parse_tool_calls` (ids are not written).

    Hermes: one ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` block per call, joined by
    newlines (non-ASCII kept as is). Python (BFCL): ``[f(a=1), g(b='x')]`` with Python literal syntax.
    In both, a ``<`` that would start ``</``, ``<think>`` or ``<tool_call>`` inside a string is escaped
    (``\\u003c`` in JSON, ``\\x3c`` in Python) so that arbitrary strings round-trip.

    Args:
        calls: the calls; an empty list gives ``""`` (hermes) or ``"[]"`` (python).
        style: ``"hermes"`` or ``"python"``.

    Returns:
        str: text that `parse_tool_calls(text, style)` (or ``"auto"``) parses back to the same names and
        arguments.

    Raises:
        ValueError: an unknown style; a name that is empty (hermes) or not a (dotted) Python identifier
            (python); an argument name that is not a Python identifier (python); arguments that are not
            JSON (non-string keys, NaN/infinity, other types).
    """
    if style == "hermes":
        blocks = []
        for c in calls:
            if not c.name:
                raise ValueError("a tool call needs a non-empty name")
            _py_literal(c.arguments)  # same JSON checks as the python style
            body = json.dumps({"name": c.name, "arguments": c.arguments}, ensure_ascii=False, allow_nan=False)
            body = _TAG_RE.sub(r"\\u003c", body)
            blocks.append(f"{_OPEN}\n{body}\n{_CLOSE}")
        return "\n".join(blocks)
    if style == "python":
        parts = []
        for c in calls:
            for part in c.name.split("."):
                _check_identifier(part, "function name part")
            for k in c.arguments:
                _check_identifier(k, "argument name")
            args = ", ".join(f"{k}={_py_literal(v)}" for k, v in c.arguments.items())
            parts.append(f"{c.name}({args})")
        return "[" + ", ".join(parts) + "]"
    raise ValueError(f"style must be 'hermes' or 'python', got {style!r}")
