"""The interface between the environments and a benchmark suite: tasks, tool backends, verifiers.

`envace_gym` imports no benchmark (DESIGN.md §2: imports flow one way). A suite is registered here by a
``"module:factory"`` string, exactly like a Gymnasium entry point, and resolved lazily the first time an
environment asks for it; ``"bfcl"`` is registered by default and lives in `benchmarks.bfcl`.

A suite provides three things:

* `Suite.tasks(categories, split)`: the tasks, in a fixed order.
* `Suite.make_backend(task)`: a fresh, isolated `ToolBackend` for one rollout (never shared).
* `Suite.verify(task, calls_per_turn, responses_per_turn)`: the outcome reward and per-turn details,
  computed by replaying the ACT calls on fresh real backends (DESIGN.md §3, "Rewards come from the task").

Optionally, ``Suite.ground_truth(task) -> list[list[ToolCall]] | None``: a reference solution, the calls of
each user turn (turns × calls), or None when the task has none. `agents.budgets` reads it to tell whether the
configured step and token budgets leave a task completable; a suite without it is not checked.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

from envace_gym.types import Task, ToolCall

__all__ = [
    "ToolBackend",
    "Suite",
    "VerifierResult",
    "register_suite",
    "make_suite",
    "registered_suites",
]


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
class Suite(Protocol):
    """A benchmark suite; see the module docstring."""

    name: str

    def tasks(self, categories: Sequence[str] | None = None, split: str = "train") -> list[Task]:
        """The tasks of the given categories (None: the suite's default) and split (``train``, ``test``, ``all``)."""
        ...

    def make_backend(self, task: Task) -> ToolBackend:
        """A fresh real backend in the task's initial state."""
        ...

    def verify(
        self,
        task: Task,
        calls_per_turn: Sequence[Sequence[Sequence[ToolCall]]],
        final_responses: Sequence[str] | None = None,
    ) -> VerifierResult:
        """Score a trajectory from its ACT calls.

        Args:
            task: the task that was played.
            calls_per_turn: for each user turn, for each ACT step of that turn, the parsed calls (possibly
                empty). Shape: turns × steps × calls.
            final_responses: the text of the last ACT message of each turn, for verifiers that read it.
        """
        ...


_SUITES: dict[str, str | Callable[..., Suite]] = {"bfcl": "benchmarks.bfcl:BFCLSuite"}
_CACHE: dict[tuple[str, tuple[tuple[str, Any], ...]], Suite] = {}


def register_suite(name: str, entry_point: str | Callable[..., Suite]) -> None:
    """Register a suite factory under `name` (a ``"module:attr"`` string is imported on first use)."""
    _SUITES[name] = entry_point
    for key in [k for k in _CACHE if k[0] == name]:
        del _CACHE[key]


def registered_suites() -> list[str]:
    """Names of every registered suite."""
    return sorted(_SUITES)


def make_suite(name: str, **kwargs: Any) -> Suite:
    """Instantiate (once per process and kwargs) the suite registered as `name`.

    Raises:
        ValueError: no suite has that name.
    """
    if name not in _SUITES:
        raise ValueError(f"unknown suite {name!r}; registered suites: {registered_suites()}")
    key = (name, tuple(sorted(kwargs.items())))
    if key not in _CACHE:
        entry = _SUITES[name]
        if isinstance(entry, str):
            module, _, attr = entry.partition(":")
            entry = getattr(importlib.import_module(module), attr)
        _CACHE[key] = entry(**kwargs)
    return _CACHE[key]
