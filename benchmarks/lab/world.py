"""The EnvACE-Lab warehouse: its state, its tools and their rules (the real backend of the ``lab`` suite).

A warehouse has shelves ``A``, ``B``, ... that each hold at most ``capacity`` items, loading docks
(``north``, ``south``, ``east``, ``west``) and boxes. Every tool output is a deterministic function of the
call and of the state, and the state is what the task's prompt states (the initial shelves) changed by the
calls the history shows, so a world model can learn the tools exactly:

* ``locate(item)``: where an item is: ``{"item", "shelf"}``, or ``{"item", "box"}`` once packed.
* ``list_shelf(shelf)``: ``{"shelf", "items", "free"}`` (items in the order they were put there).
* ``move(item, shelf)``: ``{"item", "from", "to"}``. An item moved onto a full shelf falls and breaks: it
  leaves the warehouse for good and the output says so (``{"error": ...}``): the irreversible mistake that
  rehearsing before committing avoids.
* ``pack(item)``: takes an item off its shelf into a new box; boxes are labelled ``box-1``, ``box-2``, ...
  in the order they are packed: ``{"item", "box"}``.
* ``ship(box, dock)``: sends a packed box from a dock: ``{"box", "dock"}``.
* Distractors (a difficulty knob; no task needs them): ``count_items(shelf)`` ``{"shelf", "count"}``,
  ``inventory()`` ``{"shelves": {...}}``, ``weigh(item)`` ``{"item", "kg"}`` (the length of its name).

Calls that break no rule but cannot run (an unknown item, shelf, box or dock, a missing argument, a box
shipped twice) return ``{"error": ...}`` and change nothing. Outputs are one-line JSON
(``json.dumps(..., separators=(", ", ": "))``).

Two rule sets (`Warehouse.rules`), both deterministic functions of the call and the state:

* ``"stated"`` (the variant above, whose rules the prompt states): one ``capacity`` for every shelf, boxes
  labelled ``box-1``, ``box-2``, ... in packing order.
* ``"hidden"`` (EnvACE-Lab v1, the default world; the prompt shows the layout and none of these rules): each
  shelf's capacity follows its letter (`HIDDEN_CAPACITIES`, cycling: A 2, B 3, C 4, D 2, ...), so whether a
  shelf is full is known only to ``list_shelf`` (``free``; the blind variant does not offer it, `LOOK_TOOLS`)
  or to a model that has learned the table; a box
  is labelled from where the item stood and the packing order, ``f"{shelf}{position}-{n}"`` (``"B2-1"``: the
  second item on shelf B, the first box packed), positions counted from 1 at the time of packing (items
  after a removed one move up). Tool descriptions say what a tool is for, not what it answers
  (`HIDDEN_TOOLS`).

The backend does O(capacity x shelves) work per call on validated arguments: nothing a call passes can
make it loop, allocate or recurse, so it runs in the caller's process without `envace_gym.limits`
isolation (which costs milliseconds per call; docs/design.md §3 asks only that a backend cannot hang the env).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from envace_gym.types import ToolCall, ToolSpec

__all__ = [
    "DOCKS",
    "HIDDEN_CAPACITIES",
    "RULES",
    "Warehouse",
    "LabBackend",
    "TOOLS",
    "HIDDEN_TOOLS",
    "LOOK_TOOLS",
    "DISTRACTOR_TOOLS",
    "rules_text",
    "layout_text",
    "hidden_capacities",
]

DOCKS = ("north", "south", "east", "west")
RULES = ("hidden", "stated")
"""The lab's rule sets: ``hidden`` (v1, the default: rules learned from outputs) and ``stated`` (in the prompt)."""
HIDDEN_CAPACITIES = (2, 3, 4)
"""Shelf capacities of the hidden rules, by letter and cycling: A 2, B 3, C 4, D 2, E 3, ..."""


def hidden_capacities(num_shelves: int) -> dict[str, int]:
    """Shelf letter -> capacity under the hidden rules (`HIDDEN_CAPACITIES`, cycling)."""
    import string

    letters = string.ascii_uppercase[:num_shelves]
    return {s: HIDDEN_CAPACITIES[i % len(HIDDEN_CAPACITIES)] for i, s in enumerate(letters)}


def _str_param(description: str) -> dict[str, Any]:
    return {"type": "string", "description": description}


