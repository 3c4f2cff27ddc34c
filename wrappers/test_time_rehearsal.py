"""`TestTimeRehearsal`: rehearse privately N times, keep a bounded memory, then act for real (docs/design.md §1).

Why per user turn, not per episode: the committed context differs at every user turn (new request, real
observations of the earlier turns), so a memory written before the first turn says nothing useful about
the third; rehearsing at the opening of each turn, from exactly the committed context, is what the
method describes ("rehearse privately before acting for real"). Within a turn the policy then acts on real
observations, which a rehearsal cannot predict better than the real backend already tells it.

Memory format (token in, token out): one ``user`` message appended to the committed token sequence just
before the turn's first committed ACT step, i.e. the trailing assistant opener is taken off, the memory
message is appended piecewise (``open_ids("user")`` + content ids + ``close_ids("user")``) and the opener
is appended again. Nothing already in the sequence is re-rendered. The content starts with the fixed
header `MEMORY_HEADER`; what follows depends on ``memory``:

* ``"trace"`` (the default): a structured trace built from the attempts' own messages, with no text
  generated for it (`trace_memory`): one line per distinct (tool call, rehearsed output) pair, in the order
  the attempts made them, prefixed by the attempts that made it (so agreement shows) and marked
  ``[error]`` when the rehearsed output is an error, then each attempt's closing reply. A model never
  trained on English critiques can still be taught to read it: it is made of the calls and outputs the
  model itself writes.
* ``"outcomes"``: the trace's call lines only, without the attempts' closing replies: what the calls
  returned, not what an attempt said when it stopped (a small model copies a nearby ``reply: Done.`` and
  stops early).
* ``"summary"``: the policy critiques each attempt and summarises attempts and critiques in English (for
  instruction-tuned models); the summary ids are kept exactly as generated (the end-of-message id
  dropped). Critic and summariser see what the acting policy sees: the committed history, with the system
  prompt and the tools, then their instruction.

The content is at most ``memory_tokens`` tokens (a trace keeps whole lines and says how many it dropped).
With ``restate_request=True`` a second ``user`` message follows the memory, the turn's request again, so the
request stays next to the ACT step that carries it out: a small model copies a call's arguments from nearby
text, and a memory full of other calls' arguments sits between the request and the act otherwise.
Roles: the memory's content is PROMPT and its pieces TEMPLATE (no loss: it is context, not an action). The
message is also appended to ``trajectory.messages`` (role ``user``), so a whole re-render of the history
shows it where it was.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, Literal

import gymnasium as gym
import numpy as np
from gymnasium.utils import RecordConstructorArgs

from envace_gym.parsing import format_tool_calls
from envace_gym.rehearsal import RehearseRequest, RehearseResponse, requests_by_setting
from envace_gym.responders import ConstantResponse, RealBackend, Rehearsal
from envace_gym.types import AttemptRecord, Message, Role, Segment, ToolCall
from wrappers.fidelity import is_error_output

__all__ = ["TestTimeRehearsal", "MEMORY_HEADER", "trace_memory"]

Mode = Literal["parallel", "sequential"]
Memory = Literal["trace", "outcomes", "summary"]
AttemptOutputs = Literal["rehearsed", "null", "real"]

MEMORY_HEADER = (
    "Rehearsal memory (private notes from {n} rehearsal attempts; their tool outputs were imagined, not real):\n"
)
"""Header of the memory message; ``{n}`` is the number of attempts."""
_HEADER_LINE = re.compile(
    "^"
    + re.escape(MEMORY_HEADER.split("{n}")[0])
    + r"\d+"
    + re.escape(MEMORY_HEADER.split("{n}")[1].rstrip("\n"))
    + r"\n?"
)

CRITIC_SYSTEM = (
    "You review a private rehearsal of a tool-using assistant. The tool outputs in the rehearsal were "
    "imagined by a simulator, not produced by the real tools."
)
CRITIC_USER = (
    CRITIC_SYSTEM + "\n\nUser request:\n{request}\n\nRehearsal attempt:\n{attempt}\n\n"
    "In one or two sentences: were the right tools called with the right arguments, and what should the "
    "real attempt do differently?"
)
SUMMARY_USER = (
    "User request:\n{request}\n\nRehearsal attempts and their critiques:\n{attempts}\n\n"
    "Write a short memory for the real attempt: which tool calls to make, with which arguments, and which "
    "mistakes to avoid."
)
EARLIER_ATTEMPTS = "Earlier private rehearsal attempts of this request and their critiques:\n{attempts}"

_TRANSCRIPT_CHARS = 400  # per message, in transcripts shown to the critic and summariser
_TRACE_CHARS = 200  # per call, output or reply in a trace line


def _shorten(text: str, limit: int = _TRACE_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + " ..."


def trace_memory(
    attempts: Sequence[dict[str, Any]],
    header: str,
    count_tokens: Callable[[str], int],
    max_tokens: int,
    with_replies: bool = True,
) -> str:
    """The ``"trace"`` rehearsal memory of `attempts` (module docstring), at most `max_tokens` tokens.

    Each line is ``"<attempts>: <call> -> <output>"``: the call as the policy writes it inside a Hermes
    ``<tool_call>`` block (``{"name": ..., "arguments": {...}}``), the rehearsed output, ``<attempts>`` the
    1-based attempts that made this call and got this output (``"1,2"`` where two attempts agree), and
    `` [error]`` appended when the output is an error; a message the env could not parse stands for its
    call. Then (with `with_replies`; the ``"outcomes"`` memory has none) ``"<attempts>: reply: <text>"`` for each
    distinct closing reply. Calls, outputs and replies
    are cut to 200 characters. Lines are kept whole, in order, while the text fits; ``"(+k more lines)"``
    says how many were dropped.

    Args:
        attempts: the ``info["rehearsal"]["attempts"]`` dicts (`TestTimeRehearsal`): their ``messages``
            (OpenAI dicts from the fork point on).
        header: the text the memory starts with (`MEMORY_HEADER`, formatted).
        count_tokens: the token length of a text (the env's ``renderer.content_ids``).
        max_tokens: the bound, tokens; the header alone must fit.
        with_replies: add the reply lines (False: the ``"outcomes"`` memory).

    Raises:
        ValueError: the header alone is longer than `max_tokens`.
    """
    calls: dict[tuple[str, str], list[int]] = {}
    reply_lines: dict[str, list[int]] = {}
    for k, attempt in enumerate(attempts, 1):
        msgs = attempt["messages"]
        for i, m in enumerate(msgs):
            if m["role"] != "assistant":
                continue
            # the JSON line of the Hermes block the policy writes: the pieces a small model knows, on one line
            made = [
                format_tool_calls([ToolCall.from_openai(c)], "hermes").splitlines()[1]
                for c in m.get("tool_calls") or []
            ]
            outputs = []
            for later in msgs[i + 1 :]:
                if later["role"] != "tool":
                    break
                outputs.append(later["content"])
            if not made and outputs:  # unparsed: the env answered its text with one error observation
                made = [m["content"]]
            if not made:
                reply_lines.setdefault(_shorten(m["content"]), []).append(k)
            for call, output in zip(made, outputs):
                seen = calls.setdefault((_shorten(call), _shorten(output)), [])
                if k not in seen:
                    seen.append(k)
    lines = [
        f"{','.join(map(str, ks))}: {call} -> {output}" + (" [error]" if is_error_output(output) else "")
        for (call, output), ks in calls.items()
    ]
    if with_replies:
        lines += [f"{','.join(map(str, ks))}: reply: {text}" for text, ks in reply_lines.items() if text]
    if count_tokens(header) > max_tokens:
        raise ValueError(f"the memory header alone is {count_tokens(header)} tokens, over the bound of {max_tokens}")
    text = header.rstrip("\n")
    for j, line in enumerate(lines):
        if count_tokens(text + "\n" + line) > max_tokens:
            more = f"(+{len(lines) - j} more lines)"
            return text + "\n" + more if count_tokens(text + "\n" + more) <= max_tokens else text
        text += "\n" + line
    return text


class _InlineRehearser:
    """The `envace_gym.rehearsal.Rehearser` interface (inline mode) over a policy's ``generate``/``decode``.

    `wrappers` does not import `agents` (docs/design.md §2), so this adapter duck-types the policy: it continues
    each request's ``context_ids`` up to an end-of-message id, like `agents.policy.PolicyRehearser`.
    """

    prompt_mode = "inline"

    def __init__(self, policy: Any) -> None:
        self.policy = policy
        self.tokenizer = policy.tokenizer

    def rehearse(self, requests: Sequence[RehearseRequest]) -> list[RehearseResponse]:
        """One batched generate call per (max_new_tokens, temperature) setting; raises ValueError for a
        request without ``context_ids``."""
        if any(not r.context_ids for r in requests):
            raise ValueError("inline rehearsal needs the request's context_ids")
        out: list[RehearseResponse | None] = [None] * len(requests)
        for (max_new, temperature), idx in requests_by_setting(requests).items():
            gens = self.policy.generate(
                [list(requests[i].context_ids or ()) for i in idx],
                max_new_tokens=max_new,
                temperature=temperature,
                seeds=[requests[i].seed for i in idx],
            )
            for i, g in zip(idx, gens):
                out[i] = RehearseResponse(self.policy.decode(g.token_ids), g.token_ids, g.logprobs, None, g.stopped)
        assert all(o is not None for o in out), "the engine answered fewer rows than it was given"
        return out  # type: ignore[return-value]


class TestTimeRehearsal(gym.Wrapper, RecordConstructorArgs):
    """Test-time rehearsal: N private rehearsal attempts per user turn, a bounded memory, then the real act.

    Contract (the agent loop does not change): after `reset`, and after every `step` that opens a new user
    turn, the wrapper has already (1) run ``n`` rehearsal attempts of the coming turn in private rehearse
    copies of the env, (2) built a memory of at most ``memory_tokens`` tokens from them (``"trace"``: the
    attempts' calls and rehearsed outputs, no model call; ``"outcomes"``: the same without the attempts'
    replies; ``"summary"``: the policy critiques each attempt,
    then summarises attempts and critiques) and (3) appended that memory to the committed token sequence
    (module docstring: formats). The agent then acts as always on
    ``env.unwrapped.trajectory.token_ids`` and calls `step`; the committed step runs against the wrapped
    env's real backend. With ``n=0`` the wrapper does nothing. `rehearse` can also be called by hand.

    Rehearse copies: ``env.unwrapped.fork(responder=Rehearsal(...), seed=...)`` (`ToolUseEnv.fork`: its own
    episode state and random generator), so every tool call in an attempt is answered by the REHEARSE role
    of ``rehearser_policy`` (or of ``policy``) and the real backend is never reached. An attempt ACTs (``policy``,
    ``attempt_temperature``) until its turn ends, its episode ends or ``attempt_max_steps`` ACT steps (by
    default the env's per-turn limit, so a whole turn is rehearsed). ``parallel``: the n attempts start
    from the same committed context, and their ACT steps are batched in one generate call. ``sequential``:
    attempt k starts from the committed context plus a user message holding the memory of attempts 1..k-1
    (with their critiques in ``"summary"`` mode). Critic and summariser prompts are the committed context
    (system prompt, tools, history) followed by their instruction, the attempts' messages cut to 400
    characters each.

    Controls (issue-level diagnostics of where a gain or a loss comes from): ``attempt_outputs="null"`` answers
    every attempt call with a constant (`envace_gym.responders.ConstantResponse`: the memory then holds the
    attempts' calls and nothing about outcomes, the null-rehearser control); ``attempt_outputs="real"`` answers
    them with a copy of the committed env's real backend at its current state (an oracle memory, for diagnosis
    only: if acting on it fails too, reading the memory is the problem, not the world model);
    ``memory_provider`` replaces the attempts altogether by a given memory (e.g. another task's: if that
    scores the same, the memory is ignored).

    ``info["rehearsal"]``: None on steps that open no turn; else a dict with

    * ``turn`` (int): the user turn rehearsed; ``mode`` (str); ``n`` (int).
    * ``attempts``: n dicts: ``messages`` (the attempt's messages, OpenAI dicts, from the fork point on),
      ``steps`` (int, ACT steps), ``tool_calls`` (int), ``ended`` (``"turn"``, ``"episode"`` or ``"steps"``),
      ``act_tokens``, ``rehearse_tokens`` (int, generated tokens), ``start_tokens`` (int, length of the
      context the attempt started from: equal across parallel attempts, growing across sequential ones).
    * ``memory_kind``: ``"trace"``, ``"outcomes"``, ``"summary"`` or ``"provided"`` (``memory_provider``; no attempts);
      ``critiques``: n strings (none for a trace);
      ``critique_tokens``: n ints.
    * ``memory``: the memory message content (str); ``memory_tokens``: its content length in tokens
      (<= the ``memory_tokens`` argument); ``summary_tokens``: generated summary tokens (0 for a trace).
    * ``context_tokens_before``, ``context_tokens_after``: length of the committed sequence around the insertion.
    * ``generated_tokens``: all tokens generated for this turn's rehearsal (ACT, REHEARSE, critiques, summary).

    Examples:
        >>> from agents.policy import load_policy  # doctest: +SKIP
        >>> env = TestTimeRehearsal(RealTools(gym.make("EnvACE-Rehearse-v0", model="tiny-random")),  # doctest: +SKIP
        ...                         load_policy("tiny-random"), n=2, mode="parallel")
        >>> obs, info = env.reset(seed=0)  # doctest: +SKIP
        >>> len(info["rehearsal"]["attempts"])  # doctest: +SKIP
        2

    Args:
        env: an env whose ``unwrapped`` is a token-level `ToolUseEnv` (``EnvACE-Tool-v0``, or
            ``EnvACE-Rehearse-v0`` wrapped in `RealTools`).
        policy: an `agents.policy.Policy` (anything with ``act``, ``generate``, ``decode``, ``renderer``,
            ``stop_ids`` and ``tokenizer``) with the env's tokenizer.
        n: rehearsal attempts per user turn (>= 0).
        mode: ``"parallel"`` or ``"sequential"``.
        memory_tokens: bound on the memory message's content, in tokens (header included).
        memory: ``"trace"`` (built from the attempts, for any model, and the only kind a small model
            trained on calls and outputs can read), ``"outcomes"`` (the trace without the attempts' closing
            replies) or ``"summary"`` (English critiques and a summary the
            policy writes; for instruction-tuned models).
        rehearser_policy: who plays REHEARSE in the attempts (the paper's base-model control): a policy
            with the env's vocabulary (inline mode), or a ready `envace_gym.rehearsal.Rehearser` (any prompt
            mode, e.g. a separate-mode `agents.policy.PolicyRehearser` for another vocabulary); None:
            ``policy`` itself, inline.
        attempt_max_steps: ACT steps per attempt (>= 1); None: the env's ``max_steps_per_turn``.
        max_new_tokens: cap per generated ACT message and rehearsed tool response; None: the env's.
        rehearse_max_new_tokens: cap per rehearsed tool response when it differs from the ACT cap (a trainer's
            ``rehearse_max_new_tokens``); None: as ``max_new_tokens``.
        critique_tokens: cap per critique (>= 1; ``"summary"`` only).
        attempt_temperature: sampling temperature of attempts (ACT and REHEARSE); > 0 keeps parallel
            attempts from being identical.
        seed: seeds the attempts' sampling; each `reset` with a seed reseeds it.
        attempt_outputs: who answers the attempts' calls: ``"rehearsed"`` (the rehearser, the method),
            ``"null"`` (a constant) or ``"real"`` (the real backend's state copied; the env's responder must
            be a `envace_gym.responders.RealBackend`).
        memory_provider: called with the unwrapped env at the opening of each user turn, returns the memory
            content to insert (after the header, cut to ``memory_tokens``) instead of running attempts; None:
            attempts as configured.
        keep_attempt_rows: also keep each attempt's tokens as an `envace_gym.types.AttemptRecord` (its
            generated segments with their sampling logprobs, the context as segments without) in
            ``self.attempt_rows`` (the last `rehearse` call's, in attempt order), for rehearsal-aware RL
            (`agents.rollout.collect_rollouts` with ``rehearsal_n``); off: nothing is kept.
        restate_request: after the memory, insert the user messages that opened the turn again, whole (module
            docstring); the memory's ``memory_tokens`` bound does not count them. In ``sequential`` mode an
            attempt that reads the earlier attempts' notes gets the request after them too.

    Raises:
        TypeError: the env keeps no token sequence, or `policy` lacks ``act``.
        ValueError: ``n < 0``, an unknown mode, memory or attempt_outputs, ``memory_tokens`` not larger than the
            header, a bad step, token or temperature argument, a policy (or a rehearser policy) whose vocabulary
            differs from the env's tokenizer, or ``attempt_outputs="real"`` on an env without a real backend.

    Change log:
        * v0.1.0: initial version.
        * v0.2.0: ``memory="trace"`` (the default), attempts rehearse the whole turn by default, and critic
          and summariser see the committed context.
        * v0.3.0: ``attempt_outputs`` and ``memory_provider`` (the controls).
        * v0.4.0: ``keep_attempt_rows`` (rehearsal-aware RL).
        * v0.5.0: ``restate_request``.
        * v0.6.0: ``memory="outcomes"``.
    """

    __test__ = False  # not a pytest class despite the name

    def __init__(
        self,
        env: gym.Env,
        policy: Any,
        n: int = 2,
        mode: Mode = "parallel",
        memory_tokens: int = 256,
        rehearser_policy: Any = None,
        attempt_max_steps: int | None = None,
        max_new_tokens: int | None = None,
        rehearse_max_new_tokens: int | None = None,
        critique_tokens: int = 64,
        attempt_temperature: float = 1.0,
        seed: int | None = None,
        memory: Memory = "trace",
        attempt_outputs: AttemptOutputs = "rehearsed",
        memory_provider: Callable[[Any], str] | None = None,
        keep_attempt_rows: bool = False,
        restate_request: bool = False,
    ) -> None:
        RecordConstructorArgs.__init__(
            self,
            n=n,
            mode=mode,
            memory=memory,
            memory_tokens=memory_tokens,
            attempt_max_steps=attempt_max_steps,
            max_new_tokens=max_new_tokens,
            rehearse_max_new_tokens=rehearse_max_new_tokens,
            critique_tokens=critique_tokens,
            attempt_temperature=attempt_temperature,
            seed=seed,
            attempt_outputs=attempt_outputs,
            restate_request=restate_request,
        )
        gym.Wrapper.__init__(self, env)
        base: Any = env.unwrapped  # a ToolUseEnv (checked below); gym.Env declares none of its attributes
        if not getattr(base, "keeps_tokens", False):
            raise TypeError(
                "TestTimeRehearsal wraps a token-level ToolUseEnv (EnvACE-Tool-v0 or -Rehearse-v0), got "
                f"{type(base).__name__}"
            )
        if not hasattr(policy, "act"):
            raise TypeError(f"policy must be an agents.policy.Policy, got {type(policy).__name__}")
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"n must be an int >= 0, got {n!r}")
        if mode not in ("parallel", "sequential"):
            raise ValueError(f"mode must be 'parallel' or 'sequential', got {mode!r}")
        if memory not in ("trace", "outcomes", "summary"):
            raise ValueError(f"memory must be 'trace', 'outcomes' or 'summary', got {memory!r}")
        if attempt_outputs not in ("rehearsed", "null", "real"):
            raise ValueError(f"attempt_outputs must be 'rehearsed', 'null' or 'real', got {attempt_outputs!r}")
        if attempt_outputs == "real" and not isinstance(base.upcoming_responder, RealBackend):
            raise ValueError(
                "attempt_outputs='real' copies the env's real backend; this env's responder is "
                f"{type(base.upcoming_responder).__name__} (wrap the env in RealTools or use EnvACE-Tool-v0)"
            )
        if attempt_max_steps is not None and (not isinstance(attempt_max_steps, int) or attempt_max_steps < 1):
            raise ValueError(f"attempt_max_steps must be None or an int >= 1, got {attempt_max_steps!r}")
        if rehearse_max_new_tokens is not None and rehearse_max_new_tokens < 1:
            raise ValueError(f"rehearse_max_new_tokens must be None or >= 1, got {rehearse_max_new_tokens!r}")
        if critique_tokens < 1 or (max_new_tokens is not None and max_new_tokens < 1):
            raise ValueError(
                f"critique_tokens and max_new_tokens must be >= 1, got {critique_tokens!r}, {max_new_tokens!r}"
            )
        if attempt_temperature < 0:
            raise ValueError(f"attempt_temperature must be >= 0, got {attempt_temperature!r}")
        if len(policy.tokenizer) != len(base.renderer.tokenizer):
            raise ValueError(
                f"the policy's vocabulary ({len(policy.tokenizer)}) differs from the env's tokenizer "
                f"({len(base.renderer.tokenizer)}); the policy must act on the env's token sequence"
            )
        header_len = len(base.renderer.content_ids(MEMORY_HEADER.format(n=n)))
        if memory_tokens <= header_len:
            raise ValueError(
                f"memory_tokens must exceed the memory header's {header_len} tokens, got {memory_tokens!r}"
            )
        self.policy = policy
        self.n = n
        self.mode: Mode = mode
        self.memory: Memory = memory
        self.memory_tokens = memory_tokens
        self.attempt_max_steps = attempt_max_steps
        self.max_new_tokens = max_new_tokens
        self.rehearse_max_new_tokens = rehearse_max_new_tokens
        self.critique_tokens = critique_tokens
        self.attempt_temperature = attempt_temperature
        self.attempt_outputs: AttemptOutputs = attempt_outputs
        self.memory_provider = memory_provider
        self.keep_attempt_rows = bool(keep_attempt_rows)
        self.restate_request = bool(restate_request)
        self.attempt_rows: list[AttemptRecord] = []
        self._rng = np.random.default_rng(seed)
        if rehearser_policy is not None and hasattr(rehearser_policy, "rehearse"):
            self.rehearser = rehearser_policy  # a ready Rehearser (e.g. agents.policy.PolicyRehearser)
        else:
            reh = rehearser_policy if rehearser_policy is not None else policy
            if reh is not policy and reh.tokenizer.get_vocab() != base.renderer.tokenizer.get_vocab():
                raise ValueError(
                    "rehearser_policy has another vocabulary than the env; pass a separate-mode Rehearser "
                    "(agents.policy.PolicyRehearser(policy, prompt_mode='separate')) instead"
                )
            self.rehearser = _InlineRehearser(reh)
        self.last_rehearsal: dict[str, Any] | None = None

    # ------------------------------------------------------------------ gymnasium API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Reset the wrapped env, then rehearse its first user turn (``info["rehearsal"]``)."""
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        obs, info = self.env.reset(seed=seed, options=options)
        info["rehearsal"] = self.rehearse() if self.n else None
        return obs, info

    def step(self, action: str):
        """Commit `action` on the wrapped env; when the step opens a new user turn, rehearse that turn."""
        obs, reward, terminated, truncated, info = self.env.step(action)
        opened = not (terminated or truncated) and info.get("step_in_turn") == 0
        info["rehearsal"] = self.rehearse() if (self.n and opened) else None
        return obs, reward, terminated, truncated, info

    # ------------------------------------------------------------------ rehearsal
    def rehearse(self) -> dict[str, Any]:
        """Run the attempts, build the memory (critiques and summary in ``"summary"`` mode) for the pending
        ACT step and insert it.

        Returns:
            the ``info["rehearsal"]`` dict (class docstring); also kept in ``self.last_rehearsal``.

        Raises:
            RuntimeError: the episode has ended or has not started.
        """
        base: Any = self.env.unwrapped
        if base.episode_over:
            raise RuntimeError("rehearse() needs a running episode (call reset())")
        context = [Message(m.role, m.content) for m in base.trajectory.messages]  # what the policy sees now
        tools = base.task.tools_at_turn(base.turn)
        request = self._current_request(base)
        before = len(base.trajectory.token_ids)
        attempts: list[dict[str, Any]] = []
        critiques: list[tuple[str, int]] = []
        summary = self.memory == "summary"
        self.attempt_rows = []
        if self.memory_provider is not None:
            return self._provided(base, before)
        if self.mode == "parallel":
            attempts = self._run_attempts([self._fork(base) for _ in range(self.n)])
            critiques = self._critique(context, tools, request, attempts) if summary else []
        else:
            for _ in range(self.n):
                fork = self._fork(base)
                if attempts:
                    if summary:
                        notes = EARLIER_ATTEMPTS.format(attempts=self._digest(attempts, [c for c, _ in critiques]))
                    else:
                        notes = self._trace(base, attempts, len(attempts))
                    self._insert(fork, notes, fork.renderer.content_ids(notes))
                (attempt,) = self._run_attempts([fork])
                attempts.append(attempt)
                if summary:
                    critiques.extend(self._critique(context, tools, request, [attempt]))
        texts = [c for c, _ in critiques]
        header = MEMORY_HEADER.format(n=self.n)
        summary_tokens = 0
        if summary:
            header_ids = base.renderer.content_ids(header)
            prompt = self._context_prompt(
                context, tools, SUMMARY_USER.format(request=request, attempts=self._digest(attempts, texts))
            )
            (gen,) = self.policy.generate(
                [prompt], max_new_tokens=self.memory_tokens - len(header_ids), temperature=0.0, seeds=[self._seed()]
            )
            summary_ids = [t for t in gen.token_ids if t not in self.policy.stop_ids]
            content, content_ids = header + self.policy.decode(summary_ids), header_ids + summary_ids
            summary_tokens = len(gen.token_ids)
        else:
            content = self._trace(base, attempts, self.n)
            content_ids = base.renderer.content_ids(content)
        self._insert(base, content, content_ids)
        record = {
            "turn": base.turn,
            "mode": self.mode,
            "n": self.n,
            "memory_kind": self.memory,
            "attempts": attempts,
            "critiques": texts,
            "critique_tokens": [k for _, k in critiques],
            "memory": content,
            "memory_tokens": len(content_ids),
            "summary_tokens": summary_tokens,
            "context_tokens_before": before,
            "context_tokens_after": len(base.trajectory.token_ids),
            "generated_tokens": sum(a["act_tokens"] + a["rehearse_tokens"] for a in attempts)
            + sum(k for _, k in critiques)
            + summary_tokens,
        }
        self.last_rehearsal = record
        return record

    def _provided(self, base: Any, before: int) -> dict[str, Any]:
        """Insert the `memory_provider`'s memory under the header, cut to whole lines within ``memory_tokens``."""
        assert self.memory_provider is not None
        header = MEMORY_HEADER.format(n=self.n)

        def count(text: str) -> int:
            return len(base.renderer.content_ids(text))

        provided = _HEADER_LINE.sub("", str(self.memory_provider(base)), count=1)  # any N's header, once
        lines = [line for line in provided.splitlines() if line]
        kept: list[str] = []
        for line in lines:
            if count(header + "\n".join([*kept, line])) > self.memory_tokens:
                break
            kept.append(line)
        content = header + "\n".join(kept)
        content_ids = base.renderer.content_ids(content)
        self._insert(base, content, content_ids)
        record = {
            "turn": base.turn,
            "mode": self.mode,
            "n": self.n,
            "memory_kind": "provided",
            "attempts": [],
            "critiques": [],
            "critique_tokens": [],
            "memory": content,
            "memory_tokens": len(content_ids),
            "summary_tokens": 0,
            "context_tokens_before": before,
            "context_tokens_after": len(base.trajectory.token_ids),
            "generated_tokens": 0,
        }
        self.last_rehearsal = record
        return record

    def _trace(self, base: Any, attempts: list[dict[str, Any]], n: int) -> str:
        """The ``"trace"`` (or ``"outcomes"``) memory of `attempts` (`trace_memory`) under the header for `n`
        attempts."""
        return trace_memory(
            attempts,
            MEMORY_HEADER.format(n=n),
            lambda text: len(base.renderer.content_ids(text)),
            self.memory_tokens,
            with_replies=self.memory == "trace",
        )

    def _seed(self) -> int:
        return int(self._rng.integers(2**31 - 1))

    def _fork(self, base: Any) -> Any:
        """A private rehearse copy of `base` at its current point (class docstring, "Rehearse copies")."""
        responder: Rehearsal | ConstantResponse | None = None  # "real": the fork copies the committed backend
        if self.attempt_outputs == "rehearsed":
            responder = Rehearsal(self.rehearser)
        elif self.attempt_outputs == "null":
            responder = ConstantResponse()
        fork = base.fork(responder=responder, seed=self._seed())
        fork.temperature = self.attempt_temperature
        rehearse_cap = self.rehearse_max_new_tokens or self.max_new_tokens
        if rehearse_cap is not None:
            fork.max_new_tokens = rehearse_cap  # the env's max_new_tokens caps its rehearsed responses
        return fork

    def _run_attempts(self, forks: list[Any]) -> list[dict[str, Any]]:
        """Play every fork until its turn ends, its episode ends or `attempt_max_steps`; ACT is batched."""
        starts = [(len(f.trajectory.messages), f.turn) for f in forks]
        start_tokens = [len(f.trajectory.token_ids) for f in forks]
        context_segments = [{id(seg) for seg in f.trajectory.segments} for f in forks]  # the fork point's
        context_rows = [len(f.rehearsal_rows) for f in forks]
        stats: list[dict[str, Any]] = [{"steps": 0, "tool_calls": 0, "ended": "steps", "act_tokens": 0} for _ in forks]
        active = list(range(len(forks)))
        committed: Any = self.env.unwrapped  # a ToolUseEnv (checked in __init__)
        max_new = self.max_new_tokens or committed.max_new_tokens  # the committed env's cap, not a fork's
        for _ in range(self.attempt_max_steps or forks[0].max_steps_per_turn):
            if not active:
                break
            actions = self.policy.act(
                [forks[i].trajectory.token_ids for i in active],
                max_new_tokens=max_new,
                temperature=self.attempt_temperature,
                seeds=[self._seed() for _ in active],
            )
            still = []
            for i, action in zip(active, actions):
                _, _, terminated, truncated, info = forks[i].step(action)
                s = stats[i]
                s["steps"] += 1
                s["tool_calls"] += len(info["tool_calls"])
                s["act_tokens"] += len(getattr(action, "token_ids", ()))  # a plain-text action generated none
                if terminated or truncated:
                    s["ended"] = "episode"
                elif forks[i].turn != starts[i][1]:
                    s["ended"] = "turn"
                else:
                    still.append(i)
            active = still
        out = []
        base: Any = self.env.unwrapped
        if self.keep_attempt_rows:
            self.attempt_rows.extend(
                self._attempt_row(f, known, rows) for f, known, rows in zip(forks, context_segments, context_rows)
            )
        for fork, (m0, _), s, t0 in zip(forks, starts, stats, start_tokens):
            rehearsed = sum(len(seg.token_ids) for seg in fork.trajectory.segments if seg.role == Role.REHEARSE)
            rehearsed += sum(len(r.token_ids) for r in fork.rehearsal_rows[len(base.rehearsal_rows) :])
            msgs = fork.trajectory.messages[m0:]
            if s["ended"] == "turn":  # drop the next turn's opening user message(s): not part of the attempt
                last_assistant = max(i for i, m in enumerate(msgs) if m.role == "assistant")
                msgs = msgs[: last_assistant + 1]
            base_rehearsed = sum(len(seg.token_ids) for seg in base.trajectory.segments if seg.role == Role.REHEARSE)
            out.append(
                {
                    "messages": [m.to_dict() for m in msgs],
                    **s,
                    "rehearse_tokens": rehearsed - base_rehearsed,
                    "start_tokens": t0,
                }
            )
        return out

    @staticmethod
    def _attempt_row(fork: Any, context: set[int], rows_before: int) -> AttemptRecord:
        """`fork`'s tokens as an `AttemptRecord`: segments present at the fork point (ids in `context`) lose their
        logprobs, segments after the attempt's last generated one are dropped (the next turn's opening)."""
        segments = [
            Segment(seg.role, list(seg.token_ids), None if id(seg) in context else seg.logprobs, seg.text)
            for seg in fork.trajectory.segments
        ]
        generated = [i for i, seg in enumerate(segments) if seg.logprobs is not None]
        segments = segments[: generated[-1] + 1] if generated else []
        return AttemptRecord(segments=segments, rehearsals=list(fork.rehearsal_rows[rows_before:]))

    def _critique(
        self, context: list[Message], tools: Any, request: str, attempts: list[dict[str, Any]]
    ) -> list[tuple[str, int]]:
        """One critique per attempt, generated in one batch from the committed context; returns (text,
        generated token count) pairs."""
        if not attempts:
            return []
        prompts = [
            self._context_prompt(context, tools, CRITIC_USER.format(request=request, attempt=self._transcript(a)))
            for a in attempts
        ]
        gens = self.policy.generate(
            prompts, max_new_tokens=self.critique_tokens, temperature=0.0, seeds=[self._seed() for _ in attempts]
        )
        return [(self.policy.decode(g.token_ids).strip(), len(g.token_ids)) for g in gens]

    def _context_prompt(self, context: list[Message], tools: Any, instruction: str) -> list[int]:
        """The committed context (system prompt, tools, history) then `instruction` as a user message."""
        return self.policy.renderer.prompt_ids([*context, Message("user", instruction)], tools)

    def _insert(self, env: Any, content: str, content_ids: list[int]) -> None:
        """Append the memory (or an earlier attempt's notes) before `env`'s pending ACT step, then, with
        ``restate_request``, the user messages that opened the turn again, whole and one by one."""
        opening = self._turn_opening(env)
        env.insert_message("user", content, content_ids)
        if self.restate_request:
            for text in opening:
                env.insert_message("user", text)

    @staticmethod
    def _turn_opening(env: Any) -> list[str]:
        """The user messages that opened the turn being played (the last user messages of the committed history,
        in order)."""
        opening: list[str] = []
        for m in reversed(env.trajectory.messages):
            if m.role == "user":
                opening.append(m.content)
            elif opening:
                break
        return opening[::-1]

    @classmethod
    def _current_request(cls, base: Any) -> str:
        """The turn's request as the critic and summariser read it: its opening messages joined, the last 2,000
        characters."""
        return "\n".join(cls._turn_opening(base))[-2000:]

    @staticmethod
    def _transcript(attempt: dict[str, Any]) -> str:
        lines = []
        for m in attempt["messages"]:
            text = m["content"] if len(m["content"]) <= _TRANSCRIPT_CHARS else m["content"][:_TRANSCRIPT_CHARS] + " ..."
            lines.append(f"[{m['role']}] {text}")
        return "\n".join(lines) if lines else "(nothing)"

    @classmethod
    def _digest(cls, attempts: list[dict[str, Any]], critiques: list[str]) -> str:
        parts = []
        for k, a in enumerate(attempts):
            parts.append(f"Attempt {k + 1}:\n{cls._transcript(a)}")
            if k < len(critiques):
                parts.append(f"Critique {k + 1}: {critiques[k]}")
        return "\n".join(parts)
