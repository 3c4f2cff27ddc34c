"""BFCL verifiers: multi-turn replay with BFCL's state and response checks, and BFCL's AST checker.

Multi-turn (``"bfcl.multi_turn"``) follows bfcl-eval ``eval_checker/multi_turn_eval/multi_turn_checker.py:
multi_turn_checker`` as driven by ``eval_runner.py: _evaluate_single_multi_turn_entry``:

1. A trajectory whose number of turns differs from the ground truth's is invalid
   (``multi_turn:force_terminated``); the turns it has are still replayed for ``details["turns"]``.
2. Empty steps are dropped (BFCL skips empty decoded steps). The model's calls are replayed on one fresh
   `BFCLBackend`, turn after turn (BFCL keeps its instances across turns), and the ground truth on another.
3. A turn whose ground truth is empty is not checked. Otherwise: no model call in the turn ->
   ``multi_turn:empty_turn_model_response``; then BFCL's ``state_checker`` on the two sets of instances;
   then BFCL's ``response_checker`` (every ground-truth result of this turn must appear among the model's
   results of all turns so far, unordered).
4. Valid when every turn passes; reward 1.0 if valid else 0.0.

Those two checker functions are imported from bfcl-eval; their module imports only ``multi_turn_utils``
(whose ``eval``-running executor is never called here), and they compare attributes and strings only.

Single-turn (``"bfcl.ast"``): the first ACT step's calls (``single_step``) are the answer. Irrelevance
categories: valid exactly when that answer has no call (``eval_runner.py: _evaluate_single_relevance_entry``).
Others: names are mapped back to BFCL's dotted names, the calls become ``[{name: {arg: value}}]`` and go
to BFCL's ``ast_checker`` with ``Language.PYTHON``, as ``eval_runner.py: ast_file_runner`` does.

Stand-in for ``bfcl_eval.constants.model_config``: ``ast_checker`` imports ``MODEL_CONFIG_MAPPING`` from it
only to ask ``MODEL_CONFIG_MAPPING[model].underscore_to_dot`` in ``convert_func_name``, but that module
imports every vendor SDK through the model handlers. Before importing ``ast_checker`` we therefore put a
small module into ``sys.modules`` under that name whose mapping answers ``underscore_to_dot=False`` for
our checker's model name, and remove it again right after the import (``ast_checker`` keeps its own
reference), so a later import of the real module is unaffected. If the real module is already loaded,
the same entry is added to its mapping instead. ``underscore_to_dot=False`` is correct because we map
names back to dotted form ourselves.
"""

from __future__ import annotations

import dataclasses
import sys
import types
from collections.abc import Callable, Sequence
from functools import cache
from typing import Any

from benchmarks.bfcl import _env  # noqa: F401  (sets BFCL_PROJECT_ROOT before any bfcl_eval import)
from benchmarks.bfcl.backend import BFCLBackend, parse_call_string
from benchmarks.bfcl.data import IRRELEVANCE_CATEGORIES
from benchmarks.bfcl.schema import from_tool_name
from envace_gym.limits import DEFAULT_LIMITS, CallLimits
from envace_gym.suites import VerifierResult
from envace_gym.types import Task, ToolCall

__all__ = [
    "CHECKER_MODEL_NAME",
    "make_multi_turn_backend",
    "ground_truth_tool_calls",
    "single_turn_ground_truth_calls",
    "verify_multi_turn",
    "verify_single_turn",
]

#: The model name passed to ``ast_checker`` (its stand-in config says ``underscore_to_dot=False``).
CHECKER_MODEL_NAME = "envace-gym"
_MODEL_CONFIG = "bfcl_eval.constants.model_config"


class _StandInModelConfig:
    """The one field of a BFCL ``ModelConfig`` that ``ast_checker.convert_func_name`` reads."""

    underscore_to_dot = False


class _StandInMapping(dict):
    """``MODEL_CONFIG_MAPPING`` stand-in: knows only `CHECKER_MODEL_NAME`."""


@cache
def _ast_checker() -> tuple[Callable[..., dict], Any]:
    """Import BFCL's ``ast_checker`` and ``Language`` without the vendor SDKs (see the module docstring)."""
    key = CHECKER_MODEL_NAME.replace("_", "/")  # convert_func_name looks names up this way
    if _MODEL_CONFIG in sys.modules:
        sys.modules[_MODEL_CONFIG].MODEL_CONFIG_MAPPING.setdefault(key, _StandInModelConfig())
        from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker
    else:
        stand_in = types.ModuleType(_MODEL_CONFIG, "envace-gym stand-in: only what ast_checker reads")
        mapping = _StandInMapping({key: _StandInModelConfig()})
        stand_in.MODEL_CONFIG_MAPPING = mapping  # type: ignore[attr-defined]  # a new attribute of a new module
        sys.modules[_MODEL_CONFIG] = stand_in
        try:
            from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker
        finally:
            if sys.modules.get(_MODEL_CONFIG) is stand_in:
                del sys.modules[_MODEL_CONFIG]
            parent = sys.modules.get("bfcl_eval.constants")
            if parent is not None and getattr(parent, "model_config", None) is stand_in:
                delattr(parent, "model_config")
    from bfcl_eval.constants.enums import Language

    return ast_checker, Language.PYTHON


