"""Procedural EnvACE-Lab tasks: a warehouse layout, an instruction and its reference calls, from a seed.

`LabConfig.rules` picks the world: ``"hidden"`` (EnvACE-Lab v1, the default: the prompt shows the layout and
no rule; tasks in `benchmarks.lab.hidden`) or ``"stated"`` (this module's families below, whose rules the
prompt states, so every task can be solved from the prompt alone; kept because stated against hidden rules
measures what a world model is worth). The rest of this docstring describes the stated-rules world.

Every task is drawn by ``random.Random(f"{seed}/{category}/{index}")`` (string seeds hash with SHA-512,
so the same config gives the same tasks on every machine and Python version). The first user turn opens with
a system message that states the rules (`benchmarks.lab.world.rules_text`) and the shelves
(`layout_text`), so every tool output is determined by what the history shows. Task families (the suite's
categories), with the calls of their reference solution:

| category      | instruction                                                           | calls |
|---------------|-----------------------------------------------------------------------|-------|
| ``relocate``  | move X to the shelf where Y is (Y's shelf has room)                   | 2     |
| ``ship``      | ship X from dock D (pack, then ship the box the pack returned)        | 2     |
| ``count``     | how many free slots has the shelf where Y is? (answered in the reply) | 2     |
| ``make_room`` | move X to Y's shelf; if it is full, first move W from it to empty E   | 2-3   |
| ``ship_two``  | ship X from D1 and Y from D2 (box labels follow the packing order)    | 4     |
| ``full_job``  | ``relocate`` then ``ship_two`` of two other items                     | 6     |

The box a ``ship`` call names is the label an earlier ``pack`` returned, which follows from the packing order
only, so a wrong rehearsed label leads to a wrong call and R = 0 on replay. The shelf ``locate`` returns is
also readable from the prompt's layout: the reference solutions call it (the habit a world with hidden
state needs), but a policy may skip it. Shelves are filled at random up to capacity (a ``count`` answer is
0 to capacity - 1); ``make_room``'s shelf is full half the time, and moving onto a full shelf breaks the
item for good (the check that rehearsing before committing makes). A layout that does not fit a family
(no Y with room, say) is drawn again.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass
from typing import Any

from benchmarks.lab.world import DISTRACTOR_TOOLS, DOCKS, RULES, TOOLS, LabBackend, Warehouse, layout_text, rules_text
from envace_gym.types import Message, Task, ToolCall

__all__ = ["CATEGORIES", "STATED_CATEGORIES", "ITEMS", "LabConfig", "make_stated_task", "reference_final_state"]

STATED_CATEGORIES = ("relocate", "ship", "count", "make_room", "ship_two", "full_job")
"""The families of the stated-rules world."""
HIDDEN_CATEGORIES = ("relocate", "ship", "fill", "make_room", "ship_two", "full_job")
"""The families of the hidden-rules world (`benchmarks.lab.hidden`)."""
CATEGORIES = STATED_CATEGORIES
ITEMS = (
    "apple",
    "bolt",
    "cable",
    "drill",
    "glove",
    "hammer",
    "kettle",
    "lamp",
    "mirror",
    "nail",
    "rope",
    "saw",
    "tape",
    "vase",
    "wrench",
    "brush",
    "clock",
    "fan",
    "jar",
    "ladder",
    "mug",
    "pipe",
    "sock",
    "towel",
)
"""Item names; each is a few SmolLM2 tokens."""


@dataclass(frozen=True)
class LabConfig:
    """Difficulty knobs of the ``lab`` suite (every field changes the tasks, so a run names its config).

    Attributes:
        rules: ``"hidden"`` (v1, the default; `benchmarks.lab.hidden`) or ``"stated"`` (the families below).
        seed: the task seed.
        tasks_per_category: stated rules only: tasks drawn per category (>= 2), split by `test_fraction`.
        test_fraction: stated rules only: the last ``round(tasks_per_category * test_fraction)`` tasks of each
            category are the test split, the others the train split.
        train_tasks: hidden rules only: the train tasks `LabSuite.tasks` lists per category (>= 1): the first of
            the unlimited stream (`LabSuite.train_stream`), built when first asked for.
        test_tasks: hidden rules only: the fixed test split's tasks per category (>= 1).
        num_shelves: shelves ``A``, ``B``, ... (3 to 26).
        capacity: stated rules only: items per shelf (>= 2); the hidden rules give each shelf its own
            (`benchmarks.lab.world.HIDDEN_CAPACITIES`).
        num_items: items in a layout (>= 4; at most what the shelves hold, leaving room for the tasks); the
            hidden rules draw 4 to `num_items` per layout.
        distractors: stated rules only: also offer ``count_items``, ``inventory`` and ``weigh`` (no task needs
            them).
        user_turns: 1 (the whole instruction at once) or 2 (multi-part instructions split over two user turns,
            the second after the agent closed the first).
        told: hidden rules only: the system prompt also tells what the rules make of this task's initial state,
            each shelf's free slots and each item's box label prefix (`benchmarks.lab.hidden.told_facts_text`;
            suite ``lab-told``). The tasks, their ids, splits, backend and verifier are the hidden world's.
        blind: hidden rules only: the tools that only look (``locate``, ``list_shelf``: `LOOK_TOOLS`) are not
            offered and the backend refuses them, and the reference solutions make no look call, so whether a
            shelf is full is known only to a model that has learned the capacities, or to a rehearsal of the
            move (suite ``lab-blind``; `benchmarks.lab.hidden`). The tasks, ids, splits and verifier are the
            hidden world's.

    The calls may be written in either of the formats the env parses (Hermes ``<tool_call>`` blocks or
    BFCL's ``[f(a=1)]``); the tool schemas are in the system prompt, as in BFCL.
    """

    rules: str = "hidden"
    seed: int = 0
    tasks_per_category: int = 120
    test_fraction: float = 0.2
    train_tasks: int = 2000
    test_tasks: int = 100
    num_shelves: int = 4
    capacity: int = 3
    num_items: int = 6
    distractors: bool = False
    user_turns: int = 1
    told: bool = False
    blind: bool = False

    def __post_init__(self) -> None:
        if self.rules not in RULES:
            raise ValueError(f"LabConfig: rules must be one of {RULES}, got {self.rules!r}")
        if self.told and self.rules != "hidden":
            raise ValueError(
                "LabConfig: told states the hidden rules' facts of a task's initial state; set rules='hidden' or "
                "told=False (the stated rules already state every rule)"
            )
        if self.blind and self.rules != "hidden":
            raise ValueError(
                "LabConfig: blind takes the look tools away from the hidden rules' tasks; set rules='hidden' or "
                "blind=False (the stated rules state every rule, so there is nothing to look up)"
            )
        if self.rules == "hidden" and self.distractors:
            raise ValueError("LabConfig: distractors are a stated-rules knob; set rules='stated' or distractors=False")
        if self.test_tasks < 1 or self.train_tasks < 1:
            raise ValueError(
                f"LabConfig: train_tasks and test_tasks must be >= 1, got {self.train_tasks}, {self.test_tasks}"
            )
        if self.tasks_per_category < 2 or not 0 < self.test_fraction < 1:
            raise ValueError("LabConfig: tasks_per_category must be >= 2 and test_fraction in (0, 1)")
        if self.rules == "stated" and self.num_test >= self.tasks_per_category:
            raise ValueError(
                f"LabConfig: test_fraction {self.test_fraction} leaves no train task of "
                f"{self.tasks_per_category}; lower it or raise tasks_per_category"
            )
        if not 3 <= self.num_shelves <= 26 or self.capacity < 2:
            raise ValueError("LabConfig: num_shelves must be in [3, 26] and capacity >= 2")
        least, most = max(4, self.capacity + 1), min(len(ITEMS), (self.num_shelves - 1) * self.capacity - 1)
        if not least <= self.num_items <= most:
            raise ValueError(
                f"LabConfig: num_items must be in [{least}, {most}] for {self.num_shelves} shelves of "
                f"{self.capacity} (more than one shelf's worth, and one shelf is kept empty)"
            )
        if self.user_turns not in (1, 2):
            raise ValueError(f"LabConfig: user_turns must be 1 or 2, got {self.user_turns}")

    def to_dict(self) -> dict[str, Any]:
        """The fields by name, ``told`` and ``blind`` only when True: a config without them writes the same dict
        whether or not the fields exist, so the hidden and stated worlds' task metadata and the model folders
        named by a hash of the default config (`benchmarks.lab.lab_tiny.lab_tiny_dir`,
        `agents.models.lab_model_dir`) do not depend on them."""
        fields = dict(self.__dict__)
        for flag in ("told", "blind"):
            if not fields[flag]:
                del fields[flag]
        return fields

    @property
    def num_test(self) -> int:
        """Test tasks per category."""
        if self.rules == "hidden":
            return self.test_tasks
        return max(1, round(self.tasks_per_category * self.test_fraction))

    @property
    def categories(self) -> tuple[str, ...]:
        """The task families of this config's rules."""
        if self.rules == "hidden":
            return HIDDEN_CATEGORIES
        return STATED_CATEGORIES


Layout = dict[str, list[str]]
Parts = list[tuple[str, list[ToolCall]]]


def _layout(rng: random.Random, config: LabConfig, full: str | None = None) -> Layout:
    """A random layout: one shelf (not `full`) empty, the items spread over the others up to capacity;
    `full`, if given, is filled to capacity first."""
    letters = list(string.ascii_uppercase[: config.num_shelves])
    items = rng.sample(ITEMS, config.num_items)
    empty = rng.choice([s for s in letters if s != full])
    shelves: Layout = {s: [] for s in letters}
    if full is not None:
        shelves[full] = [items.pop() for _ in range(config.capacity)]
    for item in items:
        room = [s for s in letters if s not in (empty, full) and len(shelves[s]) < config.capacity]
        shelves[rng.choice(room)].append(item)
    return shelves


def _on(shelves: Layout) -> dict[str, str]:
    return {item: s for s, items in shelves.items() for item in items}


def _relocate(rng: random.Random, shelves: Layout, capacity: int):
    """Move some X onto the shelf of some Y that has room (X elsewhere); None when the layout has no such pair."""
    where = _on(shelves)
    pairs = [(x, y) for y in where if len(shelves[where[y]]) < capacity for x in where if where[x] != where[y]]
    if not pairs:
        return None
    x, y = rng.choice(pairs)
    return (
        f"Move the {x} to the shelf where the {y} is.",
        [ToolCall("locate", {"item": y}), ToolCall("move", {"item": x, "shelf": where[y]})],
        (x, y),
    )


def _ship(item: str, dock: str, box: int) -> tuple[str, list[ToolCall]]:
    return (
        f"ship the {item} from the {dock} dock",
        [ToolCall("pack", {"item": item}), ToolCall("ship", {"box": f"box-{box}", "dock": dock})],
    )


def _make_room(rng: random.Random, config: LabConfig) -> tuple[Layout, Parts, dict[str, str]] | None:
    letters = string.ascii_uppercase[: config.num_shelves]
    full = rng.random() < 0.5
    shelves = _layout(rng, config, full=rng.choice(letters) if full else None)
    if full:
        target = next(s for s, items in shelves.items() if len(items) == config.capacity)
    else:  # a shelf with room that holds Y and W besides
        candidates = [s for s, items in shelves.items() if 2 <= len(items) < config.capacity]
        if not candidates:
            return None
        target = rng.choice(candidates)
    y, w = rng.sample(shelves[target], 2)
    empty = next(s for s in letters if not shelves[s])
    x = rng.choice([i for s, items in shelves.items() if s != target for i in items])
    calls = [ToolCall("locate", {"item": y})]
    if full:
        calls.append(ToolCall("move", {"item": w, "shelf": empty}))
    calls.append(ToolCall("move", {"item": x, "shelf": target}))
    text = (
        f"Move the {x} to the shelf where the {y} is. If that shelf is full, first move the {w} from it to shelf "
        f"{empty}."
    )
    return shelves, [(text, calls)], {"x": x, "y": y, "w": w, "shelf": empty}


def _family(
    rng: random.Random, category: str, config: LabConfig
) -> tuple[Layout, Parts, str | None, dict[str, str]] | None:
    """One draw of (layout, instruction parts with their reference calls, the expected answer or None, the
    instruction's slots), or None when the drawn layout does not fit the family (the caller draws again).

    Slots name what the instruction mentions: items ``x``, ``y``, ``w``, ``a``, ``b``, docks ``d1``, ``d2``
    and a ``shelf`` (the discrete twin, `benchmarks.lab.discrete`, observes them)."""
    if category == "make_room":
        drawn = _make_room(rng, config)
        return None if drawn is None else (drawn[0], drawn[1], None, drawn[2])
    shelves = _layout(rng, config)
    where = _on(shelves)
    docks = list(DOCKS)
    if category in ("relocate", "full_job"):
        move = _relocate(rng, shelves, config.capacity)
        if move is None:
            return None
        text, calls, (x, y) = move
        if category == "relocate":
            return shelves, [(text, calls)], None, {"x": x, "y": y}
        a, b = rng.sample([i for i in where if i not in (x, y)], 2)
        d1, d2 = rng.choice(docks), rng.choice(docks)
        (ta, ca), (tb, cb) = _ship(a, d1, 1), _ship(b, d2, 2)
        return (
            shelves,
            [(text, calls), (f"Then {ta}, and {tb}.", ca + cb)],
            None,
            {"x": x, "y": y, "a": a, "b": b, "d1": d1, "d2": d2},
        )
    if category == "ship":
        a, d1 = rng.choice(list(where)), rng.choice(docks)
        text, calls = _ship(a, d1, 1)
        return shelves, [(text[0].upper() + text[1:] + ".", calls)], None, {"a": a, "d1": d1}
    if category == "count":
        y = rng.choice(list(where))
        free = config.capacity - len(shelves[where[y]])
        return (
            shelves,
            [
                (
                    f"How many free slots does the shelf with the {y} have? Answer with the number.",
                    [ToolCall("locate", {"item": y}), ToolCall("list_shelf", {"shelf": where[y]})],
                )
            ],
            str(free),
            {"y": y},
        )
    if category == "ship_two":
        a, b = rng.sample(list(where), 2)
        d1, d2 = rng.choice(docks), rng.choice(docks)
        (ta, ca), (tb, cb) = _ship(a, d1, 1), _ship(b, d2, 2)
        return (
            shelves,
            [(ta[0].upper() + ta[1:] + ".", ca), (f"Then {tb}.", cb)],
            None,
            {"a": a, "b": b, "d1": d1, "d2": d2},
        )
    raise ValueError(f"unknown lab category {category!r}; categories: {', '.join(CATEGORIES)}")


def _generate(rng: random.Random, category: str, config: LabConfig) -> tuple[Layout, Parts, str | None, dict[str, str]]:
    """Draw layouts until one fits the family (a fixed number of tries, so generation always ends)."""
    for _ in range(200):
        drawn = _family(rng, category, config)
        if drawn is not None:
            return drawn
    raise ValueError(f"{config}: 200 layouts in a row did not fit {category!r}; change num_items or capacity")


def split_turns(system: Message, parts: Parts, user_turns: int) -> tuple[list[list[Message]], list[list[ToolCall]]]:
    """The user turns (the system message opening the first) and the reference calls per turn, from the
    instruction's parts: all parts in one turn, or with ``user_turns == 2`` the first part, then the rest (a
    second turn's leading "Then" becomes "Now")."""
    groups = [parts[:1], parts[1:]] if user_turns == 2 and len(parts) > 1 else [parts]
    turns = []
    for t, group in enumerate(groups):
        text = " ".join(p[0] for p in group)
        if t > 0 and text.startswith("Then "):
            text = "Now " + text[5].lower() + text[6:]
        turns.append(([system] if t == 0 else []) + [Message("user", text)])
    return turns, [[c for p in group for c in p[1]] for group in groups]


def make_stated_task(config: LabConfig, category: str, index: int) -> Task:
    """Stated-rules task ``f"{category}_{index}"`` of `config` (see the module docstring): the index alone
    decides the task (`LabSuite` splits by index). `benchmarks.lab.suite.make_task` picks this or the
    hidden-rules `benchmarks.lab.hidden.make_hidden_task` by ``config.rules``.

    The task's metadata holds ``category``, ``initial_state`` (a `Warehouse` dict), ``reference`` (the
    reference calls per user turn, OpenAI dicts), ``answer`` (the expected number in the reply, or None),
    ``slots`` (what the instruction names, `_family`) and ``config`` (the `LabConfig` fields).

    Raises:
        ValueError: an unknown category.
    """
    rng = random.Random(f"{config.seed}/{category}/{index}")
    shelves, parts, answer, slots = _generate(rng, category, config)
    state = Warehouse(capacity=config.capacity, shelves={s: list(items) for s, items in shelves.items()})
    system = Message("system", f"{rules_text(config.capacity)}\n\n{layout_text(state.shelves)}")
    turns, reference = split_turns(system, parts, config.user_turns)
    tools = [TOOLS[n] for n in ("locate", "list_shelf", "move", "pack", "ship")]
    if config.distractors:
        tools += list(DISTRACTOR_TOOLS.values())
    return Task(
        id=f"{category}_{index}",
        suite="lab",
        turns=turns,
        tools=tools,
        verifier="lab.final_state",
        metadata={
            "category": category,
            "initial_state": state.to_dict(),
            "reference": [[c.to_openai() for c in turn] for turn in reference],
            "answer": answer,
            "slots": slots,
            "config": config.to_dict(),
        },
    )


def reference_final_state(task: Task) -> dict[str, Any]:
    """The state after the task's reference calls (what `benchmarks.lab.suite.LabSuite.verify` compares to)."""
    backend = LabBackend(Warehouse.from_dict(task.metadata["initial_state"]))
    for turn in task.metadata["reference"]:
        for call in turn:
            backend.execute(ToolCall.from_openai(call))
    return backend.state.to_dict()
