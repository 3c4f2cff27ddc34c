"""`LabSuite`: EnvACE-Lab as an envace-gym suite (procedural warehouse tasks, the real backend, the verifier)."""

from __future__ import annotations

import functools
import json
import random
import re
from collections.abc import Iterator, Sequence

from benchmarks.lab.hidden import make_hidden_task
from benchmarks.lab.tasks import CATEGORIES, ITEMS, LabConfig, make_stated_task, reference_final_state
from benchmarks.lab.world import LabBackend, Warehouse
from envace_gym.judging import Checklist, ChecklistItem
from envace_gym.suites import VerifierResult
from envace_gym.types import Task, ToolCall, Trajectory

__all__ = ["LabSuite", "make_task", "stated_suite", "told_suite", "blind_suite"]


def make_task(config: LabConfig, category: str, index: int, split: str = "train") -> Task:
    """Task ``f"{category}_{index}"`` of `config`: hidden rules, `benchmarks.lab.hidden.make_hidden_task`
    (`split` picks the train stream or the fixed test split); stated rules,
    `benchmarks.lab.tasks.make_stated_task` (the index alone decides; `split` is ignored).

    Raises:
        ValueError: an unknown category.
    """
    if config.rules == "hidden":
        return make_hidden_task(config, category, index, split)
    return make_stated_task(config, category, index)


@functools.lru_cache(maxsize=64)
def _build_split(cfg: LabConfig, category: str, split: str) -> tuple[Task, ...]:
    # one build per process: every stage of a pipeline or an ablation makes its own suite, and the hidden
    # world's 2,000 train tasks per family take ~0.7 s to generate; tasks are never mutated after this
    if cfg.rules == "hidden":
        n = cfg.train_tasks if split == "train" else cfg.test_tasks
        return tuple(make_task(cfg, category, i, split) for i in range(n))
    if split == "valid":
        raise ValueError(
            "the stated-rules lab has no validation split (its train and test splits are one finite list); "
            "use the hidden-rules world (suite lab) or split train or test"
        )
    n_train = cfg.tasks_per_category - cfg.num_test
    indices = range(n_train) if split == "train" else range(n_train, cfg.tasks_per_category)
    return tuple(make_task(cfg, category, i) for i in indices)


