"""EnvACE-Lab v1 tasks: the warehouse under hidden rules, whose dynamics a model must learn from tool outputs.

The prompt shows the task's state (`hidden_layout_text`: each item with its shelf, in shelf order) and the
instruction, and no rule:
not the shelves' capacities, not what breaks, not how box labels are formed (`benchmarks.lab.world`, rules
``"hidden"``). The rules are fixed across tasks, so they can be learned; the layout varies per task. Every
family needs a value that only a tool output, or a model that has learned a rule, can give, and a later call
uses it as an argument (the third column):

| category      | instruction                                                               | value from a rule   |
|---------------|---------------------------------------------------------------------------|---------------------|
| ``relocate``  | move X to Y's shelf; if that shelf is full, put X on shelf E              | is Y's shelf full   |
| ``ship``      | ship A from dock D (pack, then ship the box the pack returned)            | the box label       |
| ``fill``      | move X, then W, to Y's shelf, as many of the two as it has room for       | free slots          |
| ``make_room`` | move X to Y's shelf; if it is full, first move W from it to shelf E       | is Y's shelf full   |
| ``ship_two``  | ship A from D1, then B from D2                                            | two box labels      |
| ``full_job``  | ``relocate``, then ``ship_two`` of two other items                        | all of the above    |

Mistakes the hidden rules make irreversible: a move onto a full shelf breaks the item for good; shipping a
box under a wrong label fails (a failed call scores 0). Each branch (full or not; 0, 1 or 2 free slots) is
drawn with equal probability before the layout, so guessing a branch is right about half or a third of the
time.

Splits. The test split is fixed: ``test_tasks`` tasks per family, drawn from
``random.Random(f"{seed}/test/{category}/{index}")``. The train split is an unlimited seeded stream
(`train_task`, from ``f"{seed}/train/{category}/{index}"``); a train draw whose (layout, instruction) equals a
test task's is drawn again, so no test pair is ever trained on. The validation split (``valid``, for choosing
a budget or a setting without looking at the test split) has ``test_tasks`` tasks per family drawn from
``f"{seed}/valid/{category}/{index}"``; a draw whose pair equals a test task's or one of the first
``train_tasks`` train tasks' (what `LabSuite.tasks` lists for training: SFT and GRPO draw from those) is drawn
again, so a validation task is neither tested nor trained on by default (which tasks it holds therefore
depends on ``train_tasks`` too).

Each family is one program (`solve`) over the prompt's layout and the instruction's slots, with an ``ask``
function that answers a call: the real backend (the reference solution), a private copy of the world built
from the prompt (a solver that knows the rules but never reads an output), a table of the most frequent
training outputs (a solver that knows no rule), or the told facts below (a solver that knows no rule but reads
them). `benchmarks.lab.properties` measures all four.

The told variant (``LabConfig(told=True)``, suite ``lab-told``): the same tasks, ids, splits, backend and verifier,
and the system prompt adds, after the layout, what the rules make of the task's *initial* state
(`told_facts_text`): each shelf's free slots and the box label prefix each item would get if packed first,
``Shelves A B C D. apple A, bolt A, cable C. room A 0, B 3, C 3, D 2. box apple A1, bolt A2, cable C1.``
Both are facts of the initial state, not rules: a later call can change them (a ``full_job`` move fills a shelf;
packing an item moves the items after it up a position, so the second of two items packed from one shelf gets
a label one position lower than told), and the label's count suffix ``-<n>`` (boxes packed so far + 1) is told
nowhere. The facts are written only in phrases the `lab-tiny` tokenizer, built from the untold world's texts,
already has (``room ``, ``box ``, letters, digits, ``, ``, ``. ``), so the same model reads both worlds.

The blind variant (``LabConfig(blind=True)``, suite ``lab-blind``): the same tasks, ids, splits, layouts and
verifier; the tools that only look (`benchmarks.lab.world.LOOK_TOOLS`: ``locate``, ``list_shelf``) are not offered
and the backend answers them as unknown tools, and the reference solutions make no look call (`solve` with
``look=False``: the rule decides). Whether Y's shelf is full, and how many slots it has free, is then known
only to a model that has learned the capacities, or to a rehearsal of the move before committing it: a move
onto a full shelf still breaks the item for good. So a rehearsal carries what the committed run cannot get
in time (in the default world it can always look first). ``ship`` and ``ship_two`` are unchanged (a box
label comes from ``pack``, which acts).
"""

