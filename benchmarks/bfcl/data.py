"""BFCL v4 tasks from the installed bfcl-eval data files, as `envace_gym.types.Task`.

Files (JSON Lines, in ``bfcl_eval/data/``): ``BFCL_v4_<category>.json`` holds the prompts and
``possible_answer/BFCL_v4_<category>.json`` the ground truth, line by line in the same order.

Multi-turn tasks (verifier ``"bfcl.multi_turn"``):

* ``turns``: every user turn of ``question``. A ``miss_func`` turn is empty in the data; BFCL's harness
  (``model_handler/base_handler.py: inference_multi_turn_FC``) fills it with
  ``DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC`` when it reveals the held-out functions, and so do we.
* ``tools``: the function docs of every involved class (``data/multi_turn_func_doc/``), less the held-out
  ones; ``held_out_tools[turn]``: the functions ``missed_function[turn]`` names, revealed at that turn
  (bfcl-eval ``utils.py: populate_test_cases_with_predefined_functions``). ``excluded_function`` is kept in
  metadata only: bfcl-eval 2026.3.23 does not use it either.
* ``metadata``: ``category``, ``initial_config``, ``involved_classes``, ``ground_truth`` (a list per turn of
  BFCL call strings such as ``"cd(folder='document')"``), ``long_context`` (True for the
  ``long_context`` category, as BFCL passes to ``_load_scenario``), ``missed_function``,
  ``excluded_function``, ``path``, ``single_step`` (False), ``tool_name_map`` (empty).

Single-turn tasks (verifier ``"bfcl.ast"``): one turn holding the entry's messages; ``tools`` from the
entry's ``function`` list with dotted names mapped (see `benchmarks.bfcl.schema`); ``metadata``:
``category``, ``functions`` (the raw BFCL docs the AST checker needs), ``ground_truth`` (BFCL's possible
answer; None for the irrelevance categories, which have none), ``tool_name_map``, ``single_step`` (True).

Split (`split_of`): a task is in ``test`` when the first 8 hex digits of ``sha256(task_id)``, read as an
integer, are ``< 0.2 * 16**8``; else ``train``. It depends on the id alone, so it never changes between
runs, machines or data orderings, and about 20% of every category is test.
"""

from __future__ import annotations

import hashlib
import json
from functools import cache
from typing import Any

from benchmarks.bfcl._env import bfcl_data_dir
from benchmarks.bfcl.backend import class_function_docs
from benchmarks.bfcl.schema import build_tool_name_map, function_doc_to_tool_spec
from envace_gym.types import Message, Task

__all__ = [
    "MULTI_TURN_CATEGORIES",
    "SINGLE_TURN_CATEGORIES",
    "IRRELEVANCE_CATEGORIES",
    "ALL_CATEGORIES",
    "TEST_FRACTION",
    "ADDITIONAL_FUNCTION_PROMPT",
    "split_of",
    "load_category",
]

MULTI_TURN_CATEGORIES = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context")
IRRELEVANCE_CATEGORIES = ("irrelevance", "live_irrelevance")
SINGLE_TURN_CATEGORIES = (
    "simple_python",
    "multiple",
    "parallel",
    "parallel_multiple",
    "live_simple",
    "live_multiple",
    "live_parallel",
    "live_parallel_multiple",
) + IRRELEVANCE_CATEGORIES
ALL_CATEGORIES = MULTI_TURN_CATEGORIES + SINGLE_TURN_CATEGORIES

#: Fraction of tasks in the ``test`` split.
TEST_FRACTION = 0.2
_TEST_CUTOFF = int(TEST_FRACTION * 16**8)

#: bfcl-eval ``constants/default_prompts.py: DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC``, copied so that
#: loading tasks imports nothing from bfcl-eval; a test checks the two agree.
ADDITIONAL_FUNCTION_PROMPT = "I have updated some more functions you can choose from. What about now?"