TOOLS = {
    "locate": ToolSpec(
        "locate",
        "Find an item: the shelf it is on, or the box it was packed into.",
        {"type": "object", "properties": {"item": _str_param("the item's name")}, "required": ["item"]},
    ),
    "list_shelf": ToolSpec(
        "list_shelf",
        "List the items on a shelf and its free slots.",
        {"type": "object", "properties": {"shelf": _str_param("a shelf letter, e.g. 'A'")}, "required": ["shelf"]},
    ),
    "move": ToolSpec(
        "move",
        "Move an item from its shelf onto another shelf. An item moved onto a full shelf falls and breaks.",
        {
            "type": "object",
            "properties": {"item": _str_param("the item's name"), "shelf": _str_param("the destination shelf letter")},
            "required": ["item", "shelf"],
        },
    ),
    "pack": ToolSpec(
        "pack",
        "Take an item off its shelf and pack it into a new box; returns the box label.",
        {"type": "object", "properties": {"item": _str_param("the item's name")}, "required": ["item"]},
    ),
    "ship": ToolSpec(
        "ship",
        "Ship a packed box from a loading dock.",
        {
            "type": "object",
            "properties": {
                "box": _str_param("the box label, e.g. 'box-1'"),
                "dock": _str_param("north, south, east or west"),
            },
            "required": ["box", "dock"],
        },
    ),
}
HIDDEN_TOOLS = {
    "locate": ToolSpec("locate", "Find an item.", TOOLS["locate"].parameters),
    "list_shelf": ToolSpec("list_shelf", "Look at a shelf.", TOOLS["list_shelf"].parameters),
    "move": ToolSpec("move", "Move an item onto another shelf.", TOOLS["move"].parameters),
    "pack": ToolSpec("pack", "Pack an item into a box.", TOOLS["pack"].parameters),
    "ship": ToolSpec(
        "ship",
        "Ship a packed box from a loading dock.",
        {
            "type": "object",
            "properties": {"box": _str_param("the box label"), "dock": _str_param("north, south, east or west")},
            "required": ["box", "dock"],
        },
    ),
}
"""The tools of the hidden-rules world: the same names and arguments, descriptions that state no rule."""
LOOK_TOOLS = ("locate", "list_shelf")
"""The tools that only look (no state change); the blind variant (``LabConfig(blind=True)``) does not offer them."""
DISTRACTOR_TOOLS = {
    "count_items": ToolSpec(
        "count_items",
        "Count the items on a shelf.",
        {"type": "object", "properties": {"shelf": _str_param("a shelf letter")}, "required": ["shelf"]},
    ),
    "inventory": ToolSpec("inventory", "List every shelf and its items.", {"type": "object", "properties": {}}),
    "weigh": ToolSpec(
        "weigh",
        "Weigh an item (kg).",
        {"type": "object", "properties": {"item": _str_param("the item's name")}, "required": ["item"]},
    ),
}


def _out(payload: dict[str, Any]) -> str:
    return json.dumps(payload, separators=(", ", ": "))


@dataclass
class Warehouse:
    """The state: shelf contents in order, packed boxes and shipments.

    Attributes:
        capacity: items a shelf holds at most (>= 1) under the stated rules; under the hidden rules the
            largest of `hidden_capacities` (shelves hold their own, `capacity_of`).
        shelves: shelf letter -> item names, in the order they were put there.
        boxes: box label -> the item packed into it, in packing order.
        shipped: box label -> dock, in shipping order.
        broken: items that fell off a full shelf, in order.
        rules: ``"stated"`` or ``"hidden"`` (module docstring): decides `capacity_of` and the box labels.
    """

    capacity: int
    shelves: dict[str, list[str]]
    boxes: dict[str, str] = field(default_factory=dict)
    shipped: dict[str, str] = field(default_factory=dict)
    broken: list[str] = field(default_factory=list)
    rules: str = "stated"

    def __post_init__(self) -> None:
        if self.rules not in RULES:
            raise ValueError(f"Warehouse: rules must be one of {RULES}, got {self.rules!r}")

    def shelf_of(self, item: str) -> str | None:
        """The shelf holding `item`, or None."""
        return next((s for s, items in self.shelves.items() if item in items), None)

    def capacity_of(self, shelf: str) -> int:
        """Items `shelf` holds at most (`hidden_capacities` under the hidden rules)."""
        if self.rules == "hidden":
            return hidden_capacities(len(self.shelves))[shelf]
        return self.capacity

    def next_box(self, item: str) -> str:
        """The label `pack(item)` gives now (`item` is on a shelf): ``box-<n>`` (stated) or
        ``<shelf><position>-<n>`` (hidden)."""
        n = len(self.boxes) + 1
        if self.rules == "hidden":
            shelf = self.shelf_of(item)
            if shelf is None:  # `item` is on a shelf (the caller checks); indexing with None raised KeyError too
                raise KeyError(item)
            return f"{shelf}{self.shelves[shelf].index(item) + 1}-{n}"
        return f"box-{n}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-compatible state (what `LabBackend.snapshot` encodes); ``rules`` appears only when hidden, so a
        stated-rules state encodes as it always has."""
        d = {
            "capacity": self.capacity,
            "shelves": self.shelves,
            "boxes": self.boxes,
            "shipped": self.shipped,
            "broken": self.broken,
        }
        if self.rules != "stated":
            d["rules"] = self.rules
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Warehouse:
        """Inverse of `to_dict` (deep-copied)."""
        d = copy.deepcopy(d)
        return cls(
            capacity=int(d["capacity"]),
            shelves=d["shelves"],
            boxes=d.get("boxes", {}),
            shipped=d.get("shipped", {}),
            broken=d.get("broken", []),
            rules=d.get("rules", "stated"),
        )


def rules_text(capacity: int) -> str:
    """The rules as the task's prompt states them."""
    return (
        f"You run a warehouse. Each shelf holds at most {capacity} items. An item moved onto a full shelf falls "
        "and breaks, and it is gone for good, so check that a shelf has room before moving onto it. Packing an "
        "item takes it off its shelf into a new box; boxes are labelled box-1, box-2, ... in the order they are "
        "packed. Ship boxes from the north, south, east or west dock. Call the tools to act; when the job is "
        "done, reply with a short sentence and no tool call."
    )


