"""Chat rendering: tool support detection, the Hermes prompt, and piecewise == whole rendering.

Uses the SmolLM2-135M-Instruct tokenizer (plain ChatML, ignores `tools`) and a copy of it carrying a
Qwen2.5-like template with tool support.
"""

from __future__ import annotations

import copy
import json

import pytest

from envace_gym.parsing import format_tool_calls, parse_tool_calls
from envace_gym.rendering import ChatRenderer, hermes_system_prompt, supports_tools
from envace_gym.types import Message, ToolCall, ToolSpec

# Qwen2.5's template, cut to what matters here: tools in the system turn, tool results wrapped in
# <tool_response> inside a user turn, consecutive tool results merged into one turn.
QWEN_LIKE_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}{%- else %}{{- 'You are Qwen.' }}{%- endif "
    "%}"
    "{{- '\\n\\n# Tools\\n\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools><|im_end|>\\n' }}"
    "{%- else %}"
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are Qwen.<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) or message.role == 'assistant' %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

TOOLS = [
    ToolSpec(
        "get_weather",
        "Current weather for a city.",
        {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    ),
    ToolSpec("math.factorial", "n!", {"type": "object", "properties": {"n": {"type": "integer"}}}),
]


def _call_text(*calls: ToolCall) -> str:
    return "I'll look it up.\n" + format_tool_calls(list(calls))


CONVERSATIONS = {
    "system_tools": [
        Message("system", "You are a careful assistant."),
        Message("user", "What's the weather in Paris?"),
        Message("assistant", _call_text(ToolCall("get_weather", {"city": "Paris"}))),
        Message("tool", json.dumps({"temp_c": 21, "sky": "sunny"}), tool_call_id="call_0", name="get_weather"),
        Message("user", "And 5!?"),
        Message("assistant", _call_text(ToolCall("math.factorial", {"n": 5}))),
        Message("tool", "120", tool_call_id="call_0", name="math.factorial"),
        Message("assistant", "It is sunny, 21 °C, and 5! = 120."),
    ],
    "no_system": [
        Message("user", "Hi <b>there</b>\n\n  "),
        Message("assistant", "<think>greet</think>Hello!"),
        Message("user", "  leading spaces and a trailing newline\n"),
        Message("assistant", "\n\nstarts with newlines"),
    ],
}


@pytest.fixture(scope="module")
def qwen_tokenizer(smol_tokenizer):
    tok = copy.deepcopy(smol_tokenizer)  # never mutate the shared fixture
    tok.chat_template = QWEN_LIKE_TEMPLATE
    assert smol_tokenizer.chat_template != QWEN_LIKE_TEMPLATE
    return tok


@pytest.fixture(scope="module", params=["smollm2", "qwen_like"])
def renderer(request, smol_tokenizer, qwen_tokenizer):
    return ChatRenderer(smol_tokenizer if request.param == "smollm2" else qwen_tokenizer)


# ------------------------------------------------------------------------------------------- tool support


def test_supports_tools_detects_the_template(smol_tokenizer, qwen_tokenizer):
    assert supports_tools(smol_tokenizer) is False
    assert supports_tools(qwen_tokenizer) is True


def test_supports_tools_is_false_when_the_template_raises_or_is_missing(smol_tokenizer):
    tok = copy.deepcopy(smol_tokenizer)
    tok.chat_template = "{% if tools %}{{ raise_exception('no tools here') }}{% endif %}{{ messages[0]['content'] }}"
    assert supports_tools(tok) is False
    tok.chat_template = None
    assert supports_tools(tok) is False


def test_hermes_system_prompt_carries_schemas_and_format():
    prompt = hermes_system_prompt(TOOLS, base="BASE")
    assert prompt.startswith("BASE\n\n# Tools")
    inside = prompt.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0]
    assert [json.loads(line) for line in inside.splitlines()] == [t.to_openai() for t in TOOLS]
    assert '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>' in prompt
    assert "no <tool_call> block" in prompt
    assert not hermes_system_prompt(TOOLS).startswith("None")