def _multi_turn_checkers() -> tuple[Callable[..., dict], Callable[..., dict]]:
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import response_checker, state_checker

    return state_checker, response_checker


def make_multi_turn_backend(task: Task, limits: CallLimits = DEFAULT_LIMITS) -> BFCLBackend:
    """A fresh `BFCLBackend` in `task`'s initial state (``long_context`` honoured), its calls under `limits`."""
    md = task.metadata
    return BFCLBackend(
        md["involved_classes"], md.get("initial_config") or {}, long_context=bool(md.get("long_context")), limits=limits
    )


def ground_truth_tool_calls(task: Task, backend: BFCLBackend | None = None) -> list[list[ToolCall]]:
    """The multi-turn ground truth of `task` as `ToolCall` lists, one per turn.

    BFCL call strings are parsed with `parse_call_string` (literals only) and positional arguments bound to
    names with the method signatures of `backend` (a fresh one if None).

    Raises:
        ValueError: a ground-truth string is not a literal call of an allow-listed function.
    """
    backend = backend or make_multi_turn_backend(task)
    out = []
    for turn in task.metadata["ground_truth"]:
        calls = []
        for text in turn:
            name, args, kwargs = parse_call_string(text)
            calls.append(ToolCall(name=name, arguments=backend.positional_to_keywords(name, args, kwargs)))
        out.append(calls)
    return out


def _first_alternative(value: Any) -> tuple[bool, Any]:
    """Pick BFCL's first possible value: ``(present, value)``; ``""`` first means "leave the arg out"."""
    if not isinstance(value, list) or not value:
        return True, value
    first = value[0]
    if first == "":
        return False, None
    return True, _strip_alternatives(first)


def _strip_alternatives(value: Any) -> Any:
    # dict-typed answers hold dicts of alternative lists; lists of dicts hold such dicts.
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            present, chosen = _first_alternative(v)
            if present:
                out[k] = chosen
        return out
    if isinstance(value, list):
        return [_strip_alternatives(v) if isinstance(v, dict) else v for v in value]
    return value


def single_turn_ground_truth_calls(task: Task) -> list[ToolCall]:
    """One answer to a single-turn task built from BFCL's possible answer: the first alternative of each
    argument (an argument whose first alternative is ``""``, BFCL's "optional", is left out), with names
    shown to the model (dots -> underscores). Irrelevance tasks: ``[]``."""
    gt = task.metadata.get("ground_truth")
    if not gt:
        return []
    inverse = {v: k for k, v in task.metadata.get("tool_name_map", {}).items()}
    calls = []
    for item in gt:
        ((name, params),) = item.items()
        args = {}
        for p, alts in params.items():
            present, chosen = _first_alternative(alts)
            if present:
                args[p] = chosen
        calls.append(ToolCall(name=inverse.get(name, name), arguments=args))
    return calls


def _nonempty_steps(turn: Sequence[Sequence[ToolCall]]) -> list[list[ToolCall]]:
    return [list(step) for step in turn if step]


