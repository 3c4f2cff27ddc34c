"""Responders: who answers an env's tool calls (a real backend, the policy's rehearsal, a recording).

The tool-use envs parse each ACT message into tool calls; a *responder* produces the tool message for each
call. Parsing, user turns, termination, truncation, the reward and (in `envace_gym.envs.tool_use.ToolUseEnv`)
the token sequence are the env's and do not depend on the responder, so the same actions give a rehearsed
episode with `Rehearsal`, a real one with `RealBackend` and a replayed one with `RecordedResponses`.

The responder is a constructor argument of the envs (``responder=...``) and can be swapped with
``env.set_responder(...)``, which takes effect at the next ``reset`` (`wrappers.RealTools` does exactly
that). `ToolResponder` is the protocol of the text responders; `Rehearsal` marks the policy's REHEARSE role,
which only a token-level env can use (its answers are generated tokens that the env records as REHEARSE
segments, in one batched model call per vector-env round). `Hybrid` is a `Rehearsal` that answers each call
from the real backend instead with probability p, so a run can buy a chosen share of real tool outputs.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from envace_gym.rehearsal import Rehearser
from envace_gym.suites import ToolBackend
from envace_gym.types import Task, ToolCall, Trajectory

__all__ = [
    "ToolResponder",
    "RealBackend",
    "RecordedResponses",
    "ConstantResponse",
    "NULL_TOOL_OUTPUT",
    "Rehearsal",
    "Hybrid",
    "Responder",
]


@runtime_checkable
class ToolResponder(Protocol):
    """Answers tool calls with text, never raising (an error is an error string the model sees)."""

    def start(self, task: Task) -> None:
        """Get ready for a new episode of `task` (e.g. build a fresh backend in its initial state)."""
        ...

    def respond(self, call: ToolCall) -> str:
        """The tool message content for `call`."""
        ...

    @property
    def backend(self) -> ToolBackend | None:
        """The real backend in its current state (what the verifier may read at the end), or None."""
        ...

    def fork(self) -> ToolResponder:
        """An independent copy that continues identically (real state copied, not shared)."""
        ...


class RealBackend:
    """A fresh real backend per episode, built by `factory` (by default the env's suite's ``make_backend``).

    Args:
        factory: Task -> `envace_gym.suites.ToolBackend`; None: the env fills in its suite's ``make_backend``.

    Raises:
        TypeError: `factory` is given and not callable.
    """

    def __init__(self, factory: Callable[[Task], ToolBackend] | None = None) -> None:
        if factory is not None and not callable(factory):
            raise TypeError(f"factory must be callable (Task -> ToolBackend), got {factory!r}")
        self.factory = factory
        self._backend: ToolBackend | None = None

    def start(self, task: Task) -> None:
        """Build the episode's backend (the previous episode's is closed first, when it can be).

        Raises:
            RuntimeError: no factory was given and no env filled one in.
        """
        if self.factory is None:
            raise RuntimeError("RealBackend has no factory; pass one or give it to an env (which uses its suite's)")
        self.close()
        self._backend = self.factory(task)

    def close(self) -> None:
        """Release the current backend's resources when it has a ``close`` (an MCP server session)."""
        close = getattr(self._backend, "close", None)
        if callable(close):
            close()

    def respond(self, call: ToolCall) -> str:
        """The backend's result; a backend that raises gives ``"Error during execution: ..."`` (docs/design.md §3)."""
        if self._backend is None:
            return "Error during execution: no backend (the episode has not started)"
        try:
            return str(self._backend.execute(call))
        except Exception as err:  # a backend must not crash the env
            return f"Error during execution: {type(err).__name__}: {err}"

    @property
    def backend(self) -> ToolBackend | None:
        """The episode's backend (None before `start`)."""
        return self._backend

    def fork(self) -> RealBackend:
        """A copy with a deep copy of the backend's state (same factory)."""
        twin = RealBackend(self.factory)
        twin._backend = copy.deepcopy(self._backend)
        return twin