def test_tools_go_through_the_template_or_the_system_prompt(smol_tokenizer, qwen_tokenizer):
    msgs = [Message("system", "SYS"), Message("user", "hi")]
    smol = ChatRenderer(smol_tokenizer).render(msgs, TOOLS)
    assert smol.startswith("<|im_start|>system\n" + hermes_system_prompt(TOOLS, base="SYS") + "<|im_end|>\n")
    # no system message: one is created (SmolLM2's default system prompt is then not injected)
    smol_nosys = ChatRenderer(smol_tokenizer).render(msgs[1:], TOOLS)
    assert smol_nosys.startswith("<|im_start|>system\n" + hermes_system_prompt(TOOLS) + "<|im_end|>\n")
    assert "SmolLM" not in smol_nosys
    qwen = ChatRenderer(qwen_tokenizer).render(msgs, TOOLS)
    assert qwen.startswith("<|im_start|>system\nSYS\n\n# Tools\n\n<tools>\n")
    assert json.dumps(TOOLS[0].to_openai()) in qwen and "<tool_call>" not in qwen  # the template's own wording


def test_with_tools_does_not_touch_the_input(smol_tokenizer):
    msgs = [Message("system", "SYS"), Message("user", "hi")]
    out = ChatRenderer(smol_tokenizer).with_tools(msgs, TOOLS)
    assert msgs[0].content == "SYS" and out[0].content != "SYS"
    assert ChatRenderer(smol_tokenizer).with_tools(msgs, None) == msgs


def test_assistant_tool_calls_are_rendered_as_raw_content(renderer):
    text = _call_text(ToolCall("get_weather", {"city": "Paris"}))
    msg = Message("assistant", text, tool_calls=parse_tool_calls(text))
    rendered = renderer.render([Message("user", "q"), msg])
    assert rendered.count("<tool_call>") == 1 and text in rendered


# ------------------------------------------------------------------------------------------ pieces


def test_pieces_smollm2_are_chatml(smol_tokenizer):
    r = ChatRenderer(smol_tokenizer)
    dec = smol_tokenizer.decode
    for role in ("system", "user", "assistant", "tool"):
        assert dec(r.open_ids(role)) == f"<|im_start|>{role}\n"
        assert dec(r.close_ids(role)) == "<|im_end|>\n"
    assert r.stop_token_ids == smol_tokenizer.encode("<|im_end|>", add_special_tokens=False)
    assert r.generation_prompt_ids == r.open_ids("assistant")
    assert r.content_ids("a <|im_end|> b") == smol_tokenizer.encode("a <|im_end|> b", add_special_tokens=False)


def test_pieces_qwen_like_tool_role(qwen_tokenizer):
    r = ChatRenderer(qwen_tokenizer)
    dec = qwen_tokenizer.decode
    assert dec(r.open_ids("tool")) == "<|im_start|>user\n<tool_response>\n"
    assert dec(r.close_ids("tool")) == "\n</tool_response><|im_end|>\n"
    assert dec(r.open_ids("assistant")) == "<|im_start|>assistant\n"
    assert (
        dec(r.message_ids(Message("tool", "42")))
        == "<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n"
    )


def test_after_generation_ids(renderer):
    stop = renderer.stop_token_ids[0]
    close = renderer.close_ids("assistant")
    assert close[0] == stop
    assert renderer.after_generation_ids([5, 6, stop]) == close[1:]
    assert renderer.after_generation_ids([5, 6]) == close  # cut off by the length limit
    assert renderer.after_generation_ids([]) == close


def test_unrenderable_role_raises_value_error(smol_tokenizer):
    tok = copy.deepcopy(smol_tokenizer)
    tok.chat_template = (
        "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tool role') }}{% endif %}"
        "{{ '<s>' + m.role + ':' + m.content + '</s>' }}{% endfor %}"
    )
    r = ChatRenderer(tok)
    assert tok.decode(r.open_ids("user")) == "<s>user:"
    with pytest.raises(ValueError, match="'tool'"):
        r.open_ids("tool")
    # a template that rewrites earlier turns once a message is appended is refused, not mis-split
    tok.chat_template = "{% for m in messages %}{{ m.content if loop.last else m.content | lower }}{% endfor %}"
    with pytest.raises(ValueError, match="appendable"):
        ChatRenderer(tok).open_ids("user")


# --------------------------------------------------------------------------- piecewise == whole rendering