from __future__ import annotations

import functools
import json
import random
import string
from collections.abc import Callable
from typing import Any

from benchmarks.lab.tasks import HIDDEN_CATEGORIES, ITEMS, LabConfig, split_turns
from benchmarks.lab.world import DOCKS, HIDDEN_TOOLS, LOOK_TOOLS, LabBackend, Warehouse, hidden_capacities
from envace_gym.types import Message, Task, ToolCall

__all__ = [
    "HIDDEN_CATEGORIES",
    "Ask",
    "solve",
    "test_task",
    "train_task",
    "backend_ask",
    "make_hidden_task",
    "hidden_layout_text",
    "told_facts_text",
    "shelves_from_prompt",
    "told_facts_from_prompt",
]


def hidden_layout_text(shelves: dict[str, list[str]]) -> str:
    """The system prompt under the hidden rules: the shelves, then each item with its shelf, shelf by shelf in
    order, e.g. ``Shelves A B C D. apple A, bolt A, cable C.`` No rule is stated. Item first, so "which
    shelf holds the Y" is the token after Y (a one-step lookup a small model learns), not the header of the
    group Y sits in."""
    placed = ", ".join(f"{item} {s}" for s, items in shelves.items() for item in items)
    return f"Shelves {' '.join(shelves)}. {placed}."


def told_facts_text(state: Warehouse) -> str:
    """What the hidden rules make of `state` (the told variant's addition to the system prompt; module docstring):
    each shelf's free slots, then each item's box label prefix ``<shelf><position>`` (what `pack` would label it
    with, without the ``-<n>`` count, were it packed now), items in layout order, e.g.
    ``room A 0, B 3, C 3, D 2. box apple A1, bolt A2, cable C1.``

    Raises:
        ValueError: `state` is not under the hidden rules.
    """
    if state.rules != "hidden":
        raise ValueError(f"told facts are the hidden rules' facts; the state has rules {state.rules!r}")
    room = ", ".join(f"{s} {state.capacity_of(s) - len(items)}" for s, items in state.shelves.items())
    labels = ", ".join(
        f"{item} {state.next_box(item).rpartition('-')[0]}" for items in state.shelves.values() for item in items
    )
    return f"room {room}. box {labels}."


Layout = dict[str, list[str]]
Ask = Callable[[ToolCall], dict[str, Any]]
"""Answers one call with its output as a dict (``{"error": ...}`` for a failed call)."""


def backend_ask(backend: LabBackend) -> Ask:
    """An `Ask` that executes on `backend` (the reference solution's; the calls change its state)."""
    return lambda call: json.loads(backend.execute(call))


def _shelf_of(layout: Layout, item: str) -> str:
    return next(s for s, items in layout.items() if item in items)


def _texts(category: str, slots: dict[str, str]) -> list[str]:
    """The instruction's parts (one per reference turn when split over two user turns)."""
    s = slots
    relocate = (
        f"Move the {s.get('x')} to the shelf where the {s.get('y')} is. If that shelf is full, put the "
        f"{s.get('x')} on shelf {s.get('e')}."
    )
    if category == "relocate":
        return [relocate]
    if category == "ship":
        return [f"Ship the {s['a']} from the {s['d1']} dock."]
    if category == "fill":
        return [
            f"Move the {s['x']} and then the {s['w']} to the shelf where the {s['y']} is, as many of the two "
            "as it has room for."
        ]
    if category == "make_room":
        return [
            f"Move the {s['x']} to the shelf where the {s['y']} is. If that shelf is full, first move the "
            f"{s['w']} from it to shelf {s['e']}."
        ]
    if category == "ship_two":
        return [f"Ship the {s['a']} from the {s['d1']} dock.", f"Then ship the {s['b']} from the {s['d2']} dock."]
    if category == "full_job":
        return [relocate, f"Then ship the {s['a']} from the {s['d1']} dock, and the {s['b']} from the {s['d2']} dock."]
    raise ValueError(f"unknown hidden-rules lab category {category!r}; categories: {', '.join(HIDDEN_CATEGORIES)}")


def _free(out: dict[str, Any]) -> int:
    free = out.get("free")
    return free if isinstance(free, int) else 0


