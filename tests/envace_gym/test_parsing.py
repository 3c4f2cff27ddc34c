"""Tool-call parsing: round trips, the never-crash property on arbitrary text, and each error case."""

from __future__ import annotations

import keyword
import math
import re
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envace_gym.parsing import (
    MAX_CALLS,
    MAX_DEPTH,
    MAX_MARKUP_CHARS,
    ToolCallParseError,
    format_tool_calls,
    parse_tool_calls,
    strip_thinking,
)
from envace_gym.types import ToolCall

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ---------------------------------------------------------------------------------------------- strategies

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(10**30), 10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
identifiers = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,9}", fullmatch=True).filter(lambda s: not keyword.iskeyword(s))
dotted_names = st.lists(identifiers, min_size=1, max_size=3).map(".".join)


def _calls(names, keys):
    return st.lists(
        st.builds(lambda n, a: ToolCall(name=n, arguments=a), names, st.dictionaries(keys, json_values, max_size=4)),
        min_size=1,
        max_size=4,
    )


def _same(parsed: list[ToolCall], calls: list[ToolCall]) -> None:
    assert [(c.name, c.arguments) for c in parsed] == [(c.name, c.arguments) for c in calls]
    assert [c.id for c in parsed] == [f"call_{i}" for i in range(len(calls))]


# ------------------------------------------------------------------------------------------------ round trips


@SETTINGS
@given(_calls(st.text(min_size=1, max_size=20), st.text(max_size=10)))
def test_hermes_round_trip_any_name(calls):
    text = format_tool_calls(calls, "hermes")
    _same(parse_tool_calls(text, "hermes"), calls)
    _same(parse_tool_calls(text), calls)  # auto picks hermes
    _same(parse_tool_calls("Let me check.\n" + text + "\n"), calls)  # text around the blocks is allowed


@SETTINGS
@given(_calls(dotted_names, identifiers))
def test_python_round_trip(calls):
    text = format_tool_calls(calls, "python")
    _same(parse_tool_calls(text, "python"), calls)
    _same(parse_tool_calls(text), calls)  # auto picks python
    _same(parse_tool_calls(f"```python\n{text}\n```"), calls)  # inside a code fence


def test_round_trip_keeps_int_float_and_tag_like_strings_apart():
    call = ToolCall("f", {"a": 1, "b": 1.0, "c": -0.5, "d": [True, None, {"k": "</tool_call><think>x"}], "e": "é\n'\""})
    for style in ("hermes", "python"):
        (back,) = parse_tool_calls(format_tool_calls([call], style))
        assert back.arguments == call.arguments
        assert type(back.arguments["a"]) is int and type(back.arguments["b"]) is float


def test_fenced_python_with_backticks_in_a_string():
    call = ToolCall("f", {"code": "```py\nprint(1)\n```"})
    text = format_tool_calls([call], "python")
    assert parse_tool_calls(f"```python\n{text}\n```")[0].arguments == call.arguments


def test_format_exact_text():
    calls = [ToolCall("f", {"a": 1}), ToolCall("g", {"b": "x"})]
    assert format_tool_calls(calls, "python") == "[f(a=1), g(b='x')]"
    assert format_tool_calls(calls, "hermes") == (
        '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>\n'
        '<tool_call>\n{"name": "g", "arguments": {"b": "x"}}\n</tool_call>'
    )


@pytest.mark.parametrize(
    "call, style",
    [
        (ToolCall("not an identifier", {}), "python"),
        (ToolCall("f", {"class": 1}), "python"),
        (ToolCall("a.class", {}), "python"),
        (ToolCall("", {}), "hermes"),
        (ToolCall("f", {"x": math.nan}), "hermes"),
        (ToolCall("f", {"x": {1: 2}}), "python"),
        (ToolCall("f", {"x": {1, 2}}), "hermes"),
    ],
)
def test_format_rejects_what_cannot_round_trip(call, style):
    with pytest.raises(ValueError):
        format_tool_calls([call], style)


# ------------------------------------------------------------------------------------------- never crashes

fragments = st.sampled_from(
    [
        "<tool_call>",
        "</tool_call>",
        "<think>",
        "</think>",
        "[",
        "]",
        "(",
        ")",
        "{",
        "}",
        '"name"',
        ":",
        ",",
        "=",
        "f",
        "a.b",
        "'",
        '"',
        "1",
        "-",
        "```",
        "\n",
        " ",
        "*",
        "**",
        "x",
    ]
)
markupish = st.lists(fragments | st.text(max_size=5), max_size=30).map("".join)