def _piecewise(r: ChatRenderer, messages: list[Message], tools) -> list[int]:
    """A token-in-token-out rollout: prompt up to the first assistant turn, then only appended pieces."""
    first = next(i for i, m in enumerate(messages) if m.role == "assistant")
    ids = r.prompt_ids(messages[:first], tools)
    for i, m in enumerate(messages[first:], start=first):
        if m.role == "assistant":
            if i != first:
                ids += r.open_ids("assistant")
            generated = r.content_ids(m.content) + r.stop_token_ids[:1]  # as the model would stop
            ids += generated + r.after_generation_ids(generated)
        else:
            ids += r.message_ids(m)
    return ids


@pytest.mark.parametrize("with_tools", [True, False], ids=["tools", "no_tools"])
@pytest.mark.parametrize("conv", CONVERSATIONS.keys())
def test_piecewise_matches_whole_rendering(renderer, conv, with_tools):
    messages, tools = CONVERSATIONS[conv], (TOOLS if with_tools else None)
    whole_text = renderer.render(messages, tools)
    whole_ids = renderer.render_ids(messages, tools)
    pieces = _piecewise(renderer, messages, tools)
    dec = renderer.tokenizer.decode
    assert dec(whole_ids) == whole_text
    assert dec(pieces) == whole_text
    # Difference 1 (module docstring): the ids are equal unless some content starts with whitespace,
    # which BPE merges with the template's "\n" when the whole text is tokenised at once.
    starts_with_space = any(m.content[:1].isspace() for m in messages)
    assert (pieces == whole_ids) is not starts_with_space


@pytest.mark.parametrize(
    "content, piece_tokens, whole_tokens",
    [
        ("  leading", [" ", " leading"], ["\n ", " leading"]),
        ("\n\nstarts", ["\n", "\n", "starts"], ["\n\n", "\n", "starts"]),
    ],
)
def test_boundary_tokenisation_difference(smol_tokenizer, content, piece_tokens, whole_tokens):
    r = ChatRenderer(smol_tokenizer)
    tokens = lambda ids: [smol_tokenizer.decode([i]) for i in ids]  # noqa: E731
    msg = Message("user", content)
    piecewise = r.message_ids(msg)
    whole = smol_tokenizer.encode(f"<|im_start|>user\n{content}<|im_end|>\n", add_special_tokens=False)
    assert tokens(piecewise) == ["<|im_start|>", "user", "\n", *piece_tokens, "<|im_end|>", "\n"]
    assert tokens(whole) == ["<|im_start|>", "user", *whole_tokens, "<|im_end|>", "\n"]
    assert smol_tokenizer.decode(piecewise) == smol_tokenizer.decode(whole)


def test_prompt_ids_end_with_the_generation_prompt(renderer):
    msgs = CONVERSATIONS["system_tools"][:2]
    ids = renderer.prompt_ids(msgs, TOOLS)
    gen = renderer.generation_prompt_ids
    assert ids[-len(gen) :] == gen == renderer.open_ids("assistant")
    assert ids == renderer.render_ids(msgs, TOOLS, add_generation_prompt=True)
    assert ids[: -len(gen)] == renderer.render_ids(msgs, TOOLS)


def test_consecutive_tool_messages_differ_for_merging_templates(smol_tokenizer, qwen_tokenizer):
    # Difference 2 (module docstring): Qwen merges consecutive tool results into one user turn.
    msgs = [
        Message("user", "q"),
        Message("assistant", _call_text(ToolCall("a", {}), ToolCall("b", {}))),
        Message("tool", "A"),
        Message("tool", "B"),
        Message("assistant", "done"),
    ]
    qwen = ChatRenderer(qwen_tokenizer)
    whole = qwen.render(msgs)
    piecewise = qwen_tokenizer.decode(_piecewise(qwen, msgs, None))
    merged = "<|im_start|>user\n<tool_response>\nA\n</tool_response>\n<tool_response>\nB\n</tool_response><|im_end|>\n"
    separate = (
        "<|im_start|>user\n<tool_response>\nA\n</tool_response><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nB\n</tool_response><|im_end|>\n"
    )
    assert merged in whole and separate not in whole
    assert separate in piecewise and piecewise == whole.replace(merged, separate)
    # plain ChatML renders each tool message on its own: no difference there
    smol = ChatRenderer(smol_tokenizer)
    assert smol_tokenizer.decode(_piecewise(smol, msgs, None)) == smol.render(msgs)
