"""`TextToolUseEnv`: the rules of a multi-turn tool-use task as a text-level Gymnasium environment.

It owns what does not depend on tokens: the suite's tasks, user turns, parsing of tool calls, the step
limits, termination, truncation and the verifier's reward. The registered envs (``EnvACE-Tool-v0``,
``EnvACE-Rehearse-v0``) are its token-level subclass `envace_gym.envs.tool_use.ToolUseEnv`; use this class
directly for a text-only agent that needs no tokenizer.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Generator, Sequence
from typing import Any, TypeVar, cast

import gymnasium as gym
import numpy as np

from envace_gym.parsing import ToolCallParseError, parse_tool_calls
from envace_gym.responders import Hybrid, RealBackend, Rehearsal, Responder, ToolResponder
from envace_gym.spaces import MAX_TEXT_LENGTH, printable_text, replace_surrogates, sanitize
from envace_gym.suites import Suite, ToolBackend, UserTurns, make_suite, user_turns
from envace_gym.types import GeneratedText, Message, Task, ToolCall, Trajectory

__all__ = ["TextToolUseEnv", "format_observation"]

_Env = TypeVar("_Env", bound="TextToolUseEnv")  # `fork` returns the type of the env it copies


def format_observation(messages: Sequence[Message]) -> str:
    """The observation text for the messages an env step produced.

    Tool results are each wrapped in ``<tool_response>...</tool_response>`` (the Hermes convention) and
    joined by newlines; user messages contribute their content. The structured messages are always in
    ``info["new_messages"]``: the text is for text-only agents.
    """
    parts = []
    for m in messages:
        if m.role == "tool":
            parts.append(f"<tool_response>\n{m.content}\n</tool_response>")
        else:
            parts.append(m.content)
    return "\n".join(parts)


def utf8_quarter_tokens(text: str) -> int:
    """The default token count of `TextToolUseEnv`: UTF-8 bytes / 4, rounded up (a module function, so envs pickle)."""
    return -(-len(text.encode("utf-8", "replace")) // 4)


class TextToolUseEnv(gym.Env[str, str]):
    """A tool-use task from a suite (BFCL v4 by default), text in and text out (see the module docstring).

    ## Description
    The agent is the ACT role of docs/design.md §1: each action is one assistant message. Tool calls in it
    (Hermes ``<tool_call>{...}</tool_call>`` blocks or BFCL's Python-call list ``[f(a=1)]``) are parsed with
    `envace_gym.parsing` (``json`` and ``ast`` only, nothing is executed) and sent to the task's backend, one
    fresh isolated backend per episode. The environment is text-level and never raises on an action: a
    malformed tool call becomes an error observation and is counted in ``info``.

    ## Action Space
    `gymnasium.spaces.Text` over every printable BMP character plus newline, tab and carriage return
    (`envace_gym.spaces.PRINTABLE_CHARSET`), ``min_length=0`` (an empty message is a valid action),
    ``max_length=1_000_000`` characters. Characters outside the charset are still accepted.

    ## Observation Space
    The same `Text` space (lengths 0 to 1,000,000 characters).

    | after           | observation                                                                  |
    |-----------------|------------------------------------------------------------------------------|
    | `reset`         | the first user turn                                                          |
    | tool calls      | each result as ``<tool_response>\\n...\\n</tool_response>``, newline-joined   |
    | a parse error   | the error message inside ``<tool_response>`` (fit to show the model)         |
    | no tool call    | the next user turn (the suite's `UserTurns`: BFCL's fixed turns in order),   |
    |                 | or ``""`` when the user ends the conversation and the episode terminates     |

    ## Rewards
    0.0 on every non-final step. On termination, the suite's ``verify(trajectory, backend)`` in [0, 1]
    (the whole trajectory and this episode's real backend in its final state). BFCL replays the ACT calls
    on fresh real backends (BFCL multi-turn: state and response checks per turn; single-turn:
    the AST checker). A truncated episode gets 0.0, as BFCL fails a forced quit. With ``env.verify = False``
    (a trainer that scores episodes with an LLM judge) termination runs no verifier and the reward is 0.0.

    ## Starting State
    ``reset(seed=..., options={"task_id": ...})`` plays the named task; without it a task is drawn
    uniformly with ``self.np_random``. The backend is built fresh from the task's initial configuration.

    ## Episode End
    * Termination: an action with no tool call when the user has nothing more to say (``user.reply``
      returns None; BFCL: after the last user turn), or, in single-step tasks such as BFCL single-turn,
      after the first action.
    * Truncation: ``max_steps_per_turn`` actions in one user turn without ending it, the last of them
      still calling a tool or malformed (BFCL's harness force-quits a turn after 20 calling messages, which
      is ``max_steps_per_turn=21`` here, since this count includes the closing message), or the episode's
      message text exceeding
      ``max_episode_tokens`` (counted with ``count_tokens``).

    ## Info
    ``task_id``, ``turn`` (0-based user turn), ``step_in_turn``, ``tool_calls`` (this step's parsed calls,
    OpenAI dicts), ``parse_error`` (str or None), ``num_parse_errors`` (episode total), ``new_messages``
    (this step's messages, OpenAI dicts), ``messages`` (the whole history), ``tools`` (OpenAI dicts, the
    tools visible now), ``episode_tokens``; on the final step also ``verifier`` (reward, valid, details).

    ## Arguments
    * ``suite`` (str): a registered suite name (`envace_gym.suites.make_suite`), default ``"bfcl"``.
    * ``categories`` (list[str] | None): suite categories; None is the suite's default.
    * ``split`` (str): ``"train"``, ``"test"`` or ``"all"``.
    * ``tasks`` (list[Task] | None): play these tasks instead of the suite's (the suite still verifies); a
      dict among them is made a task by the suite's ``make_task`` (the ``mcp`` suite's ``{"id", "prompt"}``).
    * ``max_steps_per_turn`` (int): ACT messages allowed per user turn, the closing one included; default 20.
    * ``max_episode_tokens`` (int | None): token budget over all message contents; None = unlimited.
    * ``count_tokens`` (callable | None): str -> int; default: UTF-8 bytes / 4, rounded up.
    * ``backend_factory`` (callable | None): Task -> ToolBackend; default the suite's real backend.
    * ``responder`` (`envace_gym.responders.ToolResponder` | None): who answers the tool calls; default
      ``RealBackend(backend_factory)``, a fresh real backend per episode. `set_responder` swaps it.
    * any other keyword: an option of the suite's factory, passed to `envace_gym.suites.make_suite` (the
      ``mcp`` suite's ``server``); a suite that does not take it raises TypeError.

    ## Methods beyond Gymnasium's
    `set_responder` (takes effect at the next `reset`), `fork` (an independent copy at the current point),
    `respond` (answer one call with the responder, as `step` does), `calls_per_turn`, `task_by_id`, `turn`.

    ## Version History
    * v0: initial version.
    """

    metadata = {"render_modes": ["ansi"]}

    def __init__(
        self,
        suite: str = "bfcl",
        categories: Sequence[str] | None = None,
        split: str = "train",
        tasks: Sequence[Task] | None = None,
        max_steps_per_turn: int = 20,
        max_episode_tokens: int | None = None,
        count_tokens: Callable[[str], int] | None = None,
        backend_factory: Callable[[Task], ToolBackend] | None = None,
        render_mode: str | None = None,
        responder: Responder | None = None,
        **suite_options: Any,
    ) -> None:
        if not isinstance(max_steps_per_turn, int) or max_steps_per_turn < 1:
            raise ValueError(f"max_steps_per_turn must be a positive int, got {max_steps_per_turn!r}")
        if max_episode_tokens is not None and max_episode_tokens < 1:
            raise ValueError(f"max_episode_tokens must be None or >= 1, got {max_episode_tokens!r}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be None or one of {self.metadata['render_modes']}, got {render_mode!r}")
        self.suite: Suite = make_suite(suite, **suite_options)
        self.tasks: list[Task] = (
            [self._as_task(t) for t in tasks] if tasks is not None else self.suite.tasks(categories, split)
        )
        if not self.tasks:
            raise ValueError(f"no tasks for suite={suite!r} categories={categories!r} split={split!r}")
        self._task_index = {t.id: i for i, t in enumerate(self.tasks)}
        self.max_steps_per_turn = max_steps_per_turn
        # a trainer that scores episodes itself (an LLM judge) turns this off: termination then touches no real
        # backend and the reward is 0 until the trainer sets it
        self.verify = True
        self.max_episode_tokens = max_episode_tokens
        self.count_tokens = count_tokens or utf8_quarter_tokens
        self.backend_factory = backend_factory or self.suite.make_backend
        self.render_mode = render_mode
        self.responder: Responder = (
            self._checked(responder) if responder is not None else RealBackend(self.backend_factory)
        )
        self._next_responder: Responder | None = None

        self.action_space: gym.spaces.Text = printable_text(min_length=0)
        self.observation_space: gym.spaces.Text = printable_text(min_length=0)

        self.task: Task | None = None
        self.trajectory: Trajectory | None = None
        self._done = True

    def _as_task(self, item: Any) -> Task:
        if isinstance(item, Task):
            return item
        make = getattr(self.suite, "make_task", None)
        if not callable(make):
            raise TypeError(
                f"tasks must be Task objects; suite {self.suite.name!r} makes none from {type(item).__name__}"
            )
        return make(item)

    # ------------------------------------------------------------------ gymnasium API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode; see the class docstring (Starting State).

        Raises:
            KeyError: ``options["task_id"]`` names no task of this env (a configuration error, not an action).
        """
        super().reset(seed=seed)
        options = options or {}
        if "task_id" in options:
            if options["task_id"] not in self._task_index:
                raise KeyError(f"task_id {options['task_id']!r} is not among this env's {len(self.tasks)} tasks")
            self.task = self.tasks[self._task_index[options["task_id"]]]
        else:
            self.task = self.tasks[int(self.np_random.integers(len(self.tasks)))]
        if self._next_responder is not None:
            self.responder, self._next_responder = self._next_responder, None
        self.responder.start(self.task)
        self.trajectory = Trajectory(task=self.task)
        self._turn = 0
        self._step_in_turn = 0
        self._num_parse_errors = 0
        self._episode_tokens = 0
        self.user: UserTurns = user_turns(self.suite, self.task)
        self._done = False
        new = self._open_turn(0, self.user.opening())
        info = self._info(new, calls=[], parse_error=None)
        return self._observe(new), info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Play one ACT message; see the class docstring. Never raises for any `action` string.

        Raises:
            RuntimeError: `step` before `reset`, or after the episode ended (a usage error).
        """
        gen = self.step_coroutine(action)
        try:
            call = next(gen)
            while True:
                call = gen.send(self._respond(call))
        except StopIteration as stop:
            return stop.value

    def step_coroutine(self, action: str) -> Generator[ToolCall, str, tuple[str, float, bool, bool, dict[str, Any]]]:
        """`step` as a coroutine: yields each parsed tool call, receives its response text, returns the step tuple.

        `step` drives it with `_respond`; a vector env drives many envs' coroutines in lockstep so that one
        batched model call answers the current call of every env (docs/design.md §3, "Batch the model").
        """
        if self.task is None or self.trajectory is None:
            raise RuntimeError("call reset() before step()")
        if self._done:
            raise RuntimeError("the episode has ended; call reset()")
        action = action if isinstance(action, str) else str(action)
        text = str(action)
        clean = replace_surrogates(text)
        if clean is not text:  # keep a generated action's ids and logprobs; only its text is fixed
            ids = getattr(action, "token_ids", None)
            action = (
                GeneratedText(clean, ids, getattr(action, "logprobs", None), getattr(action, "stopped", True))
                if ids is not None
                else clean
            )
        assistant = Message(role="assistant", content=str(action))
        self._record(assistant, action)
        self._step_in_turn += 1
        single_step = bool(self.task.metadata.get("single_step"))

        calls: list[ToolCall] = []
        parse_error: str | None = None
        try:
            calls = parse_tool_calls(str(action))
        except ToolCallParseError as err:
            parse_error = str(err)
            self._num_parse_errors += 1
        for i, call in enumerate(calls):  # ids unique within the episode
            call.id = f"call_{self._turn}_{self._step_in_turn}_{i}"
        assistant.tool_calls = calls or None

        new: list[Message] = []
        terminated = truncated = False
        reward = 0.0
        if parse_error is not None and not single_step:
            message = Message(role="tool", content=f"Error: {parse_error}")
            self._record(message)
            new = [message]
        elif calls and not single_step:
            for call in calls:
                result = yield call
                message = Message(
                    role="tool", content=replace_surrogates(str(result)), tool_call_id=call.id, name=call.name
                )
                self._record(message)
                new.append(message)
        else:  # no tool call (or a single-step task): the user turn ends
            reply = None if single_step else self.user.reply(self.trajectory)
            if reply:  # None (or no message) ends the conversation
                self._turn += 1
                self._step_in_turn = 0
                new = self._open_turn(self._turn, reply)
            elif getattr(self.user, "gave_up", False):  # a simulated user out of turns: cut, not finished
                truncated = True
            else:
                terminated = True

        if not terminated:
            if self._step_in_turn >= self.max_steps_per_turn and (calls or parse_error is not None):
                truncated = True
            elif self.max_episode_tokens is not None and self._episode_tokens > self.max_episode_tokens:
                truncated = True

        info = self._info(new, calls=calls, parse_error=parse_error)
        if terminated and self.verify:
            verdict = self.suite.verify(self.trajectory, self.backend)
            reward = float(verdict.reward)
            info["verifier"] = {"reward": reward, "valid": verdict.valid, "details": verdict.details}
        if terminated or truncated:
            self._done = True
            self.trajectory.reward = reward
            self.trajectory.terminated = terminated
            self.trajectory.truncated = truncated
        return self._observe(new), reward, terminated, truncated, info

    def render(self) -> str | None:
        """``"ansi"``: the whole message history as text."""
        if self.render_mode != "ansi" or self.trajectory is None:
            return None
        return "\n".join(f"[{m.role}] {m.content}" for m in self.trajectory.messages)

    # ------------------------------------------------------------------ responders and copies
    @property
    def backend(self) -> ToolBackend | None:
        """The responder's real backend in its current state (None for a rehearsal or a recording)."""
        return self.responder.backend

    def set_responder(self, responder: Responder) -> None:
        """Answer the tool calls of the following episodes with `responder` (from the next `reset` on).

        A `RealBackend` without a factory gets this env's ``backend_factory`` (the suite's by default).

        Raises:
            TypeError: `responder` is not a responder, or is a `Rehearsal` and this env keeps no tokens.
            ValueError: a `Rehearsal` whose rehearser has another prompt mode than this env.
        """
        self._next_responder = self._checked(responder)

    def _checked(self, responder: Responder) -> Responder:
        """`responder`, checked for this env (a `RealBackend` without a factory gets ``backend_factory``)."""
        if isinstance(responder, Rehearsal):
            if not self.keeps_tokens:
                raise TypeError(
                    f"{type(self).__name__} keeps no token sequence; Rehearsal needs a token-level env "
                    "(EnvACE-Tool-v0 or EnvACE-Rehearse-v0)"
                )
            mode = getattr(self, "prompt_mode", responder.rehearser.prompt_mode)
            if responder.rehearser.prompt_mode != mode:
                raise ValueError(
                    f"the rehearser's prompt_mode is {responder.rehearser.prompt_mode!r} but the env's is {mode!r}"
                )
        elif not all(callable(getattr(responder, m, None)) for m in ("start", "respond", "fork")):
            raise TypeError(f"a responder needs start, respond and fork (envace_gym.responders), got {responder!r}")
        if isinstance(responder, RealBackend) and responder.factory is None:
            responder.factory = self.backend_factory
        if isinstance(responder, Hybrid) and responder.real.factory is None:
            responder.real.factory = self.backend_factory
        return responder

    @property
    def upcoming_responder(self) -> Responder:
        """The responder of the next episode (the one `set_responder` gave, else the current one)."""
        return self._next_responder if self._next_responder is not None else self.responder

    keeps_tokens = False
    """Whether the env records the token sequence (`envace_gym.envs.tool_use.ToolUseEnv`: True)."""

    @property
    def episode_over(self) -> bool:
        """Whether the episode has ended, or none has started (`step` then raises)."""
        return self.trajectory is None or self._done

    def respond(self, call: ToolCall) -> str:
        """Answer one call of the running step with the responder and return the tool message content.

        Raises:
            RuntimeError: no episode is running.
        """
        if self.episode_over:
            raise RuntimeError("respond() needs a running episode (call reset())")
        # a Rehearsal only ever sits in a token-level env (`_checked`), whose `respond` overrides this one
        return cast(ToolResponder, self.responder).respond(call)

    def fork(self: _Env, responder: Responder | None = None, seed: int | None = None) -> _Env:
        """An independent copy at the current point of the episode that continues identically.

        The copy has its own trajectory, user, counters and random generator (a copy of this env's, or one
        seeded with `seed`); its responder is ``self.responder.fork()`` (a real backend's state copied, a
        rehearser shared), or `responder` (checked as by `set_responder`; a `RealBackend` that has no backend
        yet starts one in the task's initial state; a `Hybrid` starts the episode with the calls so far
        remembered, so its first real call catches its backend up). Steps on the copy never touch this env or
        its backend.

        Raises:
            RuntimeError: no episode is running.
            TypeError, ValueError: as `set_responder`, for a given `responder`.
        """
        if self.task is None or self.trajectory is None:
            raise RuntimeError("fork() needs a running episode (call reset())")
        if responder is not None:
            responder = self._checked(responder)
            if isinstance(responder, RealBackend) and responder.backend is None:
                responder.start(self.task)
            elif isinstance(responder, Hybrid):
                responder.start(self.task)
                responder.remember([c for turn in self.calls_per_turn() for step in turn for c in step])
        twin = copy.copy(self)
        keep = {id(self.task): self.task}  # the task is shared, read-only data
        twin.trajectory = copy.deepcopy(self.trajectory, keep)
        twin.user = copy.deepcopy(self.user, dict(keep))
        twin.responder = responder if responder is not None else self.responder.fork()
        twin._next_responder = None
        twin.np_random = copy.deepcopy(self.np_random) if seed is None else np.random.Generator(np.random.PCG64(seed))
        return twin

    # ------------------------------------------------------------------ overridable dynamics
    def _respond(self, call: ToolCall) -> str:
        """The environment's response to one call during `step` (`ToolUseEnv` also records its tokens)."""
        return self.respond(call)

    # ------------------------------------------------------------------ helpers
    def _open_turn(self, turn: int, messages: Sequence[Message]) -> list[Message]:
        """Record and return the `messages` (from `user`) that open user turn `turn`.

        At a turn where the task reveals held-out tools (BFCL miss_func), their schemas are prepended to the
        first user message as a JSON list followed by a newline, as BFCL's prompting harness does
        (``DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING``); ``info["tools"]`` lists them from then on.
        """
        assert self.task is not None
        new = [Message(role=m.role, content=replace_surrogates(str(m.content))) for m in messages]
        revealed = self.task.held_out_tools.get(turn) if turn > 0 else None
        if revealed and new:
            schemas = json.dumps([t.to_openai()["function"] for t in revealed], ensure_ascii=False)
            new[0] = Message(role=new[0].role, content=f"{schemas}\n{new[0].content}")
        for m in new:
            self._record(m)
        return new

    def _record(self, message: Message, action: str | None = None) -> None:
        """Append a message to the history. `action` is the raw ACT action (for subclasses that track tokens)."""
        assert self.trajectory is not None
        self.trajectory.messages.append(message)
        self._episode_tokens += self.count_tokens(message.content)

    def _observe(self, messages: Sequence[Message]) -> str:
        return sanitize(format_observation(messages), MAX_TEXT_LENGTH)

    def _info(self, new: Sequence[Message], calls: Sequence[ToolCall], parse_error: str | None) -> dict[str, Any]:
        assert self.task is not None and self.trajectory is not None
        return {
            "task_id": self.task.id,
            "turn": self._turn,
            "step_in_turn": self._step_in_turn,
            "tool_calls": [c.to_openai() for c in calls],
            "parse_error": parse_error,
            "num_parse_errors": self._num_parse_errors,
            "new_messages": [m.to_dict() for m in new],
            "messages": [m.to_dict() for m in self.trajectory.messages],
            "tools": [t.to_openai() for t in self.task.tools_at_turn(self._turn)],
            "episode_tokens": self._episode_tokens,
        }

    @property
    def turn(self) -> int:
        """The current user turn, 0-based (``info["turn"]`` of the last step)."""
        return self._turn

    def task_by_id(self, task_id: str) -> Task:
        """The task of this env with id `task_id`.

        Raises:
            KeyError: no task of this env has that id.
        """
        if task_id not in self._task_index:
            raise KeyError(f"task_id {task_id!r} is not among this env's {len(self.tasks)} tasks")
        return self.tasks[self._task_index[task_id]]

    def calls_per_turn(self) -> list[list[list[ToolCall]]]:
        """The parsed ACT calls so far: turns × steps × calls (`Trajectory.calls_per_turn`)."""
        assert self.trajectory is not None
        return self.trajectory.calls_per_turn()