class RecordedResponses:
    """Answers calls, in order, with the tool messages of a recording (replay without any backend).

    Args:
        responses: the tool message contents in call order, or a `Trajectory` whose ``tool`` messages
            that answer a call (they carry a ``tool_call_id``) are used.

    Calls past the end of the recording get ``"Error: no recorded response for call N (...)"``.
    """

    def __init__(self, responses: Sequence[str] | Trajectory) -> None:
        if isinstance(responses, Trajectory):
            responses = [m.content for m in responses.messages if m.role == "tool" and m.tool_call_id]
        self.responses = [str(r) for r in responses]
        self.position = 0

    def start(self, task: Task) -> None:
        """Rewind to the first recorded response."""
        self.position = 0

    def respond(self, call: ToolCall) -> str:
        self.position += 1
        if self.position > len(self.responses):
            return f"Error: no recorded response for call {self.position} ({len(self.responses)} recorded)"
        return self.responses[self.position - 1]

    @property
    def backend(self) -> ToolBackend | None:
        """None: a recording has no tool state."""
        return None

    def fork(self) -> RecordedResponses:
        twin = RecordedResponses(self.responses)
        twin.position = self.position
        return twin


NULL_TOOL_OUTPUT = ""
"""What `ConstantResponse` answers by default: nothing (an empty tool message), which carries no information about
the call and is no token a tokenizer can lack."""


class ConstantResponse:
    """Answers every call with the same text: the null-rehearser control (a world model that knows nothing).

    If a policy trained on rollouts answered this way matches one trained on its own rehearsals, what the
    rehearsals say is not what helps it. The episode has no tool state: the verifier replays the calls, as for
    a rehearsed episode.

    Args:
        text: the answer to every call (default `NULL_TOOL_OUTPUT`).
    """

    def __init__(self, text: str = NULL_TOOL_OUTPUT) -> None:
        self.text = str(text)

    def start(self, task: Task) -> None:
        """Nothing to prepare."""

    def respond(self, call: ToolCall) -> str:
        return self.text

    @property
    def backend(self) -> ToolBackend | None:
        """None: no tool state (the verifier replays the calls)."""
        return None

    def fork(self) -> ConstantResponse:
        return ConstantResponse(self.text)


class Rehearsal:
    """The policy's REHEARSE role answers (token-level envs only: `envace_gym.envs.tool_use.ToolUseEnv`).

    Args:
        rehearser: the `envace_gym.rehearsal.Rehearser`, shared (not copied) by forks.
    """

    def __init__(self, rehearser: Rehearser) -> None:
        if not callable(getattr(rehearser, "rehearse", None)):
            raise TypeError(f"Rehearsal needs a Rehearser (with rehearse and tokenizer), got {rehearser!r}")
        self.rehearser = rehearser

    def start(self, task: Task) -> None:
        """Nothing to prepare: no real tool is touched during a rehearsed episode."""

    def rehearses_next(self) -> bool:
        """Whether the episode's next tool call is answered by the rehearser: always, here (`Hybrid` draws)."""
        return True

    def rehearsed(self, call: ToolCall) -> None:
        """The env answered `call` by rehearsal (or with an error because no room was left for one)."""

    @property
    def backend(self) -> ToolBackend | None:
        """None: a rehearsed episode has no real tool state (the verifier replays the calls)."""
        return None

    def fork(self) -> Rehearsal:
        """The same rehearser (one model serves every copy)."""
        return Rehearsal(self.rehearser)


