"""The interface between the environments and a benchmark suite: tasks, users, tool backends, verifiers.

`envace_gym` imports no benchmark (docs/design.md §2: imports flow one way). Suites are discovered through the
entry-point group ``envace_gym.suites`` (a package declares ``[project.entry-points."envace_gym.suites"]``
``name = "module:factory"`` in its ``pyproject.toml``; envace-gym itself declares ``bfcl``), resolved lazily
the first time an environment asks for one, like a Gymnasium entry point; `register_suite` adds one at run
time (a test, a notebook).

A suite provides:

* `Suite.tasks(categories, split)`: the tasks, in a fixed order.
* `Suite.make_backend(task)`: a fresh, isolated `ToolBackend` for one rollout (never shared).
* `Suite.verify(trajectory, backend)`: the outcome reward and details, from the whole trajectory (its
  messages, with the parsed calls on the assistant messages) and the episode's real backend in its final
  state (None when the episode's tools were rehearsed). BFCL replays the ACT calls on fresh real backends
  (docs/design.md §3, "Rewards come from the task") and ignores the final state; a suite whose reward is the
  final state of a real world can read it instead.

Optionally:

* ``Suite.user(task) -> UserTurns``: the user side of an episode. Without it the user says the task's fixed
  turns in order (`FixedUserTurns`, BFCL's semantics); a simulated user (τ²-bench) answers the history.
* ``Suite.ground_truth(task) -> list[list[ToolCall]] | None``: a reference solution, the calls of each user
  turn (turns × calls), or None when the task has none. `agents.training.budgets` reads it to tell whether the step
  and token budgets leave a task completable, and `agents.training.demonstrations` replays it on the real backend to
  build SFT demonstrations; a suite without it is neither checked nor demonstrated.
* ``Suite.reference_reply(task, turn) -> str | None``: the closing assistant message of user turn `turn` in
  the reference solution, when the reward reads it (a question the reply must answer); None (or no such
  method) lets the demonstrations close the turn with a fixed template (`DONE_MESSAGE` after a turn with
  calls, `NO_CALL_MESSAGE` after one without).
* ``Suite.mutations(task, calls, rng) -> list[tuple[int, ToolCall]]``: mistaken calls, each to be played
  right before reference call ``calls[position]`` (`calls`: ``ground_truth`` flattened over the turns; `rng`:
  a seeded ``random.Random``). ``agents.training.demonstrations.build_demonstrations(mutations=k)`` plays them on the
  real backend to build error demonstrations (the world model sees failures); a suite without it gives none
  (`proposes_mistakes`).
* ``Suite.error_kind(output) -> str``: the kind of mistake an error output shows (the lab's ``breaks``, ``no_box``,
  ...), so fidelity on error outputs can be split by kind (`agents.evaluation.one_step`); without it every error
  output is of one kind.
* ``Suite.checklist(task) -> envace_gym.judging.Checklist | None``: a checklist derived from the reference solution,
  for a judge reward (`envace_gym.judging.score_with_judge`) scored on the same trajectories as the verifier.
"""

from __future__ import annotations

import importlib.metadata
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from envace_gym.registry import resolve_entry_point
from envace_gym.types import Message, Task, ToolCall, Trajectory

__all__ = [
    "ToolBackend",
    "Suite",
    "UserTurns",
    "FixedUserTurns",
    "VerifierResult",
    "ENTRY_POINT_GROUP",
    "register_suite",
    "make_suite",
    "registered_suites",
    "proposes_mistakes",
    "user_turns",
    "DONE_MESSAGE",
    "NO_CALL_MESSAGE",
]

ENTRY_POINT_GROUP = "envace_gym.suites"
DONE_MESSAGE = "Done."
"""Closing assistant message of a user turn whose ground truth has calls (the fixed template of a suite
without ``reference_reply``). Defined here, with the suite contract, because both the demonstrations
(`agents.training.demonstrations`) and a suite's own vocabulary (the lab's `lab-tiny` tokenizer) must spell
it the same."""
NO_CALL_MESSAGE = (
    "I cannot complete this request with the functions and information I have. "
    "Please provide the missing function or parameter."
)
"""Closing assistant message of a user turn whose ground truth is empty (BFCL miss_func / miss_param)."""


@runtime_checkable
class ToolBackend(Protocol):
    """A stateful tool executor for one rollout.

    `execute` must never raise for any call: an unknown tool, a bad argument or an internal error is
    returned as an error string that the model sees as the observation.
    """

    def execute(self, call: ToolCall) -> str:
        """Run one call and return its result as text (an error string on failure)."""
        ...

    def snapshot(self) -> bytes:
        """A byte string that is equal for two backends exactly when their tool state is equal."""
        ...