class LabSuite:
    """The ``lab`` suite: a warehouse tool world small enough to learn on 2 CPU cores (`benchmarks.lab`).

    The world's rules are ``config.rules``: ``hidden`` (v1, the default; registered as ``lab``) or ``stated``
    (registered as ``lab-stated``, `stated_suite`); ``hidden`` with ``config.told`` is the hidden world whose
    prompts also tell the rules' facts of the initial state (registered as ``lab-told``, `told_suite`), and
    ``hidden`` with ``config.blind`` the hidden world without the tools that only look (``lab-blind``,
    `blind_suite`).

    Categories (`categories`): hidden rules ``relocate``, ``ship``, ``fill``, ``make_room``, ``ship_two``,
    ``full_job`` (`benchmarks.lab.hidden`); stated rules ``count`` instead of ``fill``
    (`benchmarks.lab.tasks`); all of them by default. Splits, hidden rules: ``test`` is the fixed test split
    (``config.test_tasks`` per category), ``train`` the first ``config.train_tasks`` tasks of the
    unlimited train stream (`train_stream` for more), ``valid`` a validation split as large as the test split
    and disjoint from both (for choosing a budget without the test split). Stated rules: the first tasks of
    each category are ``train``, the last ``config.num_test`` are ``test``.

    Verification replays the ACT calls of the trajectory, in order, on a fresh backend in the task's initial
    state (the episode's own backend is not read, so a rehearsed episode is scored the same way) and gives
    R = 1 when the final state equals the state the reference calls reach, no replayed call failed (returned
    ``{"error": ...}``), and, for ``count`` tasks, the only number in the last reply is the expected one (so
    "1 or 2" earns nothing); else 0. A failed call is a mistake even when it changes nothing: the world's
    rules make some calls fail so that rehearsing before committing can avoid them, and a policy trained
    with failed calls for free learns to pad successful episodes with them (GRPO did, on this world).

    Args:
        config: the difficulty knobs (`benchmarks.lab.tasks.LabConfig`); register variants as
            ``register_suite("lab-2turn", lambda: LabSuite(LabConfig(user_turns=2)))``.
    """

    name = "lab"
    categories: tuple[str, ...] = CATEGORIES  # the stated world's; an instance holds its own rules' families

    def __init__(self, config: LabConfig | None = None) -> None:
        self.config = config or LabConfig()
        self.categories = self.config.categories
        self._tasks: dict[tuple[str, str], list[Task]] = {}  # (category, split) -> tasks, built when first asked for

    def _split(self, category: str, split: str) -> list[Task]:
        key = (category, split)
        if key not in self._tasks:
            self._tasks[key] = list(_build_split(self.config, category, split))
        return self._tasks[key]

    def train_stream(self, categories: Sequence[str] | None = None, start: int = 0) -> Iterator[Task]:
        """The hidden-rules train stream from index `start`, one task of each category in turn, without end
        (no task in it shares a test task's layout and instruction; `benchmarks.lab.hidden`).

        Raises:
            ValueError: the suite's rules are stated (its train split is finite), or an unknown category.
        """
        if self.config.rules != "hidden":
            raise ValueError(
                "train_stream needs the hidden rules (LabConfig(rules='hidden')); the stated-rules "
                "world has a finite train split: tasks(split='train')"
            )
        cats = self._categories(categories)
        index = start
        while True:
            for c in cats:
                yield make_task(self.config, c, index, "train")
            index += 1

    def _categories(self, categories: Sequence[str] | None) -> list[str]:
        cats = list(categories) if categories else list(self.categories)
        unknown = [c for c in cats if c not in self.categories]
        if unknown:
            raise ValueError(
                f"unknown lab categories {unknown} for the {self.config.rules} rules; valid "
                f"categories: {', '.join(self.categories)}"
            )
        return cats

    def tasks(self, categories: Sequence[str] | None = None, split: str = "train") -> list[Task]:
        """The tasks of `categories` (None: all) in `split` (``train``, ``valid``, ``test`` or ``all``: train and
        test, not valid), category by category.

        Raises:
            ValueError: an unknown category or split, or ``valid`` in the stated-rules world (it has none).
        """
        if split not in ("train", "valid", "test", "all"):
            raise ValueError(f"split must be train, valid, test or all, got {split!r}")
        out: list[Task] = []
        for c in self._categories(categories):
            out += [t for s in (("train", "test") if split == "all" else (split,)) for t in self._split(c, s)]
        return out

    def make_backend(self, task: Task) -> LabBackend:
        """A fresh backend in the task's initial state; a blind task's (``LabConfig(blind=True)``) answers only
        the tools the task offers."""
        offered = [t.name for t in task.tools] if task.metadata.get("config", {}).get("blind") else None
        return LabBackend(Warehouse.from_dict(task.metadata["initial_state"]), offered)

    def ground_truth(self, task: Task) -> list[list[ToolCall]]:
        """The reference calls of each user turn."""
        return [[ToolCall.from_openai(c) for c in turn] for turn in task.metadata["reference"]]

    ERROR_KINDS = (("breaks", "broke"), ("repeat", "already"), ("no_box", "no box"), ("no_item", "no item"))
    """(kind, marker): an error output whose text holds the marker shows that kind of mistake (`error_kind`)."""

    def error_kind(self, output: str) -> str:
        """The kind of mistake an error output of the lab's tools shows: ``breaks`` (a move onto a full shelf),
        ``repeat`` (the item already on that shelf, the box already shipped), ``no_box`` (a label no packed box
        has), ``no_item`` (an unknown item), else ``other_error`` (a bad shelf or dock, a malformed call)."""
        return next((kind for kind, marker in self.ERROR_KINDS if marker in output), "other_error")

    def mutations(self, task: Task, calls: Sequence[ToolCall], rng: random.Random) -> list[tuple[int, ToolCall]]:
        """Mistaken calls to play before reference calls, for error demonstrations
        (`agents.training.demonstrations.build_demonstrations` with ``mutations``): the world model then sees what a
        mistake returns. Each candidate is checked against the state the reference reaches just before
        position ``p`` (the calls are replayed on a fresh backend), so every one of them is a real mistake:

        * before a call naming an item that is on a shelf (``move``, ``pack``, ...): ``move(item, S)`` onto a
          shelf ``S`` other than the item's own that is full at that point (``Warehouse.capacity_of``): the item
          breaks, a change no later call undoes. None when no other shelf is full.
        * before the same call: the call naming an item that is nowhere in the warehouse (not on a shelf, in a
          box or broken): fails, changes nothing.
        * before ``ship(box, dock)``: ``ship`` of a label that no packed box has (a neighbouring position or
          packing count under the hidden rules, the stated rules' ``box-<n>``, or the other way round), so it
          differs from the real label and cannot ship another box: fails, changes nothing.
        * right after a ``move`` or a ``ship`` (before the next reference call): the same call again, as a policy
          that lost track of what it did makes it: the item is already on that shelf, the box already shipped.
          Fails, changes nothing.

        Args:
            task: a task of this suite.
            calls: its reference calls flattened over the user turns, in order (`ground_truth`).
            rng: draws the full shelf, the unknown item and the wrong label (the caller seeds it).

        Returns:
            ``[(p, call)]``, ``0 <= p < len(calls)``, in order of ``p``: play ``call`` right before ``calls[p]``.
        """
        backend = self.make_backend(task)
        out: list[tuple[int, ToolCall]] = []
        for p, call in enumerate(calls):
            state = backend.state
            if p and calls[p - 1].name in ("move", "ship"):
                out.append((p, calls[p - 1]))
            item = call.arguments.get("item")
            here = state.shelf_of(item) if isinstance(item, str) else None
            if here is not None:
                full = [s for s, items in state.shelves.items() if s != here and len(items) >= state.capacity_of(s)]
                if full:
                    out.append((p, ToolCall("move", {"item": item, "shelf": rng.choice(full)})))
                known = (
                    {i for items in state.shelves.values() for i in items}
                    | set(state.boxes.values())
                    | set(state.broken)
                )
                unknown = [i for i in ITEMS if i not in known]
                if unknown:
                    out.append((p, ToolCall(call.name, {**call.arguments, "item": rng.choice(unknown)})))
            box = call.arguments.get("box")
            if call.name == "ship" and isinstance(box, str):
                wrong = [label for label in _near_labels(box) if label not in state.boxes]
                if wrong:
                    out.append((p, ToolCall("ship", {**call.arguments, "box": rng.choice(wrong)})))
            backend.execute(call)
        return out

    def reference_reply(self, task: Task, turn: int) -> str | None:
        """The reference closing message of the last turn of a ``count`` task (it states the answer); else None."""
        answer = task.metadata.get("answer")
        if answer is None or turn != task.num_turns - 1:
            return None
        return f"The shelf has {answer} free slot{'s' if answer != '1' else ''}."

    def checklist(self, task: Task) -> Checklist:
        """A checklist derived from the reference solution (`envace_gym.judging`), item for item what `verify`
        checks, so that a judge and the verifier can be compared on the same trajectories
        (``benchmarks/experiments/judge_agreement.py``). Per user turn, weight 1 each:

        * one item per reference call that changes the warehouse (found by replaying the reference on a fresh
          backend: a call whose state snapshot differs after it), naming the call and its arguments; read-only
          calls (``locate``, ``list_shelf``) are left out, as the verifier does not ask for them;
        * "no tool call in this turn returned an error";
        * for a ``count`` task, in its last turn: the reply gives the expected number and no other.
        """
        backend = self.make_backend(task)
        turns: list[list[ChecklistItem]] = []
        for calls in self.ground_truth(task):
            items = []
            for call in calls:
                before = backend.snapshot()
                backend.execute(call)
                if backend.snapshot() != before:
                    args = ", ".join(f"{k}={json.dumps(v)}" for k, v in call.arguments.items())
                    items.append(ChecklistItem(f"The assistant called {call.name}({args})."))
            items.append(ChecklistItem("None of the assistant's tool calls in this turn returned an error."))
            turns.append(items)
        answer = task.metadata.get("answer")
        if answer is not None:
            turns[-1].append(
                ChecklistItem(
                    f"The assistant's last reply gives {answer} as the number of free slots, and no other number."
                )
            )
        return Checklist(task.id, turns)

    def verify(self, trajectory: Trajectory, backend: LabBackend | None = None) -> VerifierResult:
        """Replay the ACT calls and compare the final state (and a ``count`` answer); see the class docstring."""
        calls = [call for turn in trajectory.calls_per_turn() for step in turn for call in step]
        replies = trajectory.final_responses()
        return self.score(trajectory.task, calls, replies[-1] if replies else None)

    def score(self, task: Task, calls: Sequence[ToolCall], reply: str | None) -> VerifierResult:
        """The reward of making `calls` in order and closing with `reply` (what `verify` reads off a trajectory;
        the discrete twin, `benchmarks.lab.discrete`, scores its episodes with it too)."""
        replay = self.make_backend(task)
        errors = sum(replay.execute(call).startswith('{"error"') for call in calls)
        state = replay.state.to_dict()
        state_ok = state == reference_final_state(task)
        answer = task.metadata.get("answer")
        answer_ok = answer is None or (reply is not None and re.findall(r"\d+", reply) == [answer])
        ok = state_ok and answer_ok and errors == 0
        return VerifierResult(
            reward=1.0 if ok else 0.0,
            valid=ok,
            details={
                "state_matches": state_ok,
                "answer_matches": answer_ok,
                "failed_calls": errors,
                "broken": state["broken"],
            },
        )


