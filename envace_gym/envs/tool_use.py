"""`ToolUseEnv`: the token-level tool-use env (`EnvACE-Tool-v0`), whoever answers the calls.

`EnvACE-Rehearse-v0` is the same env with the policy's REHEARSE role answering (`envace_gym.envs.rehearse`).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import Any, cast

from envace_gym.envs.text import TextToolUseEnv
from envace_gym.registry import resolve_entry_point
from envace_gym.rehearsal import PromptMode, Rehearser, RehearseRequest, RehearseResponse, make_rehearser
from envace_gym.rendering import ChatRenderer
from envace_gym.responders import Hybrid, RealBackend, Rehearsal, Responder, ToolResponder
from envace_gym.suites import ToolBackend
from envace_gym.types import (
    Message,
    MessageRole,
    RealOutputRecord,
    RehearsalRecord,
    Role,
    Segment,
    Task,
    ToolCall,
)

__all__ = ["ToolUseEnv", "TOKENIZER_LOADER"]

StepResult = tuple[str, float, bool, bool, dict[str, Any]]

TOKENIZER_LOADER = "agents.models:load_tokenizer"
"""Entry point that loads a tokenizer by model name when the env is given none (``model`` names it)."""


class ToolUseEnv(TextToolUseEnv):
    """A tool-use task that keeps its token sequence (token in, token out), with a pluggable responder.

    ## Description
    The rules (parsing, error handling, user turns, termination, truncation, the verifier's reward) are
    `TextToolUseEnv`'s. Who answers a tool call is the ``responder`` (`envace_gym.responders`): the suite's
    real backend (``RealBackend()``, the default: ``EnvACE-Tool-v0``), the policy's REHEARSE role
    (``Rehearsal(rehearser)``: ``EnvACE-Rehearse-v0``, EnvACE, docs/design.md §1), both by a per-call draw
    (``Hybrid(rehearser, p)``), a recorded trajectory (``RecordedResponses``), or one of your own. The final
    reward always comes from the task's verifier replaying the ACT calls on a fresh *real* backend
    (docs/design.md §3), so a rehearser that invents convenient observations earns nothing.

    The env keeps the trajectory's token sequence (``self.trajectory.segments``), built by appending ids,
    never by re-rendering text: the prompt (system prompt with the tool schemas, first user turn) is
    rendered once; each ACT action is recorded with its generated ids when it is an
    `envace_gym.types.GeneratedText` (else its text is tokenised, logprobs None); template pieces between
    messages come from `envace_gym.rendering.ChatRenderer`. The roles partition the sequence:

    | segment                                   | role                                                |
    |-------------------------------------------|-----------------------------------------------------|
    | system prompt, user turns                 | PROMPT                                              |
    | message open/close pieces                 | TEMPLATE (the part of a close that a model          |
    |                                           | generated, up to its stop token, stays in its       |
    |                                           | ACT/REHEARSE segment: ChatML ``<|im_end|>``, Qwen   |
    |                                           | tool messages ``\\n</tool_response><|im_end|>``)     |
    | ACT message                               | ACT                                                 |
    | rehearsed tool response, ``inline``       | REHEARSE                                            |
    | rehearsed tool response, ``separate``     | OBSERVATION here (no loss in the ACT row); its own  |
    |                                           | row (simulator prompt + REHEARSE) in ``info``       |
    | parse-error message, real tool output     | OBSERVATION                                         |

    ## Action Space, Observation Space, Rewards, Starting State, Episode End
    As `TextToolUseEnv`. The token budget ``max_episode_tokens`` counts the real token sequence.

    ## Info
    Everything `TextToolUseEnv` gives, plus ``rehearsals``: one `envace_gym.types.RehearsalRecord` per
    rehearsed call of this step (the call, text, token ids, logprobs, the separate mode's prompt ids,
    stopped); ``num_tokens``: the length of the token sequence; ``rehearsal_tokens``: the episode's
    REHEARSE tokens so far; ``cut_generations``: generated messages of the episode (ACT actions passed as
    `GeneratedText` and rehearsals) that reached their ``max_new_tokens`` before a stop token (also the
    attribute ``cut_generations``, reset by `reset`).

    The attribute ``real_outputs`` (reset by `reset`) holds one `envace_gym.types.RealOutputRecord` per call of
    the episode that a `RealBackend` or a `Hybrid` answered from the real backend: the output as a target of
    the REHEARSE role (a world-model loss trains on it, `agents.rollout.build_batch`).

    ## Arguments
    All of `TextToolUseEnv`'s except ``count_tokens`` (tokens are counted with the tokenizer), and:

    * ``responder`` (`envace_gym.responders.Responder` | None): who answers the tool calls; None: the
      class default (``RealBackend(backend_factory)`` here, ``Rehearsal(rehearser)`` in `RehearseEnv`).
      Text responders are recorded as OBSERVATION tokens. `set_responder` swaps it at the next reset.
    * ``tokenizer``: the tokenizer of the token sequence; None: the rehearser's, or else the tokenizer of
      ``model`` (loaded by `TOKENIZER_LOADER`; no model weights are loaded for a text responder).
    * ``rehearser`` (Rehearser | None): the rehearser of a `Rehearsal` responder; None builds
      ``make_rehearser("policy", ...)`` from the arguments below when one is needed (the model is loaded
      once per store and shared by every env that loads from it).
    * ``model`` (str): model name or folder of the default rehearser and tokenizer; ``"smollm2-135m"``.
    * ``models``: the `agents.models.ModelStore` the default rehearser and tokenizer load from (None: the
      default store).
    * ``prompt_mode`` (``"inline"`` | ``"separate"``): see `envace_gym.rehearsal`.
    * ``max_new_tokens`` (int): cap per rehearsed response; default 256.
    * ``temperature`` (float): sampling temperature of rehearsals; 0 is greedy; default 1.0.
    * ``seed`` (int | None): seeds the env's ``np_random`` on the first reset when none is given there.
    * ``max_context_tokens`` (int | None): the longest token sequence the rehearser is asked to continue
      (default 16,384): a tool call whose rehearsal could pass it is answered with an error observation and
      no model call. Without it one 1 MB text action would make the next rehearsal attend over ~10^5 new
      tokens at once (tens of GB). Generated actions are bounded by their ``max_new_tokens``; an agent that
      acts on such a sequence itself should bound it too (``info["num_tokens"]``).

    ## Version History
    * v0: initial version. During 0.1.0 development ``EnvACE-Tool-v0`` moved from the text-level env (now
      `TextToolUseEnv`) to this class: it keeps tokens, needs a tokenizer, counts ``max_episode_tokens`` in
      real tokens, and ``info["rehearsals"]`` holds `RehearsalRecord` objects (``.to_dict()`` for JSON).
    """

    keeps_tokens = True
    rehearses_by_default = False
    """Whether ``responder=None`` means ``Rehearsal(rehearser)`` (`RehearseEnv`) or the real backend."""

    def __init__(
        self,
        suite: str = "bfcl",
        categories: Sequence[str] | None = None,
        split: str = "train",
        tasks: Sequence[Task] | None = None,
        rehearser: Rehearser | None = None,
        model: str = "smollm2-135m",
        prompt_mode: PromptMode = "inline",
        max_new_tokens: int = 256,
        temperature: float = 1.0,
        seed: int | None = None,
        max_steps_per_turn: int = 20,
        max_episode_tokens: int | None = None,
        max_context_tokens: int | None = 16_384,
        render_mode: str | None = None,
        responder: Responder | None = None,
        tokenizer: Any = None,
        backend_factory: Callable[[Task], ToolBackend] | None = None,
        models: Any = None,
        **suite_options: Any,
    ) -> None:
        if max_context_tokens is not None and max_context_tokens < 1:
            raise ValueError(f"max_context_tokens must be None or >= 1, got {max_context_tokens!r}")
        self.max_context_tokens = max_context_tokens
        if prompt_mode not in ("inline", "separate"):
            raise ValueError(f"prompt_mode must be 'inline' or 'separate', got {prompt_mode!r}")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens!r}")
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature!r}")
        rehearses = isinstance(responder, Rehearsal) or (responder is None and self.rehearses_by_default)
        if rehearser is None and isinstance(responder, Rehearsal):
            rehearser = responder.rehearser
        store = {"models": models} if models is not None else {}
        if rehearser is None and rehearses:
            rehearser = make_rehearser("policy", model=model, prompt_mode=prompt_mode, **store)
        if rehearser is not None and rehearser.prompt_mode != prompt_mode:
            raise ValueError(
                f"the rehearser's prompt_mode is {rehearser.prompt_mode!r} but the env asks for {prompt_mode!r}"
            )
        self.rehearser: Rehearser | None = rehearser
        if tokenizer is None:
            tokenizer = (
                rehearser.tokenizer if rehearser is not None else resolve_entry_point(TOKENIZER_LOADER)(model, **store)
            )
        self.renderer = ChatRenderer(tokenizer)
        self.prompt_mode: PromptMode = prompt_mode  # before the base class checks the responder against it
        if responder is None:
            # (`rehearses` implies a rehearser: one was made above if none was given)
            responder = Rehearsal(rehearser) if rehearses and rehearser is not None else None
        super().__init__(
            suite=suite,
            categories=categories,
            split=split,
            tasks=tasks,
            max_steps_per_turn=max_steps_per_turn,
            max_episode_tokens=max_episode_tokens,
            count_tokens=self._count_tokens,
            backend_factory=backend_factory,
            render_mode=render_mode,
            responder=responder,
            **suite_options,
        )
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self._initial_seed = seed

    def _count_tokens(self, text: str) -> int:
        return len(self.renderer.content_ids(text))

    # ------------------------------------------------------------------ gymnasium API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """As `TextToolUseEnv.reset`; also renders the prompt tokens. See the class docstring."""
        if seed is None and self._initial_seed is not None:
            seed, self._initial_seed = self._initial_seed, None
        self._tokens_ready = False
        obs, info = super().reset(seed=seed, options=options)
        assert self.task is not None and self.trajectory is not None
        first_turn = [Message(role=m.role, content=m.content) for m in self.trajectory.messages]  # the user's opening
        prompt = self.renderer.prompt_ids(first_turn, self.task.tools_at_turn(0))
        opener = self.renderer.open_ids("assistant")
        if prompt[len(prompt) - len(opener) :] != opener:
            raise RuntimeError("the rendered prompt does not end with the assistant opener; unsupported template")
        self.trajectory.segments = [
            Segment(Role.PROMPT, prompt[: len(prompt) - len(opener)], None, ""),
            Segment(Role.TEMPLATE, list(opener), None, ""),
        ]
        self._tokens_ready = True
        self._episode_tokens = len(prompt)
        self._rehearsals: list[RehearsalRecord] = []
        self.rehearsal_rows: list[RehearsalRecord] = []
        self.real_outputs: list[RealOutputRecord] = []
        self.cut_generations = 0
        info.update(self._token_info())
        return obs, info

    def step_coroutine(self, action: str) -> Generator[ToolCall, str, StepResult]:
        """`TextToolUseEnv.step_coroutine`, plus token bookkeeping and ``info["rehearsals"]``.

        The yielded calls are answered by `_respond` in `step`; a vector env answers them with
        `rehearse_request` / `accept_rehearsal` so one batched model call serves all envs.
        """
        self._rehearsals = []
        if not getattr(action, "stopped", True):
            self.cut_generations += 1
        obs, reward, terminated, truncated, info = yield from super().step_coroutine(action)
        if not (terminated or truncated):
            self._append(Role.TEMPLATE, self.renderer.open_ids("assistant"))
        info.update(self._token_info())
        info["rehearsals"] = self._rehearsals
        return obs, reward, terminated, truncated, info

    # ------------------------------------------------------------------ dynamics
    def respond(self, call: ToolCall) -> str:
        """Answer one call of the running step and record its tokens: a rehearsal (one model call; a vector
        env batches them with `rehearse_request` / `accept_rehearsal` instead) or the text responder's answer
        (a `Hybrid`'s real draws included) as OBSERVATION tokens. An answer from a real backend is also kept
        in ``real_outputs``.

        Raises:
            RuntimeError: no episode is running.
        """
        if self.episode_over:
            raise RuntimeError("respond() needs a running episode (call reset())")
        responder = self.responder
        if isinstance(responder, Rehearsal) and responder.rehearses_next():
            if self._context_full():
                responder.rehearsed(call)
                return self._respond_context_full()
            request = self.rehearse_request(call)
            (response,) = responder.rehearser.rehearse([request])
            return self.accept_rehearsal(call, response)
        # a text responder, or a Hybrid whose draw for this call is the real backend
        answer = responder.respond if isinstance(responder, Hybrid) else cast(ToolResponder, responder).respond
        start = len(self.trajectory.token_ids) if self.trajectory is not None else 0
        text = answer(call)
        self._append_tool_message(Role.OBSERVATION, self.renderer.content_ids(text), None, text, generated=False)
        if isinstance(responder, (RealBackend, Hybrid)):
            self._keep_real_output(call, text, start + len(self.renderer.open_ids("tool")))
        return text

    def needs_rehearsal(self) -> bool:
        """True when the next tool call is answered by the rehearser: the responder is a `Rehearsal` that
        rehearses this call (a `Hybrid` draws for it) and the sequence leaves room for a rehearsal within
        ``max_context_tokens``."""
        return isinstance(self.responder, Rehearsal) and self.responder.rehearses_next() and not self._context_full()

    def _keep_real_output(self, call: ToolCall, text: str, start: int) -> None:
        """Keep the real output `text` of `call` in ``real_outputs`` as a world-model target (`RealOutputRecord`):
        inline, the content ids at `start` and the close up to its stop token, as the trajectory holds them;
        separate, the simulator prompt the rehearser would have answered and the content ending as an assistant
        message (nothing is kept when the rehearser cannot render that prompt)."""
        assert self.task is not None and self.trajectory is not None
        content = self.renderer.content_ids(text)
        if self.prompt_mode == "inline":
            end = self.renderer.generation_end_ids("tool")
            close = self.renderer.close_ids("tool")
            # a close without a stop token (no end a rehearsal would write in the sequence): the content alone
            target = content + (end if close[: len(end)] == end else [])
            self.real_outputs.append(RealOutputRecord(call.to_openai(), text, target, start=start))
            return
        render = getattr(self.rehearser, "simulator_prompt_ids", None)
        if not callable(render):
            return
        request = RehearseRequest(
            tools=self.task.tools_at_turn(self._turn), messages=list(self.trajectory.messages), call=call
        )
        target = content + self.renderer.generation_end_ids("assistant")
        self.real_outputs.append(RealOutputRecord(call.to_openai(), text, target, prompt_ids=list(render(request))))

    def fork(self, responder: Responder | None = None, seed: int | None = None) -> ToolUseEnv:
        """`TextToolUseEnv.fork`, plus the token state: the copy's token sequence, rehearsal rows and counters
        are its own. With a `Rehearsal` responder the copy's prompt mode becomes its rehearser's."""
        twin = super().fork(responder, seed)
        twin._rehearsals = list(self._rehearsals)
        twin.rehearsal_rows = list(self.rehearsal_rows)
        twin.real_outputs = list(self.real_outputs)
        if isinstance(twin.responder, Rehearsal):
            twin.prompt_mode = twin.responder.rehearser.prompt_mode
        return twin

    def insert_message(self, role: str, text: str, content_ids: Sequence[int] | None = None) -> None:
        """Append a message before the pending ACT step, without re-rendering the sequence.

        The sequence must end with the assistant opener (it does after `reset` and after every non-final
        step); that opener is taken off, ``open_ids(role) + content_ids + close_ids(role)`` are appended
        (TEMPLATE, PROMPT, TEMPLATE) and the opener is appended again. The message joins
        ``trajectory.messages``; the token count is updated.

        Args:
            role: ``"user"`` or ``"system"``.
            text: the message content.
            content_ids: its token ids `(M,)`, appended as they are (None: tokenised here).

        Raises:
            ValueError: another role.
            RuntimeError: no episode is running, or the sequence does not end with the assistant opener.
        """
        if role not in ("user", "system"):
            raise ValueError(f"insert_message inserts user or system messages, got role {role!r}")
        if self.trajectory is None or self._done:
            raise RuntimeError("insert_message() needs a running episode (call reset())")
        segments = self.trajectory.segments
        opener = list(self.renderer.open_ids("assistant"))
        if not segments or segments[-1].role != Role.TEMPLATE or segments[-1].token_ids != opener:
            raise RuntimeError("the token sequence does not end with the assistant opener; nothing to insert before")
        segments.pop()
        self._episode_tokens -= len(opener)
        ids = list(content_ids) if content_ids is not None else self.renderer.content_ids(text)
        message_role = cast(MessageRole, role)  # "user" or "system": checked above
        self.trajectory.messages.append(Message(role=message_role, content=text))
        self._append(Role.TEMPLATE, self.renderer.open_ids(message_role))
        self._append(Role.PROMPT, ids, None, text)
        self._append(Role.TEMPLATE, self.renderer.close_ids(message_role))
        self._append(Role.TEMPLATE, opener)

    def _context_full(self) -> bool:
        limit = self.max_context_tokens
        return limit is not None and getattr(self, "_episode_tokens", 0) + self.max_new_tokens + 16 > limit

    def _respond_context_full(self) -> str:
        """Answer without a model call when a rehearsal would pass ``max_context_tokens``: an error
        observation (no loss), like any tool failure, so the token sequence stays well formed."""
        text = (
            f"Error: the episode's {self._episode_tokens} tokens leave no room for a rehearsal within "
            f"max_context_tokens={self.max_context_tokens}"
        )
        self._append_tool_message(Role.OBSERVATION, self.renderer.content_ids(text), None, text, generated=False)
        return text

    def rehearse_request(self, call: ToolCall) -> RehearseRequest:
        """The request for `call` at the current point of the episode (appends the tool-message opener)."""
        assert self.task is not None and self.trajectory is not None
        context = None
        if self.prompt_mode == "inline":
            self._append(Role.TEMPLATE, self.renderer.open_ids("tool"))
            context = self.trajectory.token_ids
        return RehearseRequest(
            tools=self.task.tools_at_turn(self._turn),
            messages=list(self.trajectory.messages),
            call=call,
            context_ids=context,
            seed=int(self.np_random.integers(2**31 - 1)),
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
        )

    def accept_rehearsal(self, call: ToolCall, response: RehearseResponse) -> str:
        """Record the rehearsed response to `call` (as made by `rehearse_request`) and return its text."""
        if isinstance(self.responder, Rehearsal):
            self.responder.rehearsed(call)  # a Hybrid spends its draw and remembers the call for its backend
        if not response.stopped:
            self.cut_generations += 1
        text = response.text
        if self.prompt_mode == "inline":
            # the rehearser continued the tool message, so it may have written the close's text before the
            # stop token too (Qwen: "\n</tool_response>"); that is template, not the tool's output
            text = self.renderer.generated_content(response.text, "tool")
        self._rehearsals.append(
            RehearsalRecord(
                call=call.to_openai(),
                text=text,
                token_ids=list(response.token_ids),
                logprobs=list(response.logprobs),
                prompt_ids=list(response.prompt_ids) if response.prompt_ids is not None else None,
                stopped=response.stopped,
            )
        )
        if self.prompt_mode == "inline":
            self._append(Role.REHEARSE, response.token_ids, response.logprobs, text)
            self._close("tool", response.token_ids)
        else:
            self.rehearsal_rows.append(self._rehearsals[-1])
            ids = self.renderer.content_ids(response.text)
            self._append_tool_message(Role.OBSERVATION, ids, None, response.text, generated=False)
        self._tool_tokens_recorded = True
        return text

    # ------------------------------------------------------------------ token bookkeeping
    def _record(self, message: Message, action: str | None = None) -> None:
        assert self.trajectory is not None
        self.trajectory.messages.append(message)
        if not getattr(self, "_tokens_ready", False):
            return
        if message.role == "assistant":
            ids: Sequence[int] | None = getattr(action, "token_ids", None)
            logprobs = getattr(action, "logprobs", None)
            generated = ids is not None
            if ids is None:  # a plain string: tokenise it and close the message (no logprobs to train on)
                ids, logprobs = self.renderer.content_ids(message.content), None
            self._append(Role.ACT, ids, logprobs, message.content)
            self._close("assistant", ids if generated else [])
        elif message.role == "tool":
            if getattr(self, "_tool_tokens_recorded", False):
                self._tool_tokens_recorded = False
                return
            self._append_tool_message(
                Role.OBSERVATION, self.renderer.content_ids(message.content), None, message.content, generated=False
            )
            self._tool_tokens_recorded = False
        else:  # user (or system) turn opening
            self._append(Role.TEMPLATE, self.renderer.open_ids(message.role))
            self._append(Role.PROMPT, self.renderer.content_ids(message.content), None, message.content)
            self._append(Role.TEMPLATE, self.renderer.close_ids(message.role))

    def _append_tool_message(self, role: Role, ids: list[int], logprobs, text: str, generated: bool) -> None:
        self._append(Role.TEMPLATE, self.renderer.open_ids("tool"))
        self._append(role, ids, logprobs, text)
        self._close("tool", ids if generated else [])
        self._tool_tokens_recorded = True

    def _close(self, role: MessageRole, generated_ids: Sequence[int]) -> None:
        """Append the part of the message's closing template that the model did not generate
        (`envace_gym.rendering.ChatRenderer.after_generation_ids`)."""
        self._append(Role.TEMPLATE, self.renderer.after_generation_ids(list(generated_ids), role))

    def _append(self, role: Role, ids: Sequence[int], logprobs: Sequence[float] | None = None, text: str = "") -> None:
        if not ids:
            return
        assert self.trajectory is not None
        self.trajectory.segments.append(
            Segment(role, list(ids), list(logprobs) if logprobs is not None else None, text)
        )
        self._episode_tokens += len(ids)

    def _token_info(self) -> dict[str, Any]:
        assert self.trajectory is not None
        counts = self.trajectory.tokens_per_role()
        return {
            "num_tokens": sum(counts.values()),
            "rehearsal_tokens": counts["REHEARSE"],
            "cut_generations": self.cut_generations,
        }
