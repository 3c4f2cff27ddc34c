"""Where failed episodes leave the reference solution: a failure taxonomy of an evaluation folder.

    envace failures runs/lab/eval_grpo                       # one evaluation
    envace failures runs/lab/eval_sft runs/lab/eval_grpo     # side by side: what training changed

An evaluation (`agents.evaluation.evaluate.evaluate`) writes each episode's committed messages to
``transcripts.jsonl``. For every episode with reward below 1, its tool calls are compared with the suite's
reference solution (``Suite.ground_truth``), user turn by user turn (a reference of one turn, τ²'s, against all
the episode's calls), and the first difference names the failure (`first_divergence`; call k counts the
reference's calls over its turns):

| kind | the episode ... |
|---|---|
| ``no call`` | made no tool call at all |
| ``wrong tool, call k`` | called another tool than the reference's k-th call (1-based) |
| ``wrong <argument>, call k`` | called the reference's k-th tool with another value of that argument (the first) |
| ``unparsed call, call k`` | wrote what the env could not parse as a call where the reference makes its k-th call |
| ``stopped early`` | made a turn's first reference calls exactly, then closed the turn (or the episode ended) |
| ``extra call`` | made a turn's reference calls exactly, then more in it (a failed or changing call costs the reward) |
| ``same calls`` | made exactly the reference's calls and still scored below 1 (e.g. a wrong closing reply) |
| ``no reference`` | (the suite has no reference solution for this task) |

A policy can solve a task by other calls than the reference's (another order of independent moves), and such
an episode scores 1 and is never classified; a failed one is classified by where it first left the
reference, which is where to look, not a proof of the cause. BFCL's single-turn reference takes the first of
each argument's accepted values and its calls in one order, so another accepted value or order of parallel calls
shows as a difference there. Where the suite names its error outputs (``Suite.error_kind``, the lab's), the error
outputs the failed episodes received are counted by kind too (the env's answer to an unparsed message as
``unparsed call``); in a ``--fidelity`` evaluation they are the rehearsed outputs the episode read.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from envace_gym.types import ToolCall

__all__ = ["WHERE", "first_divergence", "episode_calls", "failure_modes", "failures_table", "where_failed"]

UNPARSED = "unparsed call"
NO_REFERENCE = "no reference"
WHERE = ("at call 1", "at a later call", "other")
"""`where_failed`'s buckets: the first difference at the reference's first call (before any tool output existed:
a call decided from the prompt alone), at a later call (after outputs the policy could read, unless it wrote
several calls in one message), or not at a call (stopped early, an extra call, no call, the same calls, no
reference)."""


def first_divergence(calls: Sequence[Sequence[ToolCall | str]], reference: Sequence[Sequence[ToolCall]]) -> str:
    """The kind of the first difference between an episode's `calls` and the `reference` calls (module table),
    turn by turn: a reference of one turn is compared with all the episode's calls (τ²'s reference lists every
    call of a conversation whose user may speak many times); a turn the episode never reached has no calls.

    Args:
        calls: the episode's calls per user turn, in order (`episode_calls`); a str stands for a message the env
            could not parse as a call.
        reference: the reference solution's calls per user turn, in order (``Suite.ground_truth``).
    """
    if len(reference) == 1:
        calls = [[c for turn in calls for c in turn]]
    if not any(calls):
        return "no call" if any(reference) else "same calls"
    before = 0  # reference calls in the turns before this one
    for t, ref in enumerate(reference):
        made = calls[t] if t < len(calls) else []
        for k, (call, expected) in enumerate(zip(made, ref), before + 1):
            if isinstance(call, str):
                return f"{UNPARSED}, call {k}"
            if call.name != expected.name:
                return f"wrong tool, call {k}"
            if call.arguments != expected.arguments:
                keys = list(expected.arguments) + [key for key in call.arguments if key not in expected.arguments]
                differs = next(key for key in keys if call.arguments.get(key) != expected.arguments.get(key))
                return f"wrong {differs}, call {k}"
        if len(made) < len(ref):
            return "stopped early"
        if len(made) > len(ref):
            return "extra call"
        before += len(ref)
    return "extra call" if any(calls[len(reference) :]) else "same calls"


def episode_calls(messages: Sequence[dict[str, Any]]) -> tuple[list[list[ToolCall | str]], list[str]]:
    """An episode's calls per user turn (a str for an assistant message the env answered with a parse error) and
    the contents of the tool outputs that answered its calls, from its ``transcripts.jsonl`` messages (OpenAI
    dicts). A turn starts with the first message and with each user message after a closing assistant message
    (one without calls), as `envace_gym.types.Trajectory.calls_per_turn` reads them."""
    turns: list[list[ToolCall | str]] = [[]]
    outputs: list[str] = []
    previous: dict[str, Any] | None = None
    for m in messages:
        # after an assistant message without calls: a user message opens the next turn, a tool message is the
        # env's answer to a message it could not parse
        uncalled = previous if previous and previous["role"] == "assistant" and not previous.get("tool_calls") else None
        if m["role"] in ("user", "system") and uncalled is not None:
            turns.append([])
        elif m["role"] == "tool" and uncalled is not None:
            turns[-1].append(str(uncalled.get("content") or ""))
        elif m["role"] == "tool":
            outputs.append(str(m.get("content") or ""))
        elif m["role"] == "assistant" and m.get("tool_calls"):
            turns[-1] += [ToolCall.from_openai(c) for c in m["tool_calls"]]
        previous = m
    return turns, outputs


def failure_modes(folder: str | Path) -> dict[str, Any]:
    """The failure taxonomy of one evaluation folder (module docstring).

    Returns:
        ``{"suite", "episodes", "failed", "kinds": {category: Counter of kinds}, "errors": {category: Counter of
        error-output kinds}}`` over the failed episodes; categories in the order first seen.

    Raises:
        FileNotFoundError: the folder has no ``transcripts.jsonl`` or ``eval_config.json``.
        KeyError: a transcript's task id is not a task of the evaluated suite, split and categories.
        ValueError: the suite has no ``ground_truth`` hook.
    """
    from envace_gym.suites import make_suite
    from wrappers.fidelity import is_error_output

    folder = Path(folder)
    for name in ("transcripts.jsonl", "eval_config.json"):
        if not (folder / name).is_file():
            raise FileNotFoundError(f"{folder / name}: not an evaluation folder (envace eval --out writes one)")
    config = json.loads((folder / "eval_config.json").read_text())
    suite = make_suite(config["suite"])
    tasks = {t.id: t for t in suite.tasks(config.get("categories"), config.get("split", "test"))}
    error_kind = getattr(suite, "error_kind", None)
    ground_truth = getattr(suite, "ground_truth", None)
    if ground_truth is None:
        raise ValueError(f"suite {config['suite']!r} has no reference solutions (Suite.ground_truth) to compare with")
    kinds: dict[str, collections.Counter] = {}
    errors: dict[str, collections.Counter] = {}
    episodes = failed = 0
    with open(folder / "transcripts.jsonl", encoding="utf-8") as handle:
        for line in handle:
            record = json.loads(line)
            task = tasks.get(record["task_id"])
            if task is None:
                raise KeyError(f"{record['task_id']}: not a task of {config['suite']} ({config.get('split')} split)")
            category = str(task.metadata.get("category", task.suite))  # as the evaluation's summary groups it
            episodes += 1
            kinds.setdefault(category, collections.Counter())
            errors.setdefault(category, collections.Counter())
            if float(record["reward"]) >= 1.0:
                continue
            failed += 1
            calls, outputs = episode_calls(record["messages"])
            reference = ground_truth(task)
            kinds[category][NO_REFERENCE if reference is None else first_divergence(calls, reference)] += 1
            for output in outputs:
                if is_error_output(output):
                    errors[category][error_kind(output) if error_kind else "error"] += 1
            unparsed = sum(isinstance(c, str) for turn in calls for c in turn)
            if unparsed:
                errors[category][UNPARSED] += unparsed
    return {"suite": config["suite"], "episodes": episodes, "failed": failed, "kinds": kinds, "errors": errors}


def failures_table(results: Sequence[tuple[str, dict[str, Any]]], category: str | None = None) -> list[str]:
    """The printed table of one or more `failure_modes` results (label, result): one row per failure kind (and
    per error-output kind) with its count of failed episodes in each result, most frequent first; only the
    episodes of `category` when given (a category a result lacks counts 0)."""
    labels = [label for label, _ in results]
    width = max(12, *(len(label) for label in labels))
    lines = [f"{category or '':<28} " + " ".join(f"{label:>{width}}" for label in labels)]

    def counted(result: dict[str, Any], field: str) -> collections.Counter:
        parts = result[field].values() if category is None else [result[field].get(category, collections.Counter())]
        return sum(parts, collections.Counter())

    failed = [sum(counted(r, "kinds").values()) for _, r in results]
    if category is None:
        counts = [f"{r['episodes']} ({f})" for (_, r), f in zip(results, failed)]
        lines.append(f"{'episodes (failed)':<28} " + " ".join(f"{c:>{width}}" for c in counts))
    else:
        lines.append(f"{'failed episodes':<28} " + " ".join(f"{f:>{width}}" for f in failed))
    for field, title in (("kinds", "first left the reference"), ("errors", "error outputs received")):
        per_result = [counted(r, field) for _, r in results]
        totals = sum(per_result, collections.Counter())
        if not totals:
            continue
        lines.append(f"{title}:")
        for kind, _ in totals.most_common():
            lines.append(f"  {kind:<26} " + " ".join(f"{c[kind]:>{width}}" for c in per_result))
    return lines


def where_failed(folder: str | Path) -> dict[str, int]:
    """The failed episodes of an evaluation folder (`failure_modes`) by `WHERE` bucket, and ``failed`` in all.

    Raises:
        FileNotFoundError, KeyError, ValueError: as `failure_modes` (not an evaluation folder, a task id the suite
            lacks, a suite without reference solutions).
    """
    kinds: collections.Counter = sum(failure_modes(folder)["kinds"].values(), collections.Counter())
    counts = dict.fromkeys(WHERE, 0)
    for kind, n in kinds.items():
        call = kind.rsplit(", call ", 1)
        bucket = WHERE[2] if len(call) == 1 else WHERE[0] if call[1] == "1" else WHERE[1]
        counts[bucket] += n
    return {"failed": sum(kinds.values()), **counts}