def _parses_or_raises_cleanly(text: str, style: str) -> None:
    try:
        out = parse_tool_calls(text, style)
    except ToolCallParseError as e:
        assert str(e)  # a message the model can read
        return
    assert isinstance(out, list) and all(isinstance(c, ToolCall) for c in out)
    for c in out:
        assert isinstance(c.name, str) and c.name and isinstance(c.arguments, dict)


@SETTINGS
@given(st.text() | markupish, st.sampled_from(["auto", "hermes", "python"]))
def test_any_text_parses_or_raises_parse_error(text, style):
    _parses_or_raises_cleanly(text, style)


@SETTINGS
@given(markupish, markupish)
def test_any_text_inside_markup_parses_or_raises_parse_error(inner, outer):
    for text in (f"<tool_call>{inner}</tool_call>{outer}", f"[{inner}]", f"[f({inner})]", f"{outer}<tool_call>{inner}"):
        _parses_or_raises_cleanly(text, "auto")


@pytest.mark.parametrize(
    "text",
    [
        "[" * 100_000 + "]" * 100_000,
        "[f(a=" + "[" * 5_000 + "]" * 5_000 + ")]",
        "[f(a=" + "-" * 100_000 + "1)]",
        "[f(a=" + "not " * 50_000 + "1)]",
        "<tool_call>" + "[" * 100_000 + "</tool_call>",
        '<tool_call>{"name": "f", "arguments": ' + "[" * 100_000 + "]" * 100_000 + "}</tool_call>",
        '<tool_call>{"name": "f", "arguments": {"a": '
        + "[" * (MAX_DEPTH + 1)
        + "]" * (MAX_DEPTH + 1)
        + "}}</tool_call>",
        "[f(a="
        + "[" * (MAX_DEPTH // 2)
        + "{'k': " * (MAX_DEPTH // 2)
        + "1"
        + "}" * (MAX_DEPTH // 2)
        + "]" * (MAX_DEPTH // 2)
        + ")]",
        '<tool_call>{"name": "f", "arguments": {"a": ' + "9" * 10_000 + "}}</tool_call>",
        "[f(a=" + "9" * 10_000 + ")]",
        "[f(a='" + "x" * (MAX_MARKUP_CHARS + 1) + "')]",
        '<tool_call>{"name": "f"}</tool_call>' * (MAX_CALLS + 1),
        "[" + ", ".join(["f()"] * (MAX_CALLS + 1)) + "]",
    ],
)
def test_huge_or_deep_input_raises_parse_error(text):
    with pytest.raises(ToolCallParseError):
        parse_tool_calls(text)


@pytest.mark.parametrize(
    "text",
    [
        "```\n" + " " * MAX_MARKUP_CHARS + "x```",
        "<tool_call>```" + " " * MAX_MARKUP_CHARS + "x```</tool_call>",
        "<think>" * 50_000 + "</think>" * 50_000 + "[f(a=1)]",
        "<tool_call>{}</tool_call>" * 10_000,
        "[" + "f(a=1), " * 20_000 + "]",
        "x" * 5_000_000,
    ],
)
def test_pathological_inputs_are_fast(text):
    start = time.perf_counter()
    try:
        parse_tool_calls(text)
    except ToolCallParseError:
        pass
    # linear time (well under a second alone; the bound leaves room for a loaded machine): a regex here
    # was once quadratic, ~200 s on the first input
    assert time.perf_counter() - start < 5.0


def test_bounds_are_not_hit_by_ordinary_nesting():
    deep = {"a": [[[{"b": [1, 2, {"c": None}]}]]]}
    for style in ("hermes", "python"):
        assert parse_tool_calls(format_tool_calls([ToolCall("f", deep)], style))[0].arguments == deep


# -------------------------------------------------------------------------------------------- accepted forms


def test_plain_answers_have_no_calls():
    for text in [
        "",
        "The answer is 42.",
        "Use f(x) = 2x.",
        "a [bracket] inside text",
        '{"name": "f"}',
        "[f(a=1)] is what I would call",
    ]:
        assert parse_tool_calls(text) == []
    assert parse_tool_calls("[]") == []
    assert parse_tool_calls("no tags here", "hermes") == []
    assert parse_tool_calls("<tool_call>{}</tool_call>", "python") == []  # python style ignores hermes tags


def test_hermes_several_blocks_and_string_arguments():
    text = (
        'I will call two tools.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}\n'
        "</tool_call>\n"
        '<tool_call>{"name": "search", "arguments": "{\\"q\\": \\"x\\"}"}</tool_call>'
        '<tool_call>{"name": "now"}</tool_call>'
    )
    assert parse_tool_calls(text) == [
        ToolCall("get_weather", {"city": "Paris", "days": [1, 2]}, "call_0"),
        ToolCall("search", {"q": "x"}, "call_1"),
        ToolCall("now", {}, "call_2"),
    ]


def test_hermes_block_inside_code_fence_and_extra_keys():
    text = '<tool_call>\n```json\n{"name": "f", "arguments": {"a": 1}, "id": "ignored"}\n```\n</tool_call>'
    assert parse_tool_calls(text) == [ToolCall("f", {"a": 1}, "call_0")]


def test_python_literals_dotted_names_and_tuples():
    text = (
        "[math.factorial(n=5), g(a=-1, b=-2.5, c=True, d=False, e=None, f=(1, (2, 3)), g={'k': [1, {'z': 'y'}]}, "
        'h="q")]'
    )
    assert parse_tool_calls(text) == [
        ToolCall("math.factorial", {"n": 5}, "call_0"),
        ToolCall(
            "g",
            {
                "a": -1,
                "b": -2.5,
                "c": True,
                "d": False,
                "e": None,
                "f": [1, [2, 3]],
                "g": {"k": [1, {"z": "y"}]},
                "h": "q",
            },
            "call_1",
        ),
    ]


# ------------------------------------------------------------------------------------------------ thinking


def test_think_blocks_are_ignored():
    assert parse_tool_calls('<think>maybe <tool_call>{"bad</think>The answer is 4.') == []
    assert parse_tool_calls("<think>[f(a=1)]</think>[g(b=2)]") == [ToolCall("g", {"b": 2}, "call_0")]
    hermes = '<think>plan</think>\n<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    assert parse_tool_calls(hermes) == [ToolCall("f", {}, "call_0")]


def test_unclosed_think_hides_the_rest():
    assert parse_tool_calls('Sure.<think>then <tool_call>{"name": "f"}</tool_call>') == []
    assert parse_tool_calls("<think>[f(a=1)]") == []


def test_close_without_open_hides_what_came_before():
    # templates that pre-fill "<think>\n" in the generation prompt: the model emits only "</think>"
    assert parse_tool_calls("reasoning <tool_call> [x(</think>[f(a=1)]") == [ToolCall("f", {"a": 1}, "call_0")]
    assert strip_thinking("a</think>b<think>c</think>d<think>e") == "bd"


# ---------------------------------------------------------------------------------------------- error cases

HERMES_ERRORS = {
    "unclosed": ('<tool_call>{"name": "f", "arguments": {}}', "Unclosed <tool_call>"),
    "second unclosed": ('<tool_call>{"name": "f"}</tool_call><tool_call>{"name": "g"}', "Unclosed"),
    "stray close": ('{"name": "f"}</tool_call>', "without a matching <tool_call>"),
    "bad json": ('<tool_call>{"name": "f", "arguments": {a: 1}}</tool_call>', "not valid JSON"),
    "python inside hermes": ("<tool_call>[f(a=1)]</tool_call>", "not valid JSON"),
    "array of non-objects": ('<tool_call>[{"name": "f"}, 3]</tool_call>', "must be a JSON object, got a number"),
    "empty array": ("<tool_call>[]</tool_call>", "empty array"),
    "empty block": ("<tool_call>  </tool_call>", "is empty"),
    "missing name": ('<tool_call>{"arguments": {}}</tool_call>', 'no "name"'),
    "empty name": ('<tool_call>{"name": "", "arguments": {}}</tool_call>', 'no "name"'),
    "name not string": ('<tool_call>{"name": ["f"], "arguments": {}}</tool_call>', 'no "name"'),
    "arguments list": ('<tool_call>{"name": "f", "arguments": [1]}</tool_call>', "must be a JSON object, got an array"),
    "arguments bad string": (
        '<tool_call>{"name": "f", "arguments": "a=1"}</tool_call>',
        "string that is not a JSON object",
    ),
    "arguments string non-object": ('<tool_call>{"name": "f", "arguments": "[1]"}</tool_call>', "got an array"),
    "nan": ('<tool_call>{"name": "f", "arguments": {"a": NaN}}</tool_call>', "not a valid JSON number"),
}

PYTHON_ERRORS = {
    "syntax": ("[f(a=1]", "not valid Python syntax"),
    "plain list": ("[1, 2, 3]", "is not a function call"),
    "mixed list": ("[f(a=1), 'x']", "#2 is not a function call"),
    "positional": ("[f(1)]", "positional arguments"),
    "starred": ("[f(*xs)]", "positional arguments"),
    "double star": ("[f(**kw)]", "**kwargs"),
    "name arg": ("[f(a=x)]", "a variable name"),
    "call arg": ("[f(a=g(b=1))]", "a function call"),
    "attribute arg": ("[f(a=os.sep)]", "attribute access"),
    "arithmetic": ("[f(a=1+2)]", "an arithmetic expression"),
    "set": ("[f(a={1, 2})]", "a set"),
    "bytes": ("[f(a=b'x')]", "bytes is not allowed"),
    "complex": ("[f(a=1j)]", "complex is not allowed"),
    "int key": ("[f(a={1: 2})]", "is not a string"),
    "lambda": ("[f(a=lambda: 0)]", "a lambda"),
    "callee not a name": ("[f()(a=1)]", "plain or dotted name"),
    "subscript callee": ("[fs[0](a=1)]", "plain or dotted name"),
    "list comprehension": ("[f(a=1) for f in g]", "one Python list"),
    "infinity": ("[f(a=1e999)]", "not a valid JSON number"),
}


@pytest.mark.parametrize("text, message", HERMES_ERRORS.values(), ids=HERMES_ERRORS.keys())
def test_hermes_errors(text, message):
    with pytest.raises(ToolCallParseError, match=re.escape(message)) as e:
        parse_tool_calls(text)
    assert "<tool_call>" in str(e.value)  # the expected format is part of the message
    with pytest.raises(ToolCallParseError):
        parse_tool_calls(text, "hermes")


@pytest.mark.parametrize("text, message", PYTHON_ERRORS.values(), ids=PYTHON_ERRORS.keys())
def test_python_errors(text, message):
    with pytest.raises(ToolCallParseError, match=re.escape(message)) as e:
        parse_tool_calls(text)
    assert "Python list" in str(e.value)  # the expected format is part of the message
    with pytest.raises(ToolCallParseError):
        parse_tool_calls(text, "python")


def test_parse_error_is_a_value_error_and_bad_style_is_rejected():
    assert issubclass(ToolCallParseError, ValueError)
    with pytest.raises(ValueError, match="style"):
        parse_tool_calls("[f()]", "json")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="style"):
        format_tool_calls([], "json")  # type: ignore[arg-type]


def test_parser_never_executes_code(tmp_path):
    marker = tmp_path / "pwned"
    payload = f"[f(a=__import__('pathlib').Path({str(marker)!r}).touch())]"
    with pytest.raises(ToolCallParseError):
        parse_tool_calls(payload)
    assert not marker.exists()


# Model output that public bug reports show real models emit (vLLM and Ollama tool parsers, Llama 3 and Qwen
# issue threads): a close tag inside a string argument, "parameters" for "arguments", several calls as one
# JSON array in one block.
def test_close_tag_inside_a_json_string_does_not_cut_the_block():
    text = (
        '<tool_call>{"name": "echo", "arguments": {"text": "write </tool_call> here"}}</tool_call> then '
        '<tool_call>{"name": "g"}</tool_call>'
    )
    calls = parse_tool_calls(text)
    assert [(c.name, c.arguments) for c in calls] == [("echo", {"text": "write </tool_call> here"}), ("g", {})]


def test_parameters_key_is_read_as_the_arguments():
    (call,) = parse_tool_calls('<tool_call>{"name": "f", "parameters": {"x": 1}}</tool_call>')
    assert call.arguments == {"x": 1}
    (call,) = parse_tool_calls('<tool_call>{"name": "f", "arguments": {"y": 2}, "parameters": {"x": 1}}</tool_call>')
    assert call.arguments == {"y": 2}


def test_an_array_of_calls_in_one_block():
    calls = parse_tool_calls(
        '<tool_call>[{"name": "f", "arguments": {"x": 1}}, {"name": "g", "parameters": {}}]</tool_call>'
    )
    assert [(c.name, c.arguments) for c in calls] == [("f", {"x": 1}), ("g", {})]


def test_text_outside_tool_calls_keeps_what_was_said_beside_the_blocks():
    from envace_gym.parsing import text_outside_tool_calls

    text = (
        'Your refund is 120 USD. <tool_call>{"name": "note", "arguments": {"text": "a </tool_call> '
        'inside"}}</tool_call>'
        ' Anything else?<tool_call>\n```json\n{"name": "x", "arguments": {}}\n```\n</tool_call>'
    )
    assert parse_tool_calls(text)[0].arguments == {"text": "a </tool_call> inside"}
    assert text_outside_tool_calls(text) == "Your refund is 120 USD.  Anything else?"
    assert text_outside_tool_calls("no markup") == "no markup"
    assert text_outside_tool_calls('said <tool_call>{"name": "x"') == "said "  # an unclosed block runs to the end