def solve(category: str, layout: Layout, slots: dict[str, str], ask: Ask, *, look: bool = True) -> list[list[ToolCall]]:
    """The family's program: the calls of each instruction part, deciding on what `ask` answers.

    Args:
        category: a `HIDDEN_CATEGORIES` family.
        layout: the shelves as the prompt shows them (shelf -> items in order).
        slots: what the instruction names (``x``, ``y``, ``w``, ``a``, ``b``, ``d1``, ``d2``, ``e``).
        ask: answers each call in order (`Ask`); an answer without the field a decision reads counts as
            "no room" / no label.
        look: emit the ``list_shelf`` calls a decision reads. False (the blind variant): they are asked but left
            out of the program, so the decision is the rule's, not an output's; `ask` must then answer looks (a
            blind task's own backend refuses them, which would read as "no room": pass an unrestricted
            `LabBackend`, as `make_hidden_task` does).

    Raises:
        ValueError: an unknown category.
    """

    def call(name: str, **arguments: str) -> tuple[ToolCall, dict[str, Any]]:
        c = ToolCall(name, arguments)
        return c, ask(c)

    def looked(shelf: str) -> tuple[list[ToolCall], dict[str, Any]]:
        """The look at `shelf` as emitted calls (none when not `look`) and its output."""
        c, out = call("list_shelf", shelf=shelf)
        return ([c] if look else []), out

    def relocate() -> list[ToolCall]:
        sy = _shelf_of(layout, slots["y"])
        calls, out = looked(sy)
        move, _ = call("move", item=slots["x"], shelf=sy if _free(out) > 0 else slots["e"])
        return [*calls, move]

    def ship(item: str, dock: str) -> list[ToolCall]:
        pack, out = call("pack", item=item)
        box = out.get("box")
        send, _ = call("ship", box=box if isinstance(box, str) else "", dock=dock)
        return [pack, send]

    if category == "relocate":
        return [relocate()]
    if category == "ship":
        return [ship(slots["a"], slots["d1"])]
    if category == "fill":
        sy = _shelf_of(layout, slots["y"])
        calls, out = looked(sy)
        calls += [call("move", item=slots[k], shelf=sy)[0] for k in ("x", "w")[: _free(out)]]
        return [calls]
    if category == "make_room":
        sy = _shelf_of(layout, slots["y"])
        calls, out = looked(sy)
        if _free(out) == 0:
            calls.append(call("move", item=slots["w"], shelf=slots["e"])[0])
        calls.append(call("move", item=slots["x"], shelf=sy)[0])
        return [calls]
    if category == "ship_two":
        return [ship(slots["a"], slots["d1"]), ship(slots["b"], slots["d2"])]
    if category == "full_job":
        return [relocate(), ship(slots["a"], slots["d1"]) + ship(slots["b"], slots["d2"])]
    raise ValueError(f"unknown hidden-rules lab category {category!r}; categories: {', '.join(HIDDEN_CATEGORIES)}")


def _layout(rng: random.Random, config: LabConfig) -> tuple[Layout, str]:
    """A random layout and its empty shelf: 4 to ``num_items`` items spread over the other shelves within
    their (hidden) capacities."""
    caps = hidden_capacities(config.num_shelves)
    empty = rng.choice(list(caps))
    room = sum(c for s, c in caps.items() if s != empty)
    items = rng.sample(ITEMS, rng.randint(4, min(config.num_items, room - 1)))
    shelves: Layout = {s: [] for s in caps}
    for item in items:
        shelves[rng.choice([s for s in caps if s != empty and len(shelves[s]) < caps[s]])].append(item)
    return shelves, empty