class Hybrid(Rehearsal):
    """Each tool call answered by the real backend with probability `real_call_prob`, else by the REHEARSE role.

    The draw is made per call, independently, from a generator seeded with `seed`: call n of the responder's
    life is real when the n-th uniform draw u_n in [0, 1) satisfies ``u_n < real_call_prob`` (so p = 0 never and
    p = 1 always touches the backend). The env reads the draw for its pending call before answering
    (`rehearses_next`; a vector env decides every env's call before it batches the rehearsals), and the draw is
    spent when the call is answered, so peeking changes nothing.

    The real backend follows the trajectory lazily. A call drawn for rehearsal is only remembered; when a call
    is drawn real, the episode's remembered calls are first executed on the backend in order (their outputs
    are discarded: the agent already saw the rehearsed ones), then the call itself, whose output is the answer.
    The backend is built at the episode's first real call, so an episode without one builds none. Counts, per
    episode (reset by `start`): ``backend_calls``, every execution on the backend (the catch-up included: the
    environment cost), and ``real_answers``, the calls whose shown output came from the backend.

    `backend` is None, as for `Rehearsal`: the backend lags the trajectory until its next real call, so the
    verifier replays the calls on a fresh one. `fork` copies the generator state (a fork draws what the
    original would), the backend's state and the remembered calls; give each env its own `seed` for
    independent draws.

    Args:
        rehearser: the `envace_gym.rehearsal.Rehearser` of the rehearsed calls, shared (not copied) by forks.
        real_call_prob: p in [0, 1].
        seed: seed of the draws (None: fresh entropy, not reproducible).
        factory: Task -> `envace_gym.suites.ToolBackend` of the real calls; None: the env's suite's
            ``make_backend`` (filled in by the env, as for `RealBackend`).

    Raises:
        ValueError: `real_call_prob` outside [0, 1].
        TypeError: as `Rehearsal` and `RealBackend` for `rehearser` and `factory`.
    """

    def __init__(
        self,
        rehearser: Rehearser,
        real_call_prob: float,
        seed: int | None = None,
        factory: Callable[[Task], ToolBackend] | None = None,
    ) -> None:
        super().__init__(rehearser)
        p = float(real_call_prob)
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"real_call_prob must be in [0, 1], got {real_call_prob!r}")
        self.real_call_prob = p
        self.real = RealBackend(factory)
        self._rng = np.random.default_rng(seed)
        self._draw: float | None = None  # the pending call's uniform, drawn when first asked for
        self._task: Task | None = None
        self._unexecuted: list[ToolCall] = []
        self.backend_calls = 0
        self.real_answers = 0

    def start(self, task: Task) -> None:
        """Start an episode of `task`: no backend yet (the first real call builds it), counts at 0."""
        self.real.close()
        self.real = RealBackend(self.real.factory)  # built at the first real call
        self._task = task
        self._unexecuted = []
        self.backend_calls = 0
        self.real_answers = 0

    def rehearses_next(self) -> bool:
        """Whether the next call is answered by rehearsal (the draw is kept until the call is answered)."""
        if self._draw is None:
            self._draw = float(self._rng.random())
        return not self._draw < self.real_call_prob

    def _spend(self) -> None:
        self.rehearses_next()  # a call answered without being asked about still takes its draw
        self._draw = None

    def rehearsed(self, call: ToolCall) -> None:
        """`call` was answered by rehearsal: remember it for the backend's next catch-up."""
        self._spend()
        self._unexecuted.append(call)

    def remember(self, calls: Sequence[ToolCall]) -> None:
        """Calls the episode made before this responder answered (a fork's history): executed on the backend,
        in order, before its next real answer. Takes no draw."""
        self._unexecuted.extend(calls)

    def respond(self, call: ToolCall) -> str:
        """Answer `call` from the real backend, after executing the episode's rehearsed calls not yet executed.

        Never raises: a backend error is an error string, as `RealBackend.respond` gives, and so is a backend
        that cannot be built (it is built at the episode's first real call, not at ``start``: a dead server
        becomes an error observation, and the next real call tries again).
        """
        self._spend()
        if self.real.backend is None:
            if self._task is None:
                return "Error during execution: no backend (the episode has not started)"
            try:
                self.real.start(self._task)
            except Exception as err:  # a backend that will not start must not crash the vector env's round
                return f"Error during execution: the backend did not start: {type(err).__name__}: {err}"
        for earlier in self._unexecuted:
            self.real.respond(earlier)
        self.backend_calls += len(self._unexecuted) + 1
        self._unexecuted = []
        self.real_answers += 1
        return self.real.respond(call)

    @property
    def backend(self) -> ToolBackend | None:
        """None: the backend may lag the trajectory (the verifier replays the calls, as for `Rehearsal`)."""
        return None

    def fork(self) -> Hybrid:
        """A copy that continues identically: the same rehearser, a copy of the generator, the backend's state
        and the remembered calls."""
        twin = copy.copy(self)
        twin._rng = copy.deepcopy(self._rng)
        twin.real = self.real.fork()
        twin._unexecuted = list(self._unexecuted)
        return twin


Responder = ToolResponder | Rehearsal
"""Any responder an env takes: a text responder, or the REHEARSE role (`Rehearsal`, `Hybrid`)."""
