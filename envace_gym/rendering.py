"""Chat rendering: messages + tool schemas -> prompt text and token ids, whole or piece by piece.

`ChatRenderer` wraps any Transformers tokenizer with a chat template (a ``PreTrainedTokenizer``-like
object: ``apply_chat_template``, ``encode``, ``decode``, ``all_special_ids``, ``eos_token_id``). This module
does not import `agents` or any model code (docs/design.md §2); it takes the tokenizer as an argument.

Tool schemas reach the model in one of two ways:

- the template supports ``tools`` (`supports_tools` is True, e.g. Qwen2.5/Qwen3): they are passed to
  ``apply_chat_template`` as OpenAI ``{"type": "function", "function": {...}}`` dicts;
- the template ignores ``tools`` (e.g. SmolLM2-135M-Instruct, docs/design.md §4): `hermes_system_prompt` is
  merged into the first system message, or becomes a new first system message.

Token in, token out (docs/design.md §3): a rollout renders the prompt once (`ChatRenderer.prompt_ids`) and then
only appends ids: the generated ids of a segment, the template pieces between segments (`close_ids`,
`open_ids`) and the content of new observation/user messages (`message_ids`). Never re-render decoded text.
The pieces are derived from the template itself by rendering probe conversations around a sentinel
string, so nothing here hard-codes ChatML.

Known differences between piecewise and whole rendering (each is covered by a test):

1. Tokenisation at boundaries: pieces are tokenised separately, so the ids can differ from tokenising the
   whole text at once where BPE would merge across a piece boundary. The decoded text is always equal.
   With ChatML special-token delimiters nothing merges across ``<|im_start|>``/``<|im_end|>``, but content
   that starts with whitespace merges with the ``\\n`` that ends the role header when tokenised whole
   (SmolLM2: ``"\\n" + "  leading"`` is ``["\\n", " ", " leading"]`` piecewise and ``["\\n ", " leading"]``
   whole; ``"\\n" + "\\n\\nx"`` is ``["\\n", "\\n", "\\n", "x"]`` versus ``["\\n\\n", "\\n", "x"]``). Otherwise the
   ids are equal. Training uses the piecewise ids the model actually saw, so this is harmless for
   token-in-token-out; it only matters when comparing with a fresh whole rendering.
2. Templates that merge consecutive messages: Qwen's template puts consecutive ``tool`` messages into one
   ``user`` turn (one ``<|im_start|>user`` ... ``<|im_end|>`` around several ``<tool_response>`` blocks).
   `message_ids` renders each tool message as if it were alone, so several tool results in a row give a
   different (still well-formed) text than the whole rendering. Send several results as one tool message
   to avoid it.
3. Templates without a tool role (SmolLM2's plain ChatML) render a tool message as
   ``<|im_start|>tool\\n...<|im_end|>\\n``; the model has not been trained on that role but the format is
   consistent between rollout and training.
4. Templates that rewrite history (Qwen3): the whole rendering drops the ``<think>`` block of every assistant
   message before the last user query, and gives the final assistant message an empty
   ``<think>\\n\\n</think>\\n\\n`` when it has none. A rollout never re-renders, so its earlier turns keep the
   think blocks the model generated and its messages open with the generation prompt
   (``<|im_start|>assistant\\n``), after which the model writes its own think block. The pieces are measured
   so that such rewrites do not matter (`ChatRenderer.open_ids`).

Where a message ends. A generated message (ACT, or an inline REHEARSE tool response) ends on the first stop
token of its role's close (`stop_token_ids`); whatever the close holds before that token is part of the
message the model writes (Qwen's tool close ``\\n</tool_response><|im_end|>\\n``: the rehearser writes
``...\\n</tool_response><|im_end|>``), and only the rest is appended as template
(`after_generation_ids`, `generation_end_ids`). Supervised targets end the same way.
"""

from __future__ import annotations

import json
from typing import Any

from envace_gym.types import Message, MessageRole, ToolSpec

__all__ = ["supports_tools", "hermes_system_prompt", "ChatRenderer"]