def _draw(
    rng: random.Random, category: str, config: LabConfig, full: bool, free_target: int
) -> tuple[Layout, dict[str, str]] | None:
    """One draw of (layout, slots) for `category`, or None when the layout does not fit the branch (`full`: Y's
    shelf is full; `free_target`: the free slots of Y's shelf in ``fill``)."""
    caps = hidden_capacities(config.num_shelves)
    shelves, e = _layout(rng, config)
    where = {i: s for s, items in shelves.items() for i in items}
    docks = list(DOCKS)
    if category in ("relocate", "full_job", "make_room", "fill"):
        y = rng.choice(list(where))
        sy = where[y]
        free = caps[sy] - len(shelves[sy])
        others = [i for i in where if where[i] != sy]
        if category == "fill":
            if free != free_target or len(others) < 2:
                return None
            x, w = rng.sample(others, 2)
            return shelves, {"x": x, "w": w, "y": y}
        if (free == 0) != full or not others:
            return None
        x = rng.choice(others)
        if category == "make_room":
            mates = [i for i in shelves[sy] if i != y]
            if not mates:
                return None
            return shelves, {"x": x, "y": y, "w": rng.choice(mates), "e": e}
        if category == "relocate":
            return shelves, {"x": x, "y": y, "e": e}
        rest = [i for i in where if i not in (x, y)]
        if len(rest) < 2:
            return None
        a, b = rng.sample(rest, 2)
        return shelves, {"x": x, "y": y, "e": e, "a": a, "b": b, "d1": rng.choice(docks), "d2": rng.choice(docks)}
    if category == "ship":
        return shelves, {"a": rng.choice(list(where)), "d1": rng.choice(docks)}
    if category == "ship_two":
        a, b = rng.sample(list(where), 2)
        return shelves, {"a": a, "b": b, "d1": rng.choice(docks), "d2": rng.choice(docks)}
    raise ValueError(f"unknown hidden-rules lab category {category!r}; categories: {', '.join(HIDDEN_CATEGORIES)}")


def _generate(seed: str, category: str, config: LabConfig) -> tuple[Layout, dict[str, str]]:
    rng = random.Random(seed)
    full, free_target = rng.random() < 0.5, rng.randrange(3)  # the branch first, so each is equally likely
    for _ in range(500):
        drawn = _draw(rng, category, config, full, free_target)
        if drawn is not None:
            return drawn
    raise ValueError(f"{config}: 500 layouts in a row did not fit {category!r}; raise num_items")


def _key(category: str, layout: Layout, slots: dict[str, str]) -> str:
    """What a test pair is compared on: the state the prompt shows and the instruction."""
    return json.dumps([category, layout, _texts(category, slots)])


@functools.lru_cache(maxsize=8)
def _test_keys(config: LabConfig) -> frozenset[str]:
    return frozenset(
        _key(c, *_generate(f"{config.seed}/test/{c}/{i}", c, config))
        for c in HIDDEN_CATEGORIES
        for i in range(config.test_tasks)
    )


@functools.lru_cache(maxsize=8)
def _listed_train_keys(config: LabConfig) -> frozenset[str]:
    # the pairs of the train tasks `LabSuite.tasks(split="train")` lists, which the validation split avoids
    return frozenset(_key(c, *_train_draw(config, c, i)) for c in HIDDEN_CATEGORIES for i in range(config.train_tasks))


def _draw_avoiding(
    seed: str, category: str, config: LabConfig, taken: tuple[frozenset[str], ...]
) -> tuple[Layout, dict[str, str]]:
    """The layout and slots drawn from `seed`, or from ``seed/1``, ``seed/2``, ... while the pair is in `taken`."""
    redraw = 0
    while True:
        layout, slots = _generate(seed + (f"/{redraw}" if redraw else ""), category, config)
        if not any(_key(category, layout, slots) in keys for keys in taken):
            return layout, slots
        redraw += 1


def _train_draw(config: LabConfig, category: str, index: int) -> tuple[Layout, dict[str, str]]:
    return _draw_avoiding(f"{config.seed}/train/{category}/{index}", category, config, (_test_keys(config),))


def make_hidden_task(config: LabConfig, category: str, index: int, split: str) -> Task:
    """Task `index` of `category` in `split` (``"train"``: the stream; ``"test"``: the fixed split; ``"valid"``:
    the validation split); see the module docstring. Metadata as `benchmarks.lab.tasks.make_stated_task`
    (``answer`` is always None), plus ``split``.

    Raises:
        ValueError: an unknown category or split, or a test or validation index outside ``[0, config.test_tasks)``.
    """
    if split in ("test", "valid"):
        if not 0 <= index < config.test_tasks:
            raise ValueError(f"{split} index {index} outside [0, {config.test_tasks}) (LabConfig.test_tasks)")
        if split == "test":
            layout, slots = _generate(f"{config.seed}/test/{category}/{index}", category, config)
            task_id = f"{category}_test{index}"
        else:
            taken = (_test_keys(config), _listed_train_keys(config))
            layout, slots = _draw_avoiding(f"{config.seed}/valid/{category}/{index}", category, config, taken)
            task_id = f"{category}_valid{index}"
    elif split == "train":
        if index < 0:
            raise ValueError(f"train index must be >= 0, got {index}")
        layout, slots = _train_draw(config, category, index)
        task_id = f"{category}_{index}"
    else:
        raise ValueError(f"split must be train, valid or test, got {split!r}")
    state = Warehouse(
        capacity=max(hidden_capacities(config.num_shelves).values()),
        shelves={s: list(items) for s, items in layout.items()},
        rules="hidden",
    )
    reference = solve(category, layout, slots, backend_ask(LabBackend(state)), look=not config.blind)
    prompt = hidden_layout_text(state.shelves)
    system = Message("system", f"{prompt} {told_facts_text(state)}" if config.told else prompt)
    turns, reference_turns = split_turns(system, list(zip(_texts(category, slots), reference)), config.user_turns)
    return Task(
        id=task_id,
        suite="lab",
        turns=turns,
        tools=[t for name, t in HIDDEN_TOOLS.items() if not (config.blind and name in LOOK_TOOLS)],
        verifier="lab.final_state",
        metadata={
            "category": category,
            "initial_state": state.to_dict(),
            "split": split,
            "reference": [[c.to_openai() for c in turn] for turn in reference_turns],
            "answer": None,
            "slots": slots,
            "config": config.to_dict(),
        },
    )