def layout_text(shelves: dict[str, list[str]]) -> str:
    """The shelves as the prompt shows them, e.g. ``Shelf A: apple, bolt. Shelf B: empty.``"""
    return " ".join(f"Shelf {s}: {', '.join(items) if items else 'empty'}." for s, items in shelves.items())


class LabBackend:
    """The real tools over one `Warehouse` (a `envace_gym.suites.ToolBackend`); see the module docstring.

    Args:
        state: the initial state (copied).
        offered: the tool names it answers (None: every tool of `TOOLS` and `DISTRACTOR_TOOLS`); another name
            gets the unknown-tool error output (the blind variant refuses `LOOK_TOOLS` this way).
    """

    def __init__(self, state: Warehouse, offered: Collection[str] | None = None) -> None:
        self.state = Warehouse.from_dict(state.to_dict())
        known = frozenset({*TOOLS, *DISTRACTOR_TOOLS})
        self.offered = known if offered is None else known & frozenset(offered)

    def snapshot(self) -> bytes:
        """The state as canonical JSON bytes."""
        return json.dumps(self.state.to_dict(), sort_keys=True).encode()

    def execute(self, call: ToolCall) -> str:
        """Run one call; an unknown tool or bad argument gives an ``{"error": ...}`` output, never an exception."""
        handler = getattr(self, f"_tool_{call.name}", None) if call.name in self.offered else None
        if handler is None:
            return _out({"error": f"unknown tool {call.name!r}"})
        args = call.arguments if isinstance(call.arguments, dict) else {}
        names = TOOLS.get(call.name) or DISTRACTOR_TOOLS[call.name]
        required = names.parameters.get("required", [])
        missing = [r for r in required if not isinstance(args.get(r), str)]
        if missing:
            return _out({"error": f"{call.name} needs the string argument(s) {missing}"})
        return _out(handler(*(args[r] for r in required)))

    # ------------------------------------------------------------------ the tools
    def _tool_locate(self, item: str) -> dict[str, Any]:
        shelf = self.state.shelf_of(item)
        if shelf is not None:
            return {"item": item, "shelf": shelf}
        box = next((b for b, packed in self.state.boxes.items() if packed == item), None)
        if box is not None:
            return {"item": item, "box": box}
        return {"error": f"no item named {item!r} in the warehouse"}

    def _tool_list_shelf(self, shelf: str) -> dict[str, Any]:
        if shelf not in self.state.shelves:
            return {"error": f"no shelf {shelf!r}"}
        items = self.state.shelves[shelf]
        return {"shelf": shelf, "items": list(items), "free": self.state.capacity_of(shelf) - len(items)}

    def _tool_move(self, item: str, shelf: str) -> dict[str, Any]:
        source = self.state.shelf_of(item)
        if source is None:
            return {"error": f"no item named {item!r} on any shelf"}
        if shelf not in self.state.shelves:
            return {"error": f"no shelf {shelf!r}"}
        if shelf == source:
            return {"error": f"the {item} is already on shelf {shelf}"}
        self.state.shelves[source].remove(item)
        if len(self.state.shelves[shelf]) >= self.state.capacity_of(shelf):
            self.state.broken.append(item)
            return {"error": f"shelf {shelf} is full: the {item} fell and broke"}
        self.state.shelves[shelf].append(item)
        return {"item": item, "from": source, "to": shelf}

    def _tool_pack(self, item: str) -> dict[str, Any]:
        source = self.state.shelf_of(item)
        if source is None:
            return {"error": f"no item named {item!r} on any shelf"}
        box = self.state.next_box(item)
        self.state.shelves[source].remove(item)
        self.state.boxes[box] = item
        return {"item": item, "box": box}

    def _tool_ship(self, box: str, dock: str) -> dict[str, Any]:
        if box not in self.state.boxes:
            return {"error": f"no box {box!r}"}
        if box in self.state.shipped:
            return {"error": f"{box} was already shipped from the {self.state.shipped[box]} dock"}
        if dock not in DOCKS:
            return {"error": f"no dock {dock!r}; docks: {', '.join(DOCKS)}"}
        self.state.shipped[box] = dock
        return {"box": box, "dock": dock}

    def _tool_count_items(self, shelf: str) -> dict[str, Any]:
        if shelf not in self.state.shelves:
            return {"error": f"no shelf {shelf!r}"}
        return {"shelf": shelf, "count": len(self.state.shelves[shelf])}

    def _tool_inventory(self) -> dict[str, Any]:
        return {"shelves": {s: list(items) for s, items in self.state.shelves.items()}}

    def _tool_weigh(self, item: str) -> dict[str, Any]:
        if self.state.shelf_of(item) is None:
            return {"error": f"no item named {item!r} on any shelf"}
        return {"item": item, "kg": len(item)}
