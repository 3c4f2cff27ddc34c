"""`BFCLSuite`: BFCL v4 as an envace-gym suite (tasks, real backends, verifiers)."""

from __future__ import annotations

from collections.abc import Sequence

from benchmarks.bfcl import data
from benchmarks.bfcl.backend import SingleTurnBackend
from benchmarks.bfcl.verify import (
    ground_truth_tool_calls,
    make_multi_turn_backend,
    single_turn_ground_truth_calls,
    verify_multi_turn,
    verify_single_turn,
)
from envace_gym.limits import DEFAULT_LIMITS, CallLimits
from envace_gym.suites import ToolBackend, VerifierResult
from envace_gym.types import Task, ToolCall, Trajectory

__all__ = ["BFCLSuite"]

_SPLITS = ("train", "test", "all")


class BFCLSuite:
    """The Berkeley Function-Calling Leaderboard v4 (bfcl-eval 2026.3.23) as a `envace_gym.suites.Suite`.

    Categories: the four multi-turn ones (``multi_turn_base``, ``multi_turn_miss_func``,
    ``multi_turn_miss_param``, ``multi_turn_long_context``; 200 tasks each, verifier ``"bfcl.multi_turn"``)
    and the single-turn AST ones (``simple_python``, ``multiple``, ``parallel``, ``parallel_multiple``,
    ``live_simple``, ``live_multiple``, ``live_parallel``, ``live_parallel_multiple``, ``irrelevance``,
    ``live_irrelevance``; verifier ``"bfcl.ast"``). How entries become tasks and how the split is drawn:
    `benchmarks.bfcl.data`; backends: `benchmarks.bfcl.backend`; verifiers: `benchmarks.bfcl.verify`.

    Args:
        default_categories: the categories `tasks` uses when given None (default ``["multi_turn_base"]``).
        call_limits: per-call limits of every backend, the env's and the verifier's replay alike
            (`envace_gym.limits.CallLimits`; default 5 s and 1024 MiB per call in a forked process on Linux,
            precision up to 10,000 digits, integer powers up to 100,000 digits). Register a suite with other
            limits as
            ``register_suite("bfcl-strict", lambda: BFCLSuite(call_limits=CallLimits(seconds=1)))``.

    Raises:
        ValueError: an unknown category in `default_categories`.
    """

    name = "bfcl"
    categories = data.ALL_CATEGORIES

    def __init__(self, default_categories: Sequence[str] | None = None, call_limits: CallLimits = DEFAULT_LIMITS):
        self.call_limits = call_limits
        self.default_categories = tuple(default_categories or ("multi_turn_base",))
        for c in self.default_categories:
            self._check_category(c)

    @staticmethod
    def _check_category(category: str) -> None:
        if category not in data.ALL_CATEGORIES:
            raise ValueError(f"unknown BFCL category {category!r}; valid categories: {', '.join(data.ALL_CATEGORIES)}")

    def tasks(self, categories: Sequence[str] | None = None, split: str = "train") -> list[Task]:
        """The tasks of `categories` (in the given order, each in file order) that fall in `split`.

        Args:
            categories: category names, or a single name; None -> `default_categories`.
            split: ``"train"`` (about 80%), ``"test"`` (about 20%) or ``"all"``; see `data.split_of`.

        Raises:
            ValueError: an unknown category (the message lists the valid ones) or split.
        """
        if split not in _SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {_SPLITS}")
        if isinstance(categories, str):
            categories = [categories]
        cats = list(categories) if categories is not None else list(self.default_categories)
        for c in cats:
            self._check_category(c)
        out: list[Task] = []
        for c in cats:
            out.extend(t for t in data.load_category(c) if split == "all" or data.split_of(t.id) == split)
        return out

    def task(self, task_id: str) -> Task:
        """One task by id (its category is the id without the trailing index).

        Raises:
            KeyError: no task has that id.
        """
        for c in sorted(data.ALL_CATEGORIES, key=len, reverse=True):
            if task_id.startswith(c + "_"):
                for t in data.load_category(c):
                    if t.id == task_id:
                        return t
                break
        raise KeyError(f"no BFCL task with id {task_id!r}")

    def make_backend(self, task: Task) -> ToolBackend:
        """A fresh backend: a `BFCLBackend` in the task's initial state for multi-turn tasks, a
        `SingleTurnBackend` (every call answered with an error string) for single-turn ones.

        Raises:
            ValueError: the task is not a BFCL task, or names an unknown BFCL class.
        """
        if task.verifier == "bfcl.multi_turn":
            return make_multi_turn_backend(task, self.call_limits)
        if task.verifier == "bfcl.ast":
            return SingleTurnBackend(task.id)
        raise ValueError(
            f"task {task.id!r} has verifier {task.verifier!r}; BFCLSuite handles bfcl.multi_turn and bfcl.ast"
        )

    def ground_truth(self, task: Task) -> list[list[ToolCall]] | None:
        """A reference solution: the ground-truth calls of each user turn, ``(turns, calls)``.

        Multi-turn: BFCL's ``possible_answer`` calls with positional arguments bound
        (`benchmarks.bfcl.verify.ground_truth_tool_calls`); single-turn: one turn holding the first
        alternative of each possible answer (`benchmarks.bfcl.verify.single_turn_ground_truth_calls`;
        irrelevance tasks: one turn without calls). None for a task of another suite.
        """
        if task.verifier == "bfcl.multi_turn":
            return ground_truth_tool_calls(task)
        if task.verifier == "bfcl.ast":
            return [single_turn_ground_truth_calls(task)]
        return None

    def verify(self, trajectory: Trajectory, backend: ToolBackend | None = None) -> VerifierResult:
        """Score a finished episode (the `envace_gym.suites.Suite` protocol): its ACT calls
        (`Trajectory.calls_per_turn`) replayed by `verify_calls`. BFCL checks the replayed state against
        the ground truth's replay, so the episode's own final `backend` is not read (it is None for a
        rehearsed episode anyway).

        Raises:
            ValueError: the trajectory's task is not a BFCL task.
        """
        return self.verify_calls(trajectory.task, trajectory.calls_per_turn())

    def verify_calls(self, task: Task, calls_per_turn: Sequence[Sequence[Sequence[ToolCall]]]) -> VerifierResult:
        """Score ACT calls with BFCL's checkers (`benchmarks.bfcl.verify`).

        Args:
            task: a task of this suite.
            calls_per_turn: turns × steps × calls.

        Returns:
            reward 1.0 if valid else 0.0; per-turn results in ``details["turns"]``.

        Raises:
            ValueError: the task is not a BFCL task.
        """
        if task.verifier == "bfcl.multi_turn":
            return verify_multi_turn(task, calls_per_turn, self.call_limits)
        if task.verifier == "bfcl.ast":
            return verify_single_turn(task, calls_per_turn)
        raise ValueError(
            f"task {task.id!r} has verifier {task.verifier!r}; BFCLSuite handles bfcl.multi_turn and bfcl.ast"
        )
