"""`LabHiddenDiscreteEnv` (``EnvACE-LabHiddenDiscrete-v0``): the hidden-rules lab world with discrete actions.

The discrete twin of suite ``lab`` (`benchmarks.lab.hidden`), for model-free RL: the same tasks, real backend
and reward as the suite's own scoring (`benchmarks.lab.suite.LabSuite.score`), with the text replaced by
what it says. The observation holds what the text policy sees and nothing more: the prompt's layout, the
instruction's slots and what the tool outputs have revealed so far. A hidden value (a box label, whether a
shelf is full, its free slots) is in it only once an output has shown it, so PPO must learn to make the
revealing call and read its answer, as the text policy must (the stated-rules twin,
`benchmarks.lab.discrete.LabDiscreteEnv`, observes the whole state instead, which the stated rules make
readable from the prompt).

## Action Space
``Discrete(N)`` over every tool call the hidden world can parse, in this order: ``locate(item)`` per item of
the vocabulary (`benchmarks.lab.tasks.ITEMS`), ``list_shelf(shelf)`` per shelf, ``move(item, shelf)`` per
pair, ``pack(item)`` per item, ``ship(label, dock)`` for every label a ``pack`` can return and each dock,
then the closing action ``done``. Labels are ``f"{shelf}{position}-{n}"`` for every shelf, position 1 to
`positions` (the largest shelf's capacity, the same for every shelf, so the action set states no shelf's
capacity) and n = 1..``max_boxes``: the agent must read the label a ``pack`` returned off the observation
and pick the matching ``ship``. With the default knobs N = 24 + 4 + 96 + 24 + 192 + 1 = 341.
`action_masks` (read by sb3-contrib's ``MaskablePPO``) allows the calls that name an item of this task's
prompt layout, every ``list_shelf``, every ``ship`` and ``done``: it masks nothing a hidden value decides,
so a move onto a full shelf (the item breaks) and a ship of a label no pack returned (the call fails) stay
allowed, the mistakes to learn to avoid.

## Observation Space
``Box(0, 1, (D,), float32)``, one-hot blocks (`describe` names them; D = 1,388 with the default knobs),
each read off the prompt or an output, never off the backend's state:

* ``layout``: per vocabulary item, its shelf and position in the prompt's layout (or absent), parsed from
  the system prompt (`benchmarks.lab.hidden.shelves_from_prompt`). A told suite (``lab-told``) is accepted and
  observed the same way: none of the facts its prompt tells is in the observation (so
  `benchmarks.experiments.maskable_ppo.discrete_twin` gives it no twin).
* ``item now``: per item, what the outputs said happened to it: nothing, moved to a shelf (a ``move``
  output), packed (a ``pack`` output) or broken (a ``move`` that failed because the shelf was full).
* ``box k`` for k = 1..``max_boxes``, the k-th successful ``pack`` in order: the item packed, the label
  the output returned (one of the action labels, or "other"), and the dock a ``ship`` output sent it from.
* ``shelf S listed``: the items the latest ``list_shelf(S)`` output listed, position by position, and
  ``shelf S free``: its free slots (unknown until listed; 0 to `positions`). A later move does not update
  them: the text shows the old output until the shelf is listed again.
* ``family`` (`benchmarks.lab.tasks.HIDDEN_CATEGORIES`) and the instruction's slots: items ``x``, ``y``,
  ``w``, ``a``, ``b``, docks ``d1``, ``d2``, shelf ``e`` (each with a "not named" entry).
* ``last call failed`` and ``steps used`` (the fraction of ``max_steps``).

## Rewards
0 on every step; on ``done``, or when ``max_steps`` calls run out (truncated), the suite's score of the calls
made: 1 when the final state is the reference's and no call failed.

## Episode End
Terminated by ``done``; truncated after ``max_steps`` tool calls.

## Info
``task_id``, ``real_calls`` (the episode's tool calls, each sent to the real backend), and on the last step
``verifier`` (the suite's details). The attribute ``real_calls`` counts every call since the env was made.

## Arguments
* ``suite`` (str): a registered hidden-rules lab suite (``"lab"``, the default, or a `LabConfig` variant).
* ``categories``, ``split``: as `LabSuite.tasks` (the ``train`` split is the first ``config.train_tasks``
  tasks of the train stream).
* ``max_steps`` (int): tool calls per episode; default 8 (``full_job`` needs 6).
* ``max_boxes`` (int): the highest packing count a label can name; default 3 (the tasks pack 2 at most).

## Version History
* v0: initial version.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np

from benchmarks.lab.discrete import LabDiscreteEnv
from benchmarks.lab.hidden import shelves_from_prompt
from benchmarks.lab.tasks import HIDDEN_CATEGORIES, ITEMS
from benchmarks.lab.world import DOCKS, hidden_capacities
from envace_gym.types import Task

__all__ = ["LabHiddenDiscreteEnv"]

_SLOT_ITEMS = ("x", "y", "w", "a", "b")
_SLOT_DOCKS = ("d1", "d2")


def _one_hot(value: str | None, names: Sequence[str]) -> np.ndarray:
    """``len(names) + 1`` wide: entry 0 for None, else 1 + the index of `value`."""
    v = np.zeros(len(names) + 1, np.float32)
    v[0 if value is None else 1 + list(names).index(value)] = 1
    return v


class LabHiddenDiscreteEnv(LabDiscreteEnv):
    """The hidden-rules lab world with discrete actions and an observation of what the text shows (see the
    module docstring)."""

    rules = "hidden"

    def __init__(
        self,
        suite: str = "lab",
        categories: Sequence[str] | None = None,
        split: str = "train",
        max_steps: int = 8,
        max_boxes: int = 3,
    ) -> None:
        super().__init__(suite, categories, split, max_steps, max_boxes)

    @property
    def positions(self) -> int:
        """Positions a label or a shelf listing can name on any shelf: the largest hidden capacity."""
        return max(hidden_capacities(len(self.shelves)).values())

    @property
    def labels(self) -> list[str]:
        """Every box label the action space can name, in action order."""
        return [
            f"{s}{p}-{n}"
            for n in range(1, self.max_boxes + 1)
            for s in self.shelves
            for p in range(1, self.positions + 1)
        ]

    # ------------------------------------------------------------------ the hooks of LabDiscreteEnv
    def _wrong_rules(self, suite: str) -> str:
        return (
            f"suite {suite!r} has stated rules; EnvACE-LabHiddenDiscrete-v0 is the hidden-rules world's twin: "
            "pass suite='lab', or use EnvACE-LabDiscrete-v0 for the stated rules"
        )

    def _build_actions(self) -> list[tuple[str, ...]]:
        return (
            [("locate", i) for i in ITEMS]
            + [("list_shelf", s) for s in self.shelves]
            + [("move", i, s) for i in ITEMS for s in self.shelves]
            + [("pack", i) for i in ITEMS]
            + [("ship", label, d) for label in self.labels for d in DOCKS]
            + [("done",)]
        )

    def _make_mask(self, task: Task) -> np.ndarray:
        present = {i for items in shelves_from_prompt(task).values() for i in items}
        return np.array(
            [a[1] in present if a[0] in ("locate", "move", "pack") else True for a in self.actions], dtype=bool
        )

    def _block_sizes(self) -> list[tuple[str, int]]:
        places = 1 + len(self.shelves) * self.positions
        box = len(ITEMS) + 1 + len(self.labels) + 2 + len(DOCKS) + 1  # item, label (none, ..., other), dock
        return (
            [("layout", len(ITEMS) * places), ("item now", len(ITEMS) * (1 + len(self.shelves) + 2))]
            + [(f"box {k}", box) for k in range(1, self.max_boxes + 1)]
            + [(f"shelf {s} listed", self.positions * (len(ITEMS) + 1)) for s in self.shelves]
            + [(f"shelf {s} free", self.positions + 2) for s in self.shelves]
            + [("family", len(HIDDEN_CATEGORIES))]
            + [(f"slot {s}", len(ITEMS) + 1) for s in _SLOT_ITEMS]
            + [(f"slot {d}", len(DOCKS) + 1) for d in _SLOT_DOCKS]
            + [("slot e", len(self.shelves) + 1), ("last call failed", 1), ("steps used", 1)]
        )

    def _observe(self) -> np.ndarray:
        if self.task is None:  # unreachable: reset() sets the task before any observation
            raise RuntimeError("call reset() before step()")
        task, shelves, positions = self.task, self.shelves, self.positions
        labels = self.labels
        # the prompt's layout: shelf and position of each item
        layout = np.zeros((len(ITEMS), 1 + len(shelves) * positions), np.float32)
        layout[:, 0] = 1
        for s, items in shelves_from_prompt(task).items():
            for p, item in enumerate(items[:positions]):
                k = ITEMS.index(item)
                layout[k, 0], layout[k, 1 + shelves.index(s) * positions + p] = 0, 1
        # what the outputs revealed, call by call (each output read as the text shows it)
        now: dict[str, int] = {}  # item -> column of "item now" (0: nothing said)
        boxes: list[list[str | None]] = []  # [item, label, dock] per successful pack, in order
        listed: dict[str, list[str]] = {}
        free: dict[str, int] = {}
        for call, text in zip(self.calls, self.outputs):
            out = json.loads(text)
            named = call.arguments.get("item")
            if call.name == "move" and "to" in out:
                now[out["item"]] = 1 + shelves.index(out["to"])
            elif call.name == "move" and "fell and broke" in str(out.get("error", "")):
                now[str(named)] = 1 + len(shelves) + 1
            elif call.name == "pack" and "box" in out:
                now[out["item"]] = 1 + len(shelves)
                boxes.append([out["item"], out["box"], None])
            elif call.name == "ship" and "dock" in out:
                for box in boxes:
                    if box[1] == out["box"]:
                        box[2] = out["dock"]
            elif call.name == "list_shelf" and "free" in out:
                listed[out["shelf"]], free[out["shelf"]] = list(out["items"]), int(out["free"])
        item_now = np.zeros((len(ITEMS), 1 + len(shelves) + 2), np.float32)
        for k, item in enumerate(ITEMS):
            item_now[k, now.get(item, 0)] = 1
        parts = [layout.ravel(), item_now.ravel()]
        for k in range(self.max_boxes):
            packed, label, dock = boxes[k] if k < len(boxes) else (None, None, None)
            label_v = np.zeros(len(labels) + 2, np.float32)
            label_v[0 if label is None else 1 + labels.index(label) if label in labels else len(labels) + 1] = 1
            parts += [_one_hot(packed, ITEMS), label_v, _one_hot(dock, DOCKS)]
        for s in shelves:
            rows = listed.get(s, [])
            parts += [np.concatenate([_one_hot(rows[p] if p < len(rows) else None, ITEMS) for p in range(positions)])]
        for s in shelves:
            v = np.zeros(positions + 2, np.float32)
            v[0 if s not in free else 1 + min(max(free[s], 0), positions)] = 1
            parts.append(v)
        slots = task.metadata["slots"]
        parts.append(
            np.eye(len(HIDDEN_CATEGORIES), dtype=np.float32)[HIDDEN_CATEGORIES.index(task.metadata["category"])]
        )
        parts += [_one_hot(slots.get(s), ITEMS) for s in _SLOT_ITEMS]
        parts += [_one_hot(slots.get(d), DOCKS) for d in _SLOT_DOCKS]
        parts += [
            _one_hot(slots.get("e"), shelves),
            np.array([float(self.last_failed)], np.float32),
            np.array([len(self.calls) / self.max_steps], np.float32),
        ]
        return np.concatenate(parts)