def _near_labels(label: str) -> list[str]:
    """Labels a model might write instead of `label`: hidden ``<shelf><position>-<n>`` one position or one
    count off, or the stated form ``box-<n>``; stated ``box-<n>`` one count off, or a hidden-looking ``A1-<n>``.
    `label` itself is never among them."""
    hidden = re.fullmatch(r"([A-Z])(\d+)-(\d+)", label)
    if hidden:
        shelf, pos, n = hidden.group(1), int(hidden.group(2)), int(hidden.group(3))
        near = [f"{shelf}{pos + d}-{n}" for d in (-1, 1) if pos + d >= 1] + [f"{shelf}{pos}-{n + 1}", f"box-{n}"]
    else:
        stated = re.fullmatch(r"box-(\d+)", label)
        n = int(stated.group(1)) if stated else 1
        near = [f"box-{n + d}" for d in (-1, 1) if n + d >= 1] + [f"A1-{n}"]
    return [x for x in near if x != label]


def stated_suite() -> LabSuite:
    """The stated-rules world with the default knobs (registered as suite ``lab-stated``)."""
    suite = LabSuite(LabConfig(rules="stated"))
    suite.name = "lab-stated"
    return suite


def told_suite() -> LabSuite:
    """The hidden-rules world whose prompts also tell the rules' facts of each task's initial state, with the
    default knobs (``LabConfig(told=True)``, `benchmarks.lab.hidden`; registered as suite ``lab-told``): the
    ``lab`` suite's tasks, task ids, backend and verifier."""
    suite = LabSuite(LabConfig(told=True))
    suite.name = "lab-told"
    return suite


def blind_suite() -> LabSuite:
    """The hidden-rules world without the tools that only look, with the default knobs (``LabConfig(blind=True)``,
    `benchmarks.lab.hidden`; registered as suite ``lab-blind``): the ``lab`` suite's tasks and task ids, no
    ``locate`` or ``list_shelf`` (the backend refuses them) and references that make no look call, so a
    rehearsal of a move is the only way to see whether it breaks the item before committing it."""
    suite = LabSuite(LabConfig(blind=True))
    suite.name = "lab-blind"
    return suite