@dataclass
class VerifierResult:
    """The outcome of verifying one trajectory.

    Attributes:
        reward: the scalar reward in [0, 1].
        valid: whether the verifier accepted the trajectory.
        details: verifier-specific information (per-turn results, error messages), JSON-compatible.
    """

    reward: float
    valid: bool
    details: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class UserTurns(Protocol):
    """The user side of one episode (made fresh per episode by ``Suite.user(task)``)."""

    def opening(self) -> list[Message]:
        """The messages of the first user turn."""
        ...

    def reply(self, trajectory: Trajectory) -> list[Message] | None:
        """After the agent closed a user turn (an ACT message without a tool call): the next turn's
        messages, or None (or an empty list) when the user ends the conversation (the episode terminates;
        a user whose ``gave_up`` attribute is then True, e.g. a simulated user out of turns, makes it
        truncated instead: R = 0 without verification, as τ² scores a simulation cut at its step limit)."""
        ...


class FixedUserTurns:
    """The task's fixed user turns in order (``task.turns``), then None: the default `UserTurns`."""

    def __init__(self, task: Task) -> None:
        self.task = task
        self.next_turn = 1

    def opening(self) -> list[Message]:
        return [Message(role=m.role, content=m.content) for m in self.task.turns[0]]

    def reply(self, trajectory: Trajectory) -> list[Message] | None:
        if self.next_turn >= self.task.num_turns:
            return None
        self.next_turn += 1
        return [Message(role=m.role, content=m.content) for m in self.task.turns[self.next_turn - 1]]


@runtime_checkable
class Suite(Protocol):
    """A benchmark suite; see the module docstring."""

    name: str

    def tasks(self, categories: Sequence[str] | None = None, split: str = "train") -> list[Task]:
        """The tasks of the given categories (None: the suite's default) and split (``train``, ``test``, ``all``;
        a suite may add its own, as the hidden-rules lab adds ``valid``)."""
        ...

    def make_backend(self, task: Task) -> ToolBackend:
        """A fresh real backend in the task's initial state."""
        ...

    def verify(self, trajectory: Trajectory, backend: ToolBackend | None = None) -> VerifierResult:
        """Score a finished episode.

        Args:
            trajectory: the episode: ``trajectory.task``, its messages (assistant messages carry their
                parsed calls; `Trajectory.calls_per_turn` and `Trajectory.final_responses` regroup them).
            backend: the episode's real backend in its final state, or None when the tools were rehearsed.
        """
        ...


def user_turns(suite: Suite, task: Task) -> UserTurns:
    """The suite's user for `task` (``suite.user(task)``), or the task's fixed turns (`FixedUserTurns`)."""
    make = getattr(suite, "user", None)
    return make(task) if callable(make) else FixedUserTurns(task)


_SUITES: dict[str, str | Callable[..., Suite]] = {}
_CACHE: dict[tuple[str, str], Suite] = {}


def _entry_points() -> dict[str, str]:
    return {ep.name: ep.value for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def register_suite(name: str, entry_point: str | Callable[..., Suite]) -> None:
    """Register a suite factory under `name` at run time (a ``"module:attr"`` string is imported on first
    use); it takes precedence over an installed entry point of the same name."""
    _SUITES[name] = entry_point
    for key in [k for k in _CACHE if k[0] == name]:
        del _CACHE[key]


def registered_suites() -> list[str]:
    """Names of every suite: installed entry points of ``envace_gym.suites`` and `register_suite` calls."""
    return sorted(set(_entry_points()) | set(_SUITES))


def make_suite(name: str, **kwargs: Any) -> Suite:
    """Instantiate (once per process and kwargs) the suite registered as `name`.

    Raises:
        ValueError: no suite has that name (the message lists the known ones).
    """
    entry = _SUITES.get(name) or _entry_points().get(name)
    if entry is None:
        raise ValueError(
            f"unknown suite {name!r}; registered suites: {registered_suites()} (installed packages declare "
            f"suites in the entry-point group {ENTRY_POINT_GROUP!r}; is envace-gym installed, `pip install -e .`?)"
        )
    key = (name, json.dumps(kwargs, sort_keys=True, default=repr))  # lists (a server command) are not hashable
    if key not in _CACHE:
        _CACHE[key] = resolve_entry_point(entry)(**kwargs)
    return _CACHE[key]


def proposes_mistakes(suite: object) -> bool:
    """Whether `suite` has the optional ``mutations(task, calls, rng)`` hook (module doc), which error
    demonstrations and one-step fidelity on error outputs need."""
    return callable(getattr(suite, "mutations", None))
