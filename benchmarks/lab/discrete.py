"""`LabDiscreteEnv` (``EnvACE-LabDiscrete-v0``): the lab world with discrete actions, for model-free RL.

The same tasks, real backend and reward as the ``lab`` suite (`benchmarks.lab.suite.LabSuite.score`), with
the text replaced by what it says, so stable-baselines3 can train on it (the model-free baseline of the
ablations: how many real tool calls does PPO need for the success a world-rehearsing policy reaches).

## Action Space
``Discrete(N)`` over every tool call the world can parse, in this order: ``locate(item)`` per item of the
vocabulary (`benchmarks.lab.tasks.ITEMS`), ``list_shelf(shelf)`` per shelf, ``move(item, shelf)`` per pair,
``pack(item)`` per item, ``ship(box-k, dock)`` for k = 1..``max_boxes`` and each dock, then the closing
actions: ``reply(n)`` for n = 0..capacity (a ``count`` task's answer) and ``done``. `action_masks` (read by
sb3-contrib's ``MaskablePPO``) allows the calls that name an item of this task's warehouse, and the closing
action that fits the task (``reply(n)`` for ``count``, ``done`` otherwise). A move onto a full shelf stays
allowed: it is the mistake to learn to avoid.

## Observation Space
``Box(0, 1, (D,), float32)``, one-hot blocks: where each vocabulary item is (absent, a shelf, a box,
broken), which dock each box was shipped from (or none), the task family, the items, docks and shelf the
instruction names (`benchmarks.lab.tasks` slots), whether the last call failed, and the fraction of the
step budget used. Everything in it is what the text shows (the prompt's layout changed by the outputs so
far); `describe` names the blocks.

## Rewards
0 on every step; on the closing action, or when ``max_steps`` calls run out (truncated), the suite's score of
the calls made and the reply: 1 when the final state is the reference's, no call failed, and a ``count``
reply is right.

## Episode End
Terminated by a closing action; truncated after ``max_steps`` tool calls.

## Info
``task_id``, ``real_calls`` (the episode's tool calls, each sent to the real backend), and on the last step
``verifier`` (the suite's details). The attribute ``real_calls`` counts every call since the env was made.

## Arguments
* ``suite`` (str): a registered stated-rules lab suite (``"lab-stated"``, the default, or a
  `LabConfig(rules="stated")` variant).
* ``categories``, ``split``: as `LabSuite.tasks`.
* ``max_steps`` (int): tool calls per episode; default 8 (``full_job`` needs 6).
* ``max_boxes`` (int): the highest box label an action can name; default 3.

## Version History
* v0: initial version.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from benchmarks.lab.tasks import CATEGORIES, ITEMS
from benchmarks.lab.world import DOCKS
from envace_gym.suites import make_suite
from envace_gym.types import Task, ToolCall

if TYPE_CHECKING:
    from benchmarks.lab.suite import LabSuite

__all__ = ["LabDiscreteEnv"]

_SLOT_ITEMS = ("x", "y", "w", "a", "b")
_SLOT_DOCKS = ("d1", "d2")


class LabDiscreteEnv(gym.Env[np.ndarray, int]):
    """The lab world with discrete actions and a one-hot observation (see the module docstring)."""

    metadata = {"render_modes": []}
    rules = "stated"
    """The rules of the suites this env accepts (`benchmarks.lab.tasks.LabConfig.rules`)."""

    def __init__(
        self,
        suite: str = "lab-stated",
        categories: Sequence[str] | None = None,
        split: str = "train",
        max_steps: int = 8,
        max_boxes: int = 3,
    ) -> None:
        if max_steps < 1 or max_boxes < 1:
            raise ValueError(f"max_steps and max_boxes must be >= 1, got {max_steps}, {max_boxes}")
        # a lab suite (checked just below: it has score(task, calls, reply))
        self.suite = cast("LabSuite", make_suite(suite))
        if not hasattr(self.suite, "score"):
            raise ValueError(f"suite {suite!r} is not a lab suite (it has no score(task, calls, reply))")
        if self.suite.config.rules != self.rules:
            raise ValueError(self._wrong_rules(suite))
        if self.suite.config.blind:
            raise ValueError(
                f"suite {suite!r} is blind (no look tools); the discrete twins' actions include the looks: pass "
                "suite='lab' (the blind variant has no discrete twin)"
            )
        self.tasks: list[Task] = self.suite.tasks(categories, split)
        config = self.suite.config
        self.shelves = list(string.ascii_uppercase[: config.num_shelves])
        self.capacity = config.capacity
        self.max_steps, self.max_boxes = max_steps, max_boxes
        self.actions: list[tuple[str, ...]] = self._build_actions()
        self.action_space = spaces.Discrete(len(self.actions))  # type: ignore[assignment]  # a Space[np.int64]
        self._blocks = self._block_sizes()
        self.observation_space = spaces.Box(0.0, 1.0, (sum(n for _, n in self._blocks),), np.float32)
        self.real_calls = 0
        self.task: Task | None = None

    # ------------------------------------------------------------------ gymnasium API
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Start a task: ``options={"task_id": ...}``, else one drawn with ``np_random``."""
        super().reset(seed=seed)
        task_id = (options or {}).get("task_id")
        if task_id is not None:
            matches = [t for t in self.tasks if t.id == task_id]
            if not matches:
                raise KeyError(f"no task {task_id!r} in this env's categories and split")
            self.task = matches[0]
        else:
            self.task = self.tasks[int(self.np_random.integers(len(self.tasks)))]
        self.backend = self.suite.make_backend(self.task)
        self.calls: list[ToolCall] = []
        self.last_failed = False
        self.outputs: list[str] = []  # the output of each call, in order
        self._mask = self._make_mask(self.task)
        return self._observe(), {"task_id": self.task.id, "real_calls": 0}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Make the call `action` names on the real backend, or close the episode and score it."""
        if self.task is None:
            raise RuntimeError("call reset() before step()")
        kind, *args = self.actions[int(action)]
        info: dict[str, Any] = {"task_id": self.task.id}
        if kind in ("reply", "done"):
            return self._finish(args[0] if kind == "reply" else "Done.", info, terminated=True)
        names = {
            "locate": ("item",),
            "list_shelf": ("shelf",),
            "move": ("item", "shelf"),
            "pack": ("item",),
            "ship": ("box", "dock"),
        }[kind]
        call = ToolCall(kind, dict(zip(names, args)))
        output = self.backend.execute(call)
        self.last_failed = output.startswith('{"error"')
        self.real_calls += 1
        self.calls.append(call)
        self.outputs.append(output)
        if len(self.calls) >= self.max_steps:
            return self._finish(None, info, terminated=False)
        info["real_calls"] = len(self.calls)
        return self._observe(), 0.0, False, False, info

    def action_masks(self) -> np.ndarray:
        """``(N,)`` bool: the actions that name this task's items and fit its closing (sb3-contrib reads it)."""
        return self._mask.copy()

    def describe(self) -> list[tuple[str, int]]:
        """The observation's blocks in order, as (name, width)."""
        return list(self._blocks)

    # ------------------------------------------------------------------ helpers (the first four: hooks)
    def _wrong_rules(self, suite: str) -> str:
        return (
            f"suite {suite!r} has hidden rules; the discrete twin's actions (box-k labels, one capacity) are the "
            "stated world's: pass suite='lab-stated', or use EnvACE-LabHiddenDiscrete-v0 for the hidden rules"
        )

    def _build_actions(self) -> list[tuple[str, ...]]:
        return (
            [("locate", i) for i in ITEMS]
            + [("list_shelf", s) for s in self.shelves]
            + [("move", i, s) for i in ITEMS for s in self.shelves]
            + [("pack", i) for i in ITEMS]
            + [("ship", f"box-{k}", d) for k in range(1, self.max_boxes + 1) for d in DOCKS]
            + [("reply", str(n)) for n in range(self.capacity + 1)]
            + [("done",)]
        )

    def _make_mask(self, task: Task) -> np.ndarray:
        present = {i for items in task.metadata["initial_state"]["shelves"].values() for i in items}
        is_count = task.metadata["category"] == "count"
        return np.array(
            [
                (a[0] == "reply") == is_count
                if a[0] in ("reply", "done")
                else a[1] in present
                if a[0] in ("locate", "move", "pack")
                else True
                for a in self.actions
            ],
            dtype=bool,
        )

    def _finish(self, reply: str | None, info: dict[str, Any], terminated: bool):
        if self.task is None:  # unreachable: only step() finishes, after checking the task
            raise RuntimeError("call reset() before step()")
        result = self.suite.score(self.task, self.calls, reply)
        info.update(real_calls=len(self.calls), verifier=result.details)
        return self._observe(), float(result.reward), terminated, not terminated, info

    def _block_sizes(self) -> list[tuple[str, int]]:
        places = 1 + len(self.shelves) + self.max_boxes + 1  # absent, shelves, boxes, broken
        return (
            [
                ("item places", len(ITEMS) * places),
                ("box docks", self.max_boxes * (len(DOCKS) + 1)),
                ("family", len(CATEGORIES)),
            ]
            + [(f"slot {s}", len(ITEMS) + 1) for s in _SLOT_ITEMS]
            + [(f"slot {d}", len(DOCKS) + 1) for d in _SLOT_DOCKS]
            + [("slot shelf", len(self.shelves) + 1), ("last call failed", 1), ("steps used", 1)]
        )

    def _observe(self) -> np.ndarray:
        if self.task is None:  # unreachable: reset() sets the task before any observation
            raise RuntimeError("call reset() before step()")
        task = self.task
        state, slots = self.backend.state, task.metadata["slots"]
        places = 1 + len(self.shelves) + self.max_boxes + 1
        where = np.zeros((len(ITEMS), places), np.float32)
        for k, item in enumerate(ITEMS):
            shelf = state.shelf_of(item)
            box = next((b for b, packed in state.boxes.items() if packed == item), None)
            if shelf is not None:
                where[k, 1 + self.shelves.index(shelf)] = 1
            elif box is not None and int(box.split("-")[1]) <= self.max_boxes:
                where[k, len(self.shelves) + int(box.split("-")[1])] = 1
            elif item in state.broken:
                where[k, places - 1] = 1
            else:
                where[k, 0] = 1
        docks = np.zeros((self.max_boxes, len(DOCKS) + 1), np.float32)
        for k in range(self.max_boxes):
            dock = state.shipped.get(f"box-{k + 1}")
            docks[k, 0 if dock is None else 1 + DOCKS.index(dock)] = 1
        family = np.eye(len(CATEGORIES), dtype=np.float32)[CATEGORIES.index(task.metadata["category"])]

        def one_hot(value: str | None, names: Sequence[str]) -> np.ndarray:
            v = np.zeros(len(names) + 1, np.float32)
            v[0 if value is None else 1 + list(names).index(value)] = 1
            return v

        parts = [where.ravel(), docks.ravel(), family]
        parts += [one_hot(slots.get(s), ITEMS) for s in _SLOT_ITEMS] + [
            one_hot(slots.get(d), DOCKS) for d in _SLOT_DOCKS
        ]
        parts += [
            one_hot(slots.get("shelf"), self.shelves),
            np.array([float(self.last_failed)], np.float32),
            np.array([len(self.calls) / self.max_steps], np.float32),
        ]
        return np.concatenate(parts)
