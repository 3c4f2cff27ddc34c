"""`TestTimeRehearsal`: rehearse privately N times, keep a bounded memory, then act for real (docs/design.md §1).

Why per user turn, not per episode: the committed context differs at every user turn (new request, real
observations of the earlier turns), so a memory written before the first turn says nothing useful about
the third; rehearsing at the opening of each turn, from exactly the committed context, is what the
method describes ("rehearse privately before acting for real"). Within a turn the policy then acts on real
observations, which a rehearsal cannot predict better than the real backend already tells it.

Memory format (token in, token out): one ``user`` message appended to the committed token sequence just
before the turn's first committed ACT step, i.e. the trailing assistant opener is taken off, the memory
message is appended piecewise (``open_ids("user")`` + content ids + ``close_ids("user")``) and the opener
is appended again. Nothing already in the sequence is re-rendered. The content ids are the ids of the
fixed header `MEMORY_HEADER` (tokenised once) followed by the summary ids *exactly as generated* (the
end-of-message id dropped); the content text is::

    Rehearsal memory (private notes from N rehearsal attempts; their tool outputs were imagined, not real):
    <summary>

The content is at most ``memory_tokens`` tokens. Roles: the memory's content is PROMPT and its pieces
TEMPLATE (no loss: it is context, not an action). The message is also appended to
``trajectory.messages`` (role ``user``), so a whole re-render of the history shows it where it was.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import gymnasium as gym
import numpy as np
from gymnasium.utils import RecordConstructorArgs

from envace_gym.rehearsal import RehearseRequest, RehearseResponse, requests_by_setting
from envace_gym.responders import Rehearsal
from envace_gym.types import Message, Role

__all__ = ["TestTimeRehearsal", "MEMORY_HEADER"]

Mode = Literal["parallel", "sequential"]

MEMORY_HEADER = (
    "Rehearsal memory (private notes from {n} rehearsal attempts; their tool outputs were imagined, not real):\n"
)
"""Header of the memory message; ``{n}`` is the number of attempts."""

CRITIC_SYSTEM = (
    "You review a private rehearsal of a tool-using assistant. The tool outputs in the rehearsal were "
    "imagined by a simulator, not produced by the real tools."
)
CRITIC_USER = (
    "User request:\n{request}\n\nRehearsal attempt:\n{attempt}\n\n"
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
                [list(requests[i].context_ids) for i in idx],
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
    copies of the env, (2) had the policy critique each attempt, (3) had the policy summarise attempts and
    critiques into a memory of at most ``memory_tokens`` tokens and (4) appended that memory to the
    committed token sequence (module docstring: format). The agent then acts as always on
    ``env.unwrapped.trajectory.token_ids`` and calls `step`; the committed step runs against the wrapped
    env's real backend. With ``n=0`` the wrapper does nothing. `rehearse` can also be called by hand.

    Rehearse copies: ``env.unwrapped.fork(responder=Rehearsal(...), seed=...)`` (`ToolUseEnv.fork`: its own
    episode state and random generator), so every tool call in an attempt is answered by the REHEARSE role
    of ``rehearser_policy`` (or of ``policy``) and the real backend is never reached. An attempt ACTs (``policy``,
    ``attempt_temperature``) until its turn ends, its episode ends or ``attempt_max_steps`` ACT steps. ``parallel``: the
    n attempts start from the same committed context, and their ACT steps are batched in one generate call.
    ``sequential``: attempt k starts from the committed context plus a user message listing attempts
    1..k-1 with their critiques. Critiques and the summary are generated from short prompts (the user
    request and the attempt transcripts, each message cut to 400 characters), not from the full context
    with the tool schemas, so their cost does not grow with the schemas.

    ``info["rehearsal"]``: None on steps that open no turn; else a dict with

    * ``turn`` (int): the user turn rehearsed; ``mode`` (str); ``n`` (int).
    * ``attempts``: n dicts: ``messages`` (the attempt's messages, OpenAI dicts, from the fork point on),
      ``steps`` (int, ACT steps), ``tool_calls`` (int), ``ended`` (``"turn"``, ``"episode"`` or ``"steps"``),
      ``act_tokens``, ``rehearse_tokens`` (int, generated tokens), ``start_tokens`` (int, length of the
      context the attempt started from: equal across parallel attempts, growing across sequential ones).
    * ``critiques``: n strings; ``critique_tokens``: n ints.
    * ``memory``: the memory message content (str); ``memory_tokens``: its content length in tokens
      (<= the ``memory_tokens`` argument); ``summary_tokens``: generated summary tokens.
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
        rehearser_policy: who plays REHEARSE in the attempts (the paper's base-model control): a policy
            with the env's vocabulary (inline mode), or a ready `envace_gym.rehearsal.Rehearser` (any prompt
            mode, e.g. a separate-mode `agents.policy.PolicyRehearser` for another vocabulary); None:
            ``policy`` itself, inline.
        attempt_max_steps: ACT steps per attempt (>= 1).
        max_new_tokens: cap per generated ACT message and rehearsed tool response; None: the env's.
        critique_tokens: cap per critique (>= 1).
        attempt_temperature: sampling temperature of attempts (ACT and REHEARSE); > 0 keeps parallel
            attempts from being identical.
        seed: seeds the attempts' sampling; each `reset` with a seed reseeds it.

    Raises:
        TypeError: the env keeps no token sequence, or `policy` lacks ``act``.
        ValueError: ``n < 0``, an unknown mode, ``memory_tokens`` not larger than the header, a bad step,
            token or temperature argument, or a policy (or a rehearser policy) whose vocabulary differs
            from the env's tokenizer.

    Change log:
        * v0.1.0: initial version.
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
        attempt_max_steps: int = 3,
        max_new_tokens: int | None = None,
        critique_tokens: int = 64,
        attempt_temperature: float = 1.0,
        seed: int | None = None,
    ) -> None:
        RecordConstructorArgs.__init__(
            self,
            n=n,
            mode=mode,
            memory_tokens=memory_tokens,
            attempt_max_steps=attempt_max_steps,
            max_new_tokens=max_new_tokens,
            critique_tokens=critique_tokens,
            attempt_temperature=attempt_temperature,
            seed=seed,
        )
        gym.Wrapper.__init__(self, env)
        base = env.unwrapped
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
        if not isinstance(attempt_max_steps, int) or attempt_max_steps < 1:
            raise ValueError(f"attempt_max_steps must be an int >= 1, got {attempt_max_steps!r}")
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
        self.memory_tokens = memory_tokens
        self.attempt_max_steps = attempt_max_steps
        self.max_new_tokens = max_new_tokens
        self.critique_tokens = critique_tokens
        self.attempt_temperature = attempt_temperature
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
        """Run the attempts, critiques and summary for the pending ACT step and insert the memory.

        Returns:
            the ``info["rehearsal"]`` dict (class docstring); also kept in ``self.last_rehearsal``.

        Raises:
            RuntimeError: the episode has ended or has not started.
        """
        base = self.env.unwrapped
        if base.episode_over:
            raise RuntimeError("rehearse() needs a running episode (call reset())")
        request = self._current_request(base)
        before = len(base.trajectory.token_ids)
        attempts: list[dict[str, Any]] = []
        critiques: list[tuple[str, int]] = []
        if self.mode == "parallel":
            attempts = self._run_attempts([self._fork(base) for _ in range(self.n)])
            critiques = self._critique(request, attempts)
        else:
            for _ in range(self.n):
                fork = self._fork(base)
                if attempts:
                    notes = EARLIER_ATTEMPTS.format(attempts=self._digest(attempts, [c for c, _ in critiques]))
                    fork.insert_message("user", notes)
                (attempt,) = self._run_attempts([fork])
                attempts.append(attempt)
                critiques.extend(self._critique(request, [attempt]))
        texts = [c for c, _ in critiques]
        header = MEMORY_HEADER.format(n=self.n)
        header_ids = base.renderer.content_ids(header)
        prompt = self._prompt(SUMMARY_USER.format(request=request, attempts=self._digest(attempts, texts)))
        (gen,) = self.policy.generate(
            [prompt], max_new_tokens=self.memory_tokens - len(header_ids), temperature=0.0, seeds=[self._seed()]
        )
        summary_ids = [t for t in gen.token_ids if t not in self.policy.stop_ids]
        summary = self.policy.decode(summary_ids)
        content_ids = header_ids + summary_ids
        base.insert_message("user", header + summary, content_ids)
        record = {
            "turn": base.turn,
            "mode": self.mode,
            "n": self.n,
            "attempts": attempts,
            "critiques": texts,
            "critique_tokens": [k for _, k in critiques],
            "memory": header + summary,
            "memory_tokens": len(content_ids),
            "summary_tokens": len(gen.token_ids),
            "context_tokens_before": before,
            "context_tokens_after": len(base.trajectory.token_ids),
            "generated_tokens": sum(a["act_tokens"] + a["rehearse_tokens"] for a in attempts)
            + sum(k for _, k in critiques)
            + len(gen.token_ids),
        }
        self.last_rehearsal = record
        return record

    def _seed(self) -> int:
        return int(self._rng.integers(2**31 - 1))

    def _fork(self, base: Any) -> Any:
        """A private rehearse copy of `base` at its current point (class docstring, "Rehearse copies")."""
        fork = base.fork(responder=Rehearsal(self.rehearser), seed=self._seed())
        fork.temperature = self.attempt_temperature
        if self.max_new_tokens is not None:
            fork.max_new_tokens = self.max_new_tokens
        return fork

    def _run_attempts(self, forks: list[Any]) -> list[dict[str, Any]]:
        """Play every fork until its turn ends, its episode ends or `attempt_max_steps`; ACT is batched."""
        starts = [(len(f.trajectory.messages), f.turn) for f in forks]
        start_tokens = [len(f.trajectory.token_ids) for f in forks]
        stats = [{"steps": 0, "tool_calls": 0, "ended": "steps", "act_tokens": 0} for _ in forks]
        active = list(range(len(forks)))
        max_new = self.max_new_tokens or forks[0].max_new_tokens
        for _ in range(self.attempt_max_steps):
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
                s["act_tokens"] += len(action.token_ids)
                if terminated or truncated:
                    s["ended"] = "episode"
                elif forks[i].turn != starts[i][1]:
                    s["ended"] = "turn"
                else:
                    still.append(i)
            active = still
        out = []
        base = self.env.unwrapped
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

    def _critique(self, request: str, attempts: list[dict[str, Any]]) -> list[tuple[str, int]]:
        """One critique per attempt, generated in one batch; returns (text, generated token count) pairs."""
        if not attempts:
            return []
        prompts = [
            self._prompt(CRITIC_USER.format(request=request, attempt=self._transcript(a)), CRITIC_SYSTEM)
            for a in attempts
        ]
        gens = self.policy.generate(
            prompts, max_new_tokens=self.critique_tokens, temperature=0.0, seeds=[self._seed() for _ in attempts]
        )
        return [(self.policy.decode(g.token_ids).strip(), len(g.token_ids)) for g in gens]

    def _prompt(self, user: str, system: str | None = None) -> list[int]:
        msgs = ([Message("system", system)] if system else []) + [Message("user", user)]
        return self.policy.renderer.prompt_ids(msgs, None)

    @staticmethod
    def _current_request(base: Any) -> str:
        """The text of the user turn being played (the last user messages of the committed history)."""
        opening: list[str] = []
        for m in reversed(base.trajectory.messages):
            if m.role == "user":
                opening.append(m.content)
            elif opening:
                break
        return "\n".join(reversed(opening))[-2000:]

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
