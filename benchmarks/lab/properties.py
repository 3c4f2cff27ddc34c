"""The defining properties of the hidden-rules lab world, measured on its test split.

    python -m benchmarks.lab.properties [--train-tasks 2000] [--json out.json]

Five scripted solvers play every test task through its family's program (`benchmarks.lab.hidden.solve`) and
are scored by the suite's verifier (replay on the real backend):

* reference: the program answered by the real backend (the reference solution). Must be 1.0.
* rules, no outputs: answered by a private copy of the world built from the layout the prompt *writes* (it
  knows the rules, never reads a real output). 1.0 shows that the prompt's state and the rules decide every
  output: nothing is hidden but the rules.
* outputs, no rules: every output-derived value comes from the real output of the call the program makes, where
  the task offers that tool, and from the no-rules table below where it does not. 1.0 in the hidden world (every
  value can be read off an output in time); in the blind variant, a guess wherever a decision needs a look.
* no rules: every output-derived value (a box label, the free slots) is the most frequent value that field
  had at that point of the family's program over the first ``--train-tasks`` train-stream tasks. What a
  policy that ignores outputs and knows no rule can reach; at most 0.25.
* told, no rules: played on the told variant's test tasks (``LabConfig(told=True)``, suite ``lab-told``: the
  same tasks, with the rules' facts of the initial state in the prompt, `benchmarks.lab.hidden.told_facts_text`).
  It knows no rule and reads no output: a shelf's free slots are the ones the prompt tells, a box label is
  the prefix the prompt tells for the item with the count suffix of the most frequent training label at that
  point of the program (``-1`` for a first pack, ``-2`` for a second). What the told facts alone give: 1.0 on
  families whose decisions read the initial state only, less where a call changes a fact before it is used
  (packing the first of two items from one shelf moves the second up a position).

``--blind`` measures the blind variant (``LabConfig(blind=True)``, suite ``lab-blind``): the programs emit no
look call; where a decision reads a look, the reference and the rules-only solver answer it from the rules, the
outputs-only solver cannot, and its row shows what losing the looks costs a solver that knows no rule (the told
row plays ``LabConfig(told=True, blind=True)``). Prints one row per family and the overall fraction; ``--json``
writes them.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
from typing import Any

from benchmarks.lab.hidden import Ask, backend_ask, shelves_from_prompt, solve, told_facts_from_prompt
from benchmarks.lab.suite import LabSuite
from benchmarks.lab.tasks import LabConfig
from benchmarks.lab.world import LabBackend, Warehouse, hidden_capacities
from envace_gym.types import Task, ToolCall

__all__ = ["SOLVERS", "measure", "most_frequent_outputs", "main"]


def _recording(ask: Ask, seen: list[tuple[str, int, dict[str, Any]]]) -> Ask:
    """`ask`, logging each answer with its tool and that tool's occurrence index in the program."""
    counts: collections.Counter[str] = collections.Counter()

    def wrapped(call: ToolCall) -> dict[str, Any]:
        out = ask(call)
        seen.append((call.name, counts[call.name], out))
        counts[call.name] += 1
        return out

    return wrapped


def _rules(task: Task) -> LabBackend:
    """The real backend in `task`'s initial state answering every tool: what the rules make of a call, a look
    included (a blind task's backend refuses looks; its program asks them to decide, and emits none)."""
    return LabBackend(Warehouse.from_dict(task.metadata["initial_state"]))


def most_frequent_outputs(suite: LabSuite, train_tasks: int) -> dict[tuple[str, str, int, str], Any]:
    """(category, tool, occurrence, field) -> that output field's most frequent value over the first
    `train_tasks` tasks of the train stream, all families together (about `train_tasks` / 6 per family;
    reference programs on the real backend)."""
    counters: dict[tuple[str, str, int, str], collections.Counter] = collections.defaultdict(collections.Counter)
    stream = suite.train_stream()
    for _ in range(train_tasks):
        task = next(stream)
        seen: list[tuple[str, int, dict[str, Any]]] = []
        solve(
            task.metadata["category"],
            task.metadata["initial_state"]["shelves"],
            task.metadata["slots"],
            _recording(backend_ask(_rules(task)), seen),
            look=not suite.config.blind,
        )
        for tool, k, out in seen:
            for name, value in out.items():
                if isinstance(value, (str, int)):
                    counters[(task.metadata["category"], tool, k, name)][value] += 1
    return {key: c.most_common(1)[0][0] for key, c in counters.items()}


def _table_ask(category: str, table: dict[tuple[str, str, int, str], Any]) -> Ask:
    counts: collections.Counter[str] = collections.Counter()

    def ask(call: ToolCall) -> dict[str, Any]:
        k = counts[call.name]
        counts[call.name] += 1
        return {f: v for (c, tool, i, f), v in table.items() if (c, tool, i) == (category, call.name, k)}

    return ask