def split_of(task_id: str) -> str:
    """``"test"`` or ``"train"`` for a task id (see the module docstring)."""
    h = int(hashlib.sha256(task_id.encode("utf-8")).hexdigest()[:8], 16)
    return "test" if h < _TEST_CUTOFF else "train"


def _read_jsonl(path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _messages(raw: list[dict[str, Any]]) -> list[Message]:
    return [Message(role=m["role"], content=m.get("content") or "") for m in raw]


def _multi_turn_task(entry: dict[str, Any], answer: dict[str, Any], category: str) -> Task:
    classes = list(entry["involved_classes"])
    docs = [doc for c in classes for doc in class_function_docs(c)]
    missed: dict[str, list[str]] = entry.get("missed_function") or {}
    held_names = {n for names in missed.values() for n in names}
    by_name = {d["name"]: d for d in docs}
    turns = []
    for i, raw in enumerate(entry["question"]):
        msgs = _messages(raw)
        if str(i) in missed and not msgs:
            msgs = [Message(role="user", content=ADDITIONAL_FUNCTION_PROMPT)]
        turns.append(msgs)
    return Task(
        id=entry["id"],
        suite="bfcl",
        turns=turns,
        tools=[function_doc_to_tool_spec(d) for d in docs if d["name"] not in held_names],
        verifier="bfcl.multi_turn",
        held_out_tools={int(t): [function_doc_to_tool_spec(by_name[n]) for n in names] for t, names in missed.items()},
        metadata={
            "category": category,
            "initial_config": entry.get("initial_config", {}),
            "involved_classes": classes,
            "ground_truth": answer["ground_truth"],
            "long_context": "long_context" in category,
            "missed_function": missed,
            "excluded_function": entry.get("excluded_function") or [],
            "path": entry.get("path") or [],
            "single_step": False,
            "tool_name_map": {},
        },
    )


def _single_turn_task(entry: dict[str, Any], answer: dict[str, Any] | None, category: str) -> Task:
    functions = entry["function"]
    if len(entry["question"]) != 1:
        raise ValueError(f"single-turn entry {entry['id']} has {len(entry['question'])} turns")
    return Task(
        id=entry["id"],
        suite="bfcl",
        turns=[_messages(entry["question"][0])],
        tools=[function_doc_to_tool_spec(d) for d in functions],
        verifier="bfcl.ast",
        metadata={
            "category": category,
            "functions": functions,
            "ground_truth": None if answer is None else answer["ground_truth"],
            "tool_name_map": build_tool_name_map([d["name"] for d in functions]),
            "single_step": True,
        },
    )


@cache
def _load_category_cached(category: str) -> tuple[Task, ...]:
    data = bfcl_data_dir()
    entries = _read_jsonl(data / f"BFCL_v4_{category}.json")
    if category in IRRELEVANCE_CATEGORIES:  # no possible answers (and no multi-turn category)
        return tuple(_single_turn_task(e, None, category) for e in entries)
    answers = list(_read_jsonl(data / "possible_answer" / f"BFCL_v4_{category}.json"))
    if len(answers) != len(entries) or any(a["id"] != e["id"] for a, e in zip(answers, entries)):
        raise ValueError(f"BFCL {category}: prompts and possible answers do not line up by id")
    if category in MULTI_TURN_CATEGORIES:
        return tuple(_multi_turn_task(e, a, category) for e, a in zip(entries, answers))
    return tuple(_single_turn_task(e, a, category) for e, a in zip(entries, answers))


def load_category(category: str) -> list[Task]:
    """All tasks of one BFCL category in file order (read once per process, then cached).

    Returns a new list each call; the tasks themselves are shared, so callers must not mutate them.

    Raises:
        ValueError: `category` is not one of `ALL_CATEGORIES` (the message lists them), or the data files
            do not line up.
    """
    if category not in ALL_CATEGORIES:
        raise ValueError(f"unknown BFCL category {category!r}; valid categories: {', '.join(ALL_CATEGORIES)}")
    return list(_load_category_cached(category))