def test_task(config: LabConfig, category: str, index: int) -> Task:
    """`make_hidden_task(config, category, index, "test")`."""
    return make_hidden_task(config, category, index, "test")


test_task.__test__ = False  # type: ignore[attr-defined]  # pytest reads it: a task maker, not a pytest test


def train_task(config: LabConfig, category: str, index: int) -> Task:
    """`make_hidden_task(config, category, index, "train")`: the stream's `index`-th task of `category`."""
    return make_hidden_task(config, category, index, "train")


def _prompt_sentences(task: Task) -> tuple[Layout, list[str]]:
    """The layout the system prompt writes and the sentences after it (none under the hidden rules, the
    ``room`` and ``box`` sentences when told).

    Raises:
        ValueError: the system prompt is not a hidden-rules layout, told or not.
    """
    text = task.turns[0][0].content if task.turns and task.turns[0] else ""
    # items, letters and digits hold no ". ", so the sentences split there ("Shelves A B. . room ..." when empty)
    header, *rest = text[:-1].split(". ") if text.endswith(".") else [text]
    if not header.startswith("Shelves ") or not rest or len(rest) not in (1, 3):
        raise ValueError(f"{task.id}: the system prompt {text!r} is not a hidden-rules layout")
    shelves: Layout = {s: [] for s in header[len("Shelves ") :].split(" ")}
    if list(shelves) != list(string.ascii_uppercase[: len(shelves)]):
        raise ValueError(f"{task.id}: shelves {list(shelves)} are not A, B, ... in order")
    for entry in rest[0].split(", ") if rest[0] else []:
        item, _, shelf = entry.rpartition(" ")
        if shelf not in shelves or not item:
            raise ValueError(f"{task.id}: {entry!r} in the system prompt is not an item and its shelf")
        shelves[shelf].append(item)
    return shelves, rest[1:]


def shelves_from_prompt(task: Task) -> Layout:
    """The layout as the task's system prompt writes it (inverse of `hidden_layout_text`; a told prompt's facts
    are skipped): what a solver that reads only the prompt knows of the state.

    Raises:
        ValueError: the system prompt is not a hidden-rules layout, told or not.
    """
    return _prompt_sentences(task)[0]


def told_facts_from_prompt(task: Task) -> tuple[dict[str, int], dict[str, str]]:
    """The told facts the system prompt writes (inverse of `told_facts_text`): shelf -> free slots, and
    item -> box label prefix (``"A2"``), both of the initial state.

    Raises:
        ValueError: the system prompt is not a told hidden-rules prompt (``LabConfig(told=True)``).
    """
    _, told = _prompt_sentences(task)
    if len(told) != 2 or not told[0].startswith("room ") or not told[1].startswith("box "):
        raise ValueError(f"{task.id}: the system prompt tells no facts; it is not a LabConfig(told=True) task's")
    try:
        room = {s: int(n) for s, _, n in (e.partition(" ") for e in told[0][len("room ") :].split(", "))}
    except ValueError:
        raise ValueError(f"{task.id}: {told[0]!r} is not shelves with their free slots") from None
    entries = told[1][len("box ") :].split(", ") if told[1] != "box " else []
    labels = {item: prefix for item, _, prefix in (e.rpartition(" ") for e in entries)}
    return room, labels