def _outputs_ask(task: Task, category: str, table: dict[tuple[str, str, int, str], Any]) -> Ask:
    """Answers from the real backend for the tools `task` offers, from `table` (`most_frequent_outputs`) for the
    others: knows no rule and reads every output the world lets it see (in the blind variant, no look)."""
    real = backend_ask(_rules(task))
    guess = _table_ask(category, table)
    offered = {t.name for t in task.tools}
    return lambda call: real(call) if call.name in offered else guess(call)


def _told_ask(task: Task, category: str, table: dict[tuple[str, str, int, str], Any]) -> Ask:
    """Answers from the told facts of `task`'s prompt (`benchmarks.lab.hidden.told_facts_from_prompt`): a shelf's
    told free slots; a pack's told label prefix with the count suffix of `table`'s label at that point of the
    program (`most_frequent_outputs`). Knows no rule and reads no output."""
    room, prefixes = told_facts_from_prompt(task)
    counts: collections.Counter[str] = collections.Counter()

    def ask(call: ToolCall) -> dict[str, Any]:
        k = counts[call.name]
        counts[call.name] += 1
        if call.name == "list_shelf":
            return {"free": room.get(str(call.arguments.get("shelf")), 0)}
        if call.name == "pack":
            frequent = table.get((category, "pack", k, "box"))
            suffix = frequent.rpartition("-")[2] if isinstance(frequent, str) else "1"
            return {"box": f"{prefixes.get(str(call.arguments.get('item')), '')}-{suffix}"}
        return {}

    return ask


SOLVERS = ("reference", "rules_no_outputs", "outputs_no_rules", "no_rules", "told_no_rules")
"""The solvers `measure` scores (module docstring)."""


def measure(config: LabConfig | None = None, train_tasks: int = 2000) -> dict[str, dict[str, float]]:
    """Success of the `SOLVERS` per family and overall: ``{solver: {family or "overall": fraction}}``. The first
    three play `config`'s test tasks, ``told_no_rules`` the same tasks told (``told=True``); every solver is
    scored on the real backend.

    Raises:
        ValueError: `config` has stated rules (this measures the hidden world).
    """
    config = config or LabConfig()
    if config.rules != "hidden":
        raise ValueError("the properties are the hidden-rules world's; pass LabConfig(rules='hidden')")
    suite = LabSuite(config)
    told = LabSuite(dataclasses.replace(config, told=True))
    table = most_frequent_outputs(suite, train_tasks)
    scores: dict[str, dict[str, list[float]]] = {s: collections.defaultdict(list) for s in SOLVERS}
    for task, told_task in zip(suite.tasks(None, "test"), told.tasks(None, "test"), strict=True):
        category = task.metadata["category"]
        prompt_layout = shelves_from_prompt(task)
        private = LabBackend(
            Warehouse(
                capacity=max(hidden_capacities(len(prompt_layout)).values()), shelves=prompt_layout, rules="hidden"
            )
        )
        plays = {  # solver -> (the world, its task, the answers)
            "reference": (suite, task, backend_ask(_rules(task))),
            "rules_no_outputs": (suite, task, backend_ask(private)),
            "outputs_no_rules": (suite, task, _outputs_ask(task, category, table)),
            "no_rules": (suite, task, _table_ask(category, table)),
            "told_no_rules": (told, told_task, _told_ask(told_task, category, table)),
        }
        for solver, (world, played, ask) in plays.items():
            program = solve(category, shelves_from_prompt(played), played.metadata["slots"], ask, look=not config.blind)
            reward = world.score(played, [c for turn in program for c in turn], "Done.").reward
            scores[solver][category].append(reward)
            scores[solver]["overall"].append(reward)
    return {s: {k: sum(v) / len(v) for k, v in by.items()} for s, by in scores.items()}


def table(result: dict[str, dict[str, float]], families: list[str]) -> list[str]:
    """`measure`'s result as printed (and shown on the lab's docs page): a header, then one row per solver."""
    return [f"{'solver':18s}" + "".join(f"{f:>10s}" for f in families)] + [
        f"{solver:18s}" + "".join(f"{by[f]:10.3f}" for f in families) for solver, by in result.items()
    ]


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--train-tasks",
        type=int,
        default=2000,
        help="train-stream tasks (all families together, in turn) for the no-rules table",
    )
    parser.add_argument(
        "--blind", action="store_true", help="the blind variant (suite lab-blind: no look tools, no look calls)"
    )
    parser.add_argument("--json", default=None, help="also write the table here")
    args = parser.parse_args(argv)
    config = LabConfig(blind=args.blind)
    result = measure(config, args.train_tasks)
    families = list(config.categories) + ["overall"]
    print(
        f"hidden-rules lab world{', blind' if config.blind else ''}, test split ({config.test_tasks} tasks per "
        f"family), seed {config.seed}; told_no_rules plays the same tasks told"
        + (" (LabConfig(told=True, blind=True))" if config.blind else " (suite lab-told)")
    )
    print("\n".join(table(result, families)))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)
    return result


if __name__ == "__main__":
    main()