_SENTINEL = "ENVACESENTINELCONTENT"
_PREVIOUS = "ENVACEPREVIOUSCONTENT"
_SYS = {"role": "system", "content": "P"}
_USER = {"role": "user", "content": "U"}
_ASST = {"role": "assistant", "content": "A"}
_PROBE_TOOL = ToolSpec(
    name="envace_probe_tool_zq",
    description="probe",
    parameters={"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]},
)


def _apply(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, add_generation_prompt: bool
) -> str:
    text = tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=add_generation_prompt, tokenize=False
    )
    if not isinstance(text, str):  # some versions return a list for batched input
        raise TypeError(f"apply_chat_template returned {type(text).__name__}, expected str")
    return text


def supports_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template renders the ``tools`` argument.

    Renders a one-message conversation with and without a dummy tool; True when the dummy tool's name
    appears only in the rendering with tools.

    Args:
        tokenizer: a Transformers tokenizer (anything with ``apply_chat_template``).

    Returns:
        bool: False also when the template is missing or raises for either rendering (never raises).
    """
    conv = [{"role": "user", "content": "ping"}]
    try:
        without = _apply(tokenizer, conv, None, False)
        with_tools = _apply(tokenizer, conv, [_PROBE_TOOL.to_openai()], False)
    except Exception:  # noqa: BLE001 - any template failure means "no usable tool support"
        return False
    return _PROBE_TOOL.name in with_tools and _PROBE_TOOL.name not in without


def hermes_system_prompt(tools: list[ToolSpec], base: str | None = None) -> str:
    """A Hermes-style system prompt carrying the tool schemas (the wording of Qwen2.5's template).

    Format (NousResearch Hermes function calling, as used by Qwen2.5): the schemas are listed one JSON
    object per line inside ``<tools></tools>``, and the model is told to answer with one
    ``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` block per call, or with plain text and no
    ``<tool_call>`` block when it is done. `envace_gym.parsing.parse_tool_calls` reads that format.

    Args:
        tools: the tool specs, rendered with `ToolSpec.to_openai` in order.
        base: a system prompt to put first (e.g. the task's own system message); None for none.

    Returns:
        str: the system message content.
    """
    schemas = "\n".join(json.dumps(t.to_openai(), ensure_ascii=False) for t in tools)
    tools_part = (
        "# Tools\n\n"
        "You may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{schemas}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n"
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>\n\n'
        "When you have finished and can answer the user, reply with plain text and no <tool_call> block."
    )
    return f"{base}\n\n{tools_part}" if base else tools_part


class ChatRenderer:
    """Render conversations through a tokenizer's chat template, whole or as token pieces.

    Args:
        tokenizer: a Transformers tokenizer with a chat template.

    Attributes:
        tokenizer: the wrapped tokenizer.
        tools_supported: `supports_tools(tokenizer)`, computed once.

    The per-role pieces (`open_ids`, `close_ids`) are computed lazily on first use and cached; a template
    that cannot render a role in the probe conversation makes those calls raise ``ValueError``.

    Examples:
        >>> r = ChatRenderer(tok)  # doctest: +SKIP
        >>> ids = r.prompt_ids([Message("user", "hi")], tools)  # ends with <|im_start|>assistant\\n  # doctest: +SKIP
        >>> ids += generated + r.after_generation_ids(generated)  # close the ACT message  # doctest: +SKIP
        >>> ids += r.message_ids(Message("tool", "21C")) + r.open_ids("assistant")  # doctest: +SKIP
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.tools_supported = supports_tools(tokenizer)
        self._pieces: dict[str, tuple[list[int], list[int]]] = {}
        self._generation_prompt: list[int] | None = None

    # ------------------------------------------------------------------------------------ whole render

    def with_tools(self, messages: list[Message], tools: list[ToolSpec] | None) -> list[Message]:
        """The messages as they are rendered: with the Hermes tool prompt merged in when needed.

        When tools are given and the template ignores ``tools``, the first system message's content
        becomes ``hermes_system_prompt(tools, base=content)``, or a system message with
        ``hermes_system_prompt(tools)`` is put first. Otherwise the messages are returned unchanged.

        Args:
            messages: the conversation.
            tools: the tool specs, or None/empty for none.

        Returns:
            list[Message]: a new list (the input is not modified).
        """
        if not tools or self.tools_supported:
            return list(messages)
        if messages and messages[0].role == "system":
            first = messages[0]
            merged = Message(role="system", content=hermes_system_prompt(tools, base=first.content), name=first.name)
            return [merged, *messages[1:]]
        return [Message(role="system", content=hermes_system_prompt(tools)), *messages]

    @staticmethod
    def _to_template(m: Message) -> dict[str, Any]:
        # The assistant content already holds the raw tool-call markup the model emitted, so tool_calls
        # are not passed (templates that render them would write the calls twice).
        d: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.tool_call_id is not None:
            d["tool_call_id"] = m.tool_call_id
        if m.name is not None and m.role == "tool":
            d["name"] = m.name
        return d

    def render(
        self, messages: list[Message], tools: list[ToolSpec] | None = None, add_generation_prompt: bool = False
    ) -> str:
        """The whole conversation as text, through the chat template.

        Args:
            messages: the conversation (assistant content is rendered as is, tool-call markup included).
            tools: tool specs; passed as OpenAI dicts when the template supports tools, else merged into
                the system prompt (`with_tools`).
            add_generation_prompt: append the template's opening of a new assistant message.

        Returns:
            str: the rendered text.

        Raises:
            Exception: whatever the template raises for this conversation (e.g. jinja2 TemplateError).
        """
        msgs = [self._to_template(m) for m in self.with_tools(messages, tools)]
        tool_dicts = [t.to_openai() for t in tools] if tools and self.tools_supported else None
        return _apply(self.tokenizer, msgs, tool_dicts, add_generation_prompt)

    def render_ids(
        self, messages: list[Message], tools: list[ToolSpec] | None = None, add_generation_prompt: bool = False
    ) -> list[int]:
        """`render` tokenised in one go (no special tokens added: the template writes its own).

        Returns:
            list[int]: the ids, `(T,)`.
        """
        return self._encode(self.render(messages, tools, add_generation_prompt))

    def prompt_ids(self, messages: list[Message], tools: list[ToolSpec] | None = None) -> list[int]:
        """The ids of a whole prompt, ending with the template's generation prompt (the opening of the
        assistant message the model is to write).

        Equal to ``render_ids(messages, tools, add_generation_prompt=True)``; its last ids are
        `generation_prompt_ids` (equal to ``open_ids("assistant")`` for ChatML and Qwen templates).

        Returns:
            list[int]: the ids, `(P,)`.
        """
        return self.render_ids(messages, tools, add_generation_prompt=True)

    # -------------------------------------------------------------------------------- piecewise render

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def content_ids(self, text: str) -> list[int]:
        """Message content tokenised alone, with no special tokens added.

        Special-token text inside `text` (e.g. a literal ``<|im_end|>``) is tokenised as the special token,
        exactly as the whole-conversation rendering does.

        Returns:
            list[int]: the ids.
        """
        return self._encode(text)

    def _render_probe(self, role: MessageRole, messages: list[dict[str, Any]]) -> str:
        try:
            return _apply(self.tokenizer, messages, None, False)
        except Exception as e:  # noqa: BLE001 - re-raised with the role named
            raise ValueError(f"the chat template cannot render a {role!r} message: {e}") from e

    def _close_text(self, role: MessageRole) -> str:
        """The text a message of `role` ends with: what follows its content when it is the last message."""
        prefix = {"system": [], "user": [_SYS], "assistant": [_SYS, _USER], "tool": [_SYS, _USER, _ASST]}[role]
        full = self._render_probe(role, [*prefix, {"role": role, "content": _SENTINEL}])
        if full.count(_SENTINEL) != 1:
            raise ValueError(f"the chat template does not render a {role!r} message's content once, verbatim")
        return full.split(_SENTINEL)[1]

    def _probe(self, role: MessageRole) -> tuple[list[int], list[int]]:
        """Measure the open and close text of `role` in the rendering of a probe conversation.

        close: the text after the content of a final `role` message. open: the text between the content of
        the message before it and its own content, less the previous message's close. Only the previous
        message's content has to survive verbatim, so templates that rewrite other parts of earlier messages
        (Qwen3's think blocks) can still be split; one that rewrites that content cannot.
        """
        if role in self._pieces:
            return self._pieces[role]
        close_text = self._close_text(role)
        if role == "system":
            full = self._render_probe(role, [{"role": "system", "content": _SENTINEL}])
            open_text = full.split(_SENTINEL)[0]
        else:
            prev_role: MessageRole = "user" if role == "assistant" else "assistant"
            prefix = [_SYS, _USER] if role != "assistant" else [_SYS]
            prev = {"role": prev_role, "content": _PREVIOUS}
            full = self._render_probe(role, [*prefix, prev, {"role": role, "content": _SENTINEL}])
            between = full.split(_PREVIOUS)[-1].split(_SENTINEL)[0] if full.count(_PREVIOUS) == 1 else None
            prev_close = self._close_text(prev_role)
            if between is None or full.count(_SENTINEL) != 1 or not between.startswith(prev_close):
                raise ValueError(
                    f"the chat template does not render a {role!r} message as an appendable piece "
                    "(the message before it renders differently once it is added), so it cannot be used "
                    "token-in-token-out"
                )
            open_text = between[len(prev_close) :]
        self._pieces[role] = (self._encode(open_text), self._encode(close_text))
        return self._pieces[role]

    def open_ids(self, role: MessageRole) -> list[int]:
        """The template ids that open a message of `role` (ChatML: ``<|im_start|>assistant\\n``).

        For ``"system"`` this includes whatever the template writes before the first message (a BOS
        text, for instance). For ``"tool"`` with a Qwen template it is ``<|im_start|>user\\n<tool_response>\\n``.
        For ``"assistant"`` it is the generation prompt (`generation_prompt_ids`), the opening the model is
        conditioned on when it writes a message, whenever the template's own opening of a final assistant
        message starts with it (Qwen3 adds an empty think block there, which the model writes itself).

        Raises:
            ValueError: the template cannot render that role incrementally (see the class docstring).
        """
        opened = list(self._probe(role)[0])
        if role == "assistant":
            gen = self.generation_prompt_ids
            if self.tokenizer.decode(opened).startswith(self.tokenizer.decode(gen)):
                return gen
        return opened

    def close_ids(self, role: MessageRole) -> list[int]:
        """The template ids that close a message of `role` (ChatML: ``<|im_end|>\\n``).

        Raises:
            ValueError: as `open_ids`.
        """
        return list(self._probe(role)[1])

    def message_ids(self, message: Message) -> list[int]:
        """``open_ids(role) + content_ids(content) + close_ids(role)`` for one message.

        Use it for messages appended to a running sequence (tool observations, later user turns). A
        system message with tools should first go through `with_tools`.

        Raises:
            ValueError: as `open_ids`.
        """
        return self.open_ids(message.role) + self.content_ids(message.content) + self.close_ids(message.role)

    @property
    def generation_prompt_ids(self) -> list[int]:
        """The ids ``add_generation_prompt=True`` appends (ChatML: ``<|im_start|>assistant\\n``).

        Raises:
            ValueError: the template cannot render the probe conversation, or the generation prompt is
                not appended at the end of it.
        """
        if self._generation_prompt is None:
            prefix = [{"role": "system", "content": "P"}, {"role": "user", "content": "U"}]
            try:
                before = _apply(self.tokenizer, prefix, None, False)
                after = _apply(self.tokenizer, prefix, None, True)
            except Exception as e:  # noqa: BLE001
                raise ValueError(f"the chat template cannot render a generation prompt: {e}") from e
            if not after.startswith(before):
                raise ValueError("the chat template's generation prompt is not appended at the end of the conversation")
            self._generation_prompt = self._encode(after[len(before) :])
        return list(self._generation_prompt)

    @property
    def stop_token_ids(self) -> list[int]:
        """The end-of-message token ids generation stops on (ChatML: ``<|im_end|>``), in order, no repeats.

        The special tokens in ``close_ids("assistant")``, then the tokenizer's ``eos_token_id`` if it is not
        already there.
        """
        special = set(getattr(self.tokenizer, "all_special_ids", []) or [])
        out = [i for i in self.close_ids("assistant") if i in special]
        eos = getattr(self.tokenizer, "eos_token_id", None)
        if isinstance(eos, int) and eos not in out:
            out.append(eos)
        return list(dict.fromkeys(out))

    def _stop_index(self, role: MessageRole) -> int | None:
        """Index in ``close_ids(role)`` of its first stop token (`stop_token_ids`), or None."""
        stops = set(self.stop_token_ids)
        return next((i for i, t in enumerate(self.close_ids(role)) if t in stops), None)

    def generation_end_ids(self, role: MessageRole = "assistant") -> list[int]:
        """The ids a model writes to end a message of `role`: the close up to and including its stop token.

        ChatML: ``<|im_end|>`` for every role; a Qwen tool message: ``\\n</tool_response><|im_end|>``. A close
        without a stop token gives the first stop id (`stop_token_ids`). Demonstrations end their ACT and
        REHEARSE targets with these ids, so supervised targets end exactly as generated messages do.
        """
        j = self._stop_index(role)
        return self.close_ids(role)[: j + 1] if j is not None else self.stop_token_ids[:1]

    def after_generation_ids(self, generated_ids: list[int], role: MessageRole = "assistant") -> list[int]:
        """The template ids to append after a generated message of `role` to close it.

        A message that ended on a stop token of the close (``close_ids(role)[j]``; ChatML ``<|im_end|>``) gets
        only what follows it, ``close_ids(role)[j + 1:]`` (ChatML ``\\n``), whatever the model wrote before
        its stop: the close's text before the stop token (Qwen's ``\\n</tool_response>``) belongs to the
        message the model writes, and nothing is ever inserted before a generated token. A message cut by
        the length limit (or stopped on a token not in the close, such as a separate EOS) gets the close
        minus the longest prefix of it whose text the message already ends with (a whitespace-only prefix
        does not count).

        Args:
            generated_ids: the ids the model produced for the message, as sampled.
            role: ``"assistant"`` for ACT; the role whose close applies to a REHEARSE segment.

        Returns:
            list[int]: the ids to append (template tokens, no loss).
        """
        close = self.close_ids(role)
        if generated_ids and generated_ids[-1] in self.stop_token_ids and generated_ids[-1] in close:
            return close[close.index(generated_ids[-1]) + 1 :]
        # compared as text: the model may have split the close's text into other tokens ("}\n" + "</...");
        # a prefix that is only whitespace is not taken as the close (content often ends with a newline)
        text = self.tokenizer.decode(list(generated_ids)) if generated_ids else ""
        for k in range(len(close), 0, -1):
            piece = self.tokenizer.decode(close[:k])
            if piece.strip() and text.endswith(piece):
                return close[k:]
        return close

    def generated_content(self, text: str, role: MessageRole = "tool") -> str:
        """The content of a generated message of `role` whose text (stop token dropped) is `text`.

        Drops the close's text before its stop token when the message ends with it (Qwen's tool close:
        ``"\\n</tool_response>"``, or ``"</tool_response>"`` written without the newline); otherwise `text` is
        returned as is (ChatML closes hold nothing before ``<|im_end|>``).
        """
        j = self._stop_index(role)
        if not j:
            return text
        marker = self.tokenizer.decode(self.close_ids(role)[:j])
        for m in (marker, marker.lstrip()):
            if m and text.endswith(m):
                return text[: len(text) - len(m)]
        return text