def verify_multi_turn(
    task: Task, calls_per_turn: Sequence[Sequence[Sequence[ToolCall]]], limits: CallLimits = DEFAULT_LIMITS
) -> VerifierResult:
    """Score a multi-turn trajectory by replay (module docstring, steps 1-4).

    Args:
        task: a ``"bfcl.multi_turn"`` task.
        calls_per_turn: turns × steps × calls, as the env recorded them.
        limits: per-call limits of the model calls' replay (the env's, so a call refused there is refused
            here); the ground truth's replay runs in this process (``isolation="none"``), its other limits kept.

    Returns:
        `VerifierResult`; ``details["turns"]`` holds one dict per replayed turn (``valid``, ``checked``,
        ``num_calls``, ``error_type``, ``error_message``, and ``missing_items`` or ``differences``);
        ``details["error_type"]``/``details["error_message"]`` name the first failure.

    Raises:
        ValueError: the task's ground truth is malformed (never for any model input).
    """
    state_checker, response_checker = _multi_turn_checkers()
    gt_turns = task.metadata["ground_truth"]
    model_backend = make_multi_turn_backend(task, limits)
    # The ground truth is the benchmark's own data, not model output: it runs in this process (microseconds
    # a call instead of a fork), under the same time limit and argument bounds.
    gt_backend = make_multi_turn_backend(task, dataclasses.replace(limits, isolation="none"))
    gt_calls = ground_truth_tool_calls(task, gt_backend)
    name_map = task.metadata.get("tool_name_map") or {}

    turns: list[dict[str, Any]] = []
    first_error: dict[str, Any] | None = None
    all_model_results: list[str] = []
    for i in range(min(len(calls_per_turn), len(gt_turns))):
        steps = _nonempty_steps(calls_per_turn[i])
        n_calls = 0
        for step in steps:
            for call in step:
                mapped = ToolCall(name=from_tool_name(call.name, name_map), arguments=call.arguments, id=call.id)
                all_model_results.append(model_backend.execute(mapped))
                n_calls += 1
        gt_results = [gt_backend.execute(c) for c in gt_calls[i]]
        info: dict[str, Any] = {"turn": i, "valid": True, "checked": bool(gt_turns[i]), "num_calls": n_calls}
        if gt_turns[i]:
            if not steps:
                info.update(
                    valid=False,
                    error_type="multi_turn:empty_turn_model_response",
                    error_message=f"Model response list is empty for turn {i}",
                )
            else:
                state = state_checker(model_backend.instances, gt_backend.instances)
                if not state["valid"]:
                    info.update(
                        valid=False,
                        error_type=state["error_type"],
                        error_message=state["error_message"],
                        differences=sorted(state["details"]["differences"]),
                    )
                else:
                    resp = response_checker(all_model_results, gt_results, i)
                    if not resp["valid"]:
                        info.update(
                            valid=False,
                            error_type=resp["error_type"],
                            error_message=resp["error_message"],
                            missing_items=[str(m) for m in resp["details"]["missing_items"]],
                        )
        if not info["valid"] and first_error is None:
            first_error = {"error_type": info["error_type"], "error_message": info["error_message"]}
        turns.append(info)

    if len(calls_per_turn) != len(gt_turns) and first_error is None:
        first_error = {
            "error_type": "multi_turn:force_terminated",
            "error_message": (
                f"The trajectory has {len(calls_per_turn)} turns but the task has {len(gt_turns)}; "
                "a run that stops early (or runs long) is invalid, as in BFCL."
            ),
        }
    valid = first_error is None
    details: dict[str, Any] = {"turns": turns, "num_turns": len(gt_turns)}
    if first_error:
        details.update(first_error)
    return VerifierResult(reward=1.0 if valid else 0.0, valid=valid, details=details)


def verify_single_turn(task: Task, calls_per_turn: Sequence[Sequence[Sequence[ToolCall]]]) -> VerifierResult:
    """Score a single-turn answer with BFCL's AST checker (irrelevance: valid iff no call).

    Args:
        task: a ``"bfcl.ast"`` task.
        calls_per_turn: turns × steps × calls; only ``calls_per_turn[0][0]`` (the first ACT message) is the
            answer, later steps are ignored and counted in ``details["ignored_steps"]``.

    Returns:
        `VerifierResult` with ``details["turns"]`` (one entry), and ``error``/``error_type`` from BFCL's
        checker when invalid. Never raises for any model input: an exception inside the checker (e.g. an
        argument value of a shape BFCL does not expect) makes the answer invalid
        (``error_type="ast_checker:exception"``).
    """
    category = task.metadata["category"]
    steps = list(calls_per_turn[0]) if calls_per_turn else []
    answer = list(steps[0]) if steps else []
    details: dict[str, Any] = {"ignored_steps": max(0, len(steps) - 1)}
    name_map = task.metadata.get("tool_name_map") or {}
    if category in IRRELEVANCE_CATEGORIES:
        valid = len(answer) == 0
        if not valid:
            details.update(
                error=["Valid syntax. Successfully decode AST when it should not."],
                error_type="irrelevance_error:decoder_success",
            )
    else:
        ast_checker, python = _ast_checker()
        model_output = []
        for call in answer:
            args = call.arguments if isinstance(call.arguments, dict) else {}
            model_output.append({from_tool_name(str(call.name), name_map): dict(args)})
        try:
            result = ast_checker(
                task.metadata["functions"],
                model_output,
                task.metadata["ground_truth"],
                python,
                category,
                CHECKER_MODEL_NAME,
            )
        except Exception as e:  # BFCL's checker assumes well-shaped values
            result = {"valid": False, "error": [f"{type(e).__name__}: {e}"], "error_type": "ast_checker:exception"}
        valid = bool(result["valid"])
        if not valid:
            details.update(error=[str(x) for x in result.get("error", [])], error_type=result.get("error_type"))
    details["turns"] = [{"turn": 0, "valid": valid, "num_calls": len(answer)}]
    return VerifierResult(reward=1.0 if valid else 0.0, valid=valid, details=details)
