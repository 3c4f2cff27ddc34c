"""Real BFCL multi-turn tool backends, one fresh set of instances per rollout.

bfcl-eval's own executor (``multi_turn_utils.py: execute_multi_turn_func_call``) caches instances in module
globals by test id and runs ``eval`` on model text; it is never called here (docs/design.md §3). Instead:

* the classes are imported from ``bfcl_eval.eval_checker.multi_turn_eval.func_source_code`` through the
  class-name -> module map bfcl-eval itself uses (``constants/executable_backend_config.py:
  CLASS_FILE_PATH_MAPPING``), instantiated fresh and loaded with a deep copy of the task's
  ``initial_config`` via ``_load_scenario(config, long_context=...)``, skipping ``STATELESS_CLASSES``
  exactly as ``execute_multi_turn_func_call`` does;
* a call is dispatched by name to an allow-listed public method: no leading underscore, defined on the
  class, and named in the function docs of the task's involved classes. Names shared by two classes go to
  the later class in ``involved_classes`` (BFCL's name -> instance map is filled in that order too);
* arguments are keyword arguments only, passed as parsed literals; nothing is evaluated;
* the result is converted as BFCL records it: a ``str`` is kept, a ``dict`` becomes ``json.dumps`` (``str``
  if that fails), anything else ``str()``; an exception becomes ``"Error during execution: <message>"``.

The allow list holds every documented function of the involved classes, including the ones a
``miss_func`` task reveals later: BFCL's executor does not hide them either.
"""

from __future__ import annotations

import ast
import copy
import datetime
import functools
import hashlib
import importlib
import inspect
import json
import math
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from benchmarks.bfcl._env import bfcl_data_dir  # sets BFCL_PROJECT_ROOT first
from envace_gym.limits import DEFAULT_LIMITS, CallIsolationError, CallLimitExceeded, CallLimits, run_limited
from envace_gym.types import ToolCall

__all__ = [
    "BFCLBackend",
    "SingleTurnBackend",
    "class_function_docs",
    "bfcl_result_to_str",
    "parse_call_string",
    "canonical_state",
]

_EXEC_CONFIG = "bfcl_eval.constants.executable_backend_config"


@functools.cache
def _backend_config() -> tuple[dict[str, str], dict[str, str], frozenset[str]]:
    cfg = importlib.import_module(_EXEC_CONFIG)
    return (
        dict(cfg.CLASS_FILE_PATH_MAPPING),
        dict(cfg.MULTI_TURN_FUNC_DOC_FILE_MAPPING),
        frozenset(cfg.STATELESS_CLASSES),
    )


@functools.cache
def _backend_class(class_name: str) -> type:
    modules, _, _ = _backend_config()
    if class_name not in modules:
        raise ValueError(f"unknown BFCL backend class {class_name!r}; known: {sorted(modules)}")
    return getattr(importlib.import_module(modules[class_name]), class_name)


@functools.cache
def class_function_docs(class_name: str) -> tuple[dict[str, Any], ...]:
    """The BFCL function docs of one backend class, from ``data/multi_turn_func_doc/`` (JSON Lines).

    The file is the one ``MULTI_TURN_FUNC_DOC_FILE_MAPPING`` names (bfcl-eval ``utils.py:
    populate_test_cases_with_predefined_functions`` reads the same). Callers must not mutate the result.

    Raises:
        ValueError: unknown class name.
    """
    _, doc_files, _ = _backend_config()
    if class_name not in doc_files:
        raise ValueError(f"unknown BFCL backend class {class_name!r}; known: {sorted(doc_files)}")
    path = bfcl_data_dir() / "multi_turn_func_doc" / doc_files[class_name]
    with open(path, encoding="utf-8") as f:
        return tuple(json.loads(line) for line in f if line.strip())


def bfcl_result_to_str(result: Any) -> str:
    """Convert a method's return value to the text BFCL records (``multi_turn_utils.py:
    execute_multi_turn_func_call``): ``str`` kept, exact ``dict`` -> ``json.dumps`` (``str`` on failure),
    anything else -> ``str``."""
    if type(result) is str:
        return result
    if type(result) is dict:
        try:
            return json.dumps(result)
        except Exception:  # BFCL falls back to str() for unserialisable dicts
            return str(result)
    return str(result)


def parse_call_string(text: str) -> tuple[str, list[Any], dict[str, Any]]:
    """Parse a BFCL ground-truth call such as ``"mv(source='a', destination='b')"`` without executing it.

    Uses ``ast.parse`` and ``ast.literal_eval`` on each argument, so only literals are accepted.

    Returns:
        ``(function name, positional args, keyword args)``.

    Raises:
        ValueError: the text is not a single call of a plain or dotted name with literal arguments.
    """
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as e:
        raise ValueError(f"not a function call: {text!r} ({e})") from None
    if not isinstance(node, ast.Call):
        raise ValueError(f"not a function call: {text!r}")
    parts: list[str] = []
    fn = node.func
    while isinstance(fn, ast.Attribute):
        parts.append(fn.attr)
        fn = fn.value
    if not isinstance(fn, ast.Name):
        raise ValueError(f"call target is not a name: {text!r}")
    parts.append(fn.id)
    name = ".".join(reversed(parts))
    try:
        args = [ast.literal_eval(a) for a in node.args]
        kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg is not None}
    except ValueError as e:
        raise ValueError(f"non-literal argument in {text!r}: {e}") from None
    if any(k.arg is None for k in node.keywords):
        raise ValueError(f"**kwargs not supported in {text!r}")
    return name, args, kwargs


def canonical_state(obj: Any) -> Any:
    """A JSON-compatible canonical form of an object graph, for `BFCLBackend.snapshot`.

    Dicts become sorted ``[key, value]`` pairs (keys keep their type), sets are sorted, floats are written
    by ``repr``, ``random.Random`` by its ``getstate()``, other objects by class name and all their
    attributes (private ones included: ``GorillaFileSystem._current_dir`` is real state). A mutable
    container or object met a second time is written as a reference to its first visit, which also breaks
    cycles (``Directory.parent``); tuples are immutable, so their aliasing is not recorded. Private ``datetime``
    attributes are left out: ``File._last_modified`` is set from the wall clock, so two identical backends built a
    millisecond apart would otherwise differ.
    """
    memo: dict[int, int] = {}

    def enc(x: Any) -> Any:
        if x is None or isinstance(x, (bool, int, str)):
            return [type(x).__name__, x]
        if isinstance(x, float):
            return ["float", repr(x)]
        if isinstance(x, (datetime.datetime, datetime.date)):
            return [type(x).__name__, x.isoformat()]
        if isinstance(x, tuple):  # immutable: aliasing carries no state, so no memo
            return ["tuple", [enc(v) for v in x]]
        if isinstance(x, frozenset):
            return ["frozenset", sorted((enc(v) for v in x), key=lambda e: json.dumps(e, sort_keys=True))]
        key = id(x)
        if key in memo:
            return ["ref", memo[key]]
        memo[key] = len(memo)
        if isinstance(x, list):
            return ["list", [enc(v) for v in x]]
        if isinstance(x, dict):
            items = [(enc(k), v) for k, v in x.items()]
            items.sort(key=lambda kv: json.dumps(kv[0], sort_keys=True))
            return ["dict", [[k, enc(v)] for k, v in items]]
        if isinstance(x, set):
            return ["set", sorted((enc(v) for v in x), key=lambda e: json.dumps(e, sort_keys=True))]
        if isinstance(x, random.Random):
            return ["Random", json.loads(json.dumps(x.getstate()))]
        if hasattr(x, "__dict__"):
            attrs = {
                k: v
                for k, v in vars(x).items()
                if not (k.startswith("_") and isinstance(v, (datetime.datetime, datetime.date)))
            }
            return [type(x).__qualname__, [[k, enc(attrs[k])] for k in sorted(attrs)]]
        return [type(x).__qualname__, repr(x)]

    return enc(obj)


def _check_arguments(name: str, args: Mapping[str, Any], limits: CallLimits) -> None:
    """Reject arguments whose cost is unbounded inside one C-level operation, which a time limit cannot stop.

    BFCL's MathAPI sets ``decimal``/``mpmath`` precision from a ``precision`` argument and computes
    ``base ** exponent`` exactly for integers; ``precision=10**8`` or ``10 ** 10**8`` would run for minutes
    and take gigabytes.

    Raises:
        CallLimitExceeded: a ``precision`` above ``limits.max_precision``, or an integer power whose result
            would have more than ``limits.max_result_digits`` digits.
    """
    precision = args.get("precision")
    if isinstance(precision, (int, float)) and not isinstance(precision, bool) and precision > limits.max_precision:
        raise CallLimitExceeded(f"precision={precision} is above the limit of {limits.max_precision} digits")
    base, exponent = args.get("base"), args.get("exponent")
    if (
        name == "power"
        and isinstance(base, int)
        and not isinstance(base, bool)
        and isinstance(exponent, int)
        and not isinstance(exponent, bool)
    ):
        if exponent > 0 and abs(base) > 1 and exponent * math.log10(abs(base)) > limits.max_result_digits:
            raise CallLimitExceeded(
                f"{base} ** {exponent} would have more than {limits.max_result_digits} digits (the result limit)"
            )


def _call_to_str(method: Callable[..., Any], kwargs: dict[str, Any]) -> str:
    """``method(**kwargs)`` as BFCL records its result (module-level, so a call pickles to its process)."""
    return bfcl_result_to_str(method(**kwargs))


class BFCLBackend:
    """Fresh real instances of one multi-turn task's BFCL classes (implements `envace_gym.suites.ToolBackend`).

    Args:
        involved_classes: BFCL class names, e.g. ``["GorillaFileSystem", "TwitterAPI"]``.
        initial_config: ``{class name: scenario dict}`` from the task; deep-copied before loading.
        long_context: passed to ``_load_scenario`` (BFCL sets it for the ``long_context`` category).
        limits: the per-call limits (`envace_gym.limits.CallLimits`): every call runs under its time and
            memory limits (by default in a forked child whose changes to the instances are copied back) with
            the process's ``decimal``/``mpmath`` precision restored afterwards, and arguments that would run
            unbounded inside one C-level operation are refused first (`_check_arguments`).

    Raises:
        ValueError: an unknown class name.
    """

    def __init__(
        self,
        involved_classes: Sequence[str],
        initial_config: Mapping[str, Any] | None = None,
        long_context: bool = False,
        limits: CallLimits = DEFAULT_LIMITS,
    ):
        _, _, stateless = _backend_config()
        self.limits = limits
        initial_config = initial_config or {}
        self.involved_classes = list(involved_classes)
        self.long_context = bool(long_context)
        self.instances: dict[str, Any] = {}
        self._methods: dict[str, tuple[str, Callable[..., Any]]] = {}
        for class_name in self.involved_classes:
            cls = _backend_class(class_name)
            inst = cls()
            if class_name not in stateless:
                inst._load_scenario(copy.deepcopy(initial_config.get(class_name, {})), long_context=self.long_context)
            self.instances[class_name] = inst
            for doc in class_function_docs(class_name):
                name = doc["name"]
                if name.startswith("_") or not inspect.isfunction(getattr(cls, name, None)):
                    continue
                self._methods[name] = (class_name, getattr(inst, name))

    @property
    def method_names(self) -> list[str]:
        """The allow-listed method names, sorted."""
        return sorted(self._methods)

    def owner(self, name: str) -> str | None:
        """The class that answers method `name`, or None if it is not allow-listed."""
        entry = self._methods.get(name)
        return entry[0] if entry else None

    def positional_to_keywords(self, name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """Bind positional `args` of a ground-truth call to parameter names with the method's signature.

        Raises:
            ValueError: `name` is not allow-listed.
            TypeError: the arguments do not fit the signature.
        """
        if name not in self._methods:
            raise ValueError(f"{name!r} is not a function of this task")
        bound = inspect.signature(self._methods[name][1]).bind_partial(*args, **kwargs)
        return dict(bound.arguments)

    def execute(self, call: ToolCall) -> str:
        """Run one call; never raises for any call.

        Returns:
            The result as BFCL records it (`bfcl_result_to_str`), or an error string starting with
            ``"Error during execution: "`` (BFCL's prefix) for an unknown or private name, non-dict
            arguments, a bad argument, any exception inside the method, or a call over its limits.

        Raises:
            envace_gym.limits.CallIsolationError: process isolation itself failed (a setup problem).
        """
        try:
            name = call.name
            args = call.arguments
            if not isinstance(name, str) or name not in self._methods:
                return (
                    f"Error during execution: {name!r} is not an available function; "
                    f"available functions: {', '.join(self.method_names)}"
                )
            if not isinstance(args, dict) or not all(isinstance(k, str) for k in args):
                return f"Error during execution: arguments of {name} must be an object of keyword arguments"
            _check_arguments(name, args, self.limits)
            # Deep-copy the arguments: BFCL methods store argument objects in their state (post_tweet keeps
            # the `tags`/`mentions` lists and `mention` later extends them), which would otherwise alias the
            # caller's ToolCall and corrupt a later replay of the same calls (e.g. by the verifier).
            method, kwargs = self._methods[name][1], copy.deepcopy(args)
            return run_limited(
                functools.partial(_call_to_str, method, kwargs), self.limits, state=list(self.instances.values())
            )
        except CallIsolationError:  # the isolation machinery failed, not the call: a setup error to fix
            raise
        except Exception as e:  # any failure of the call is an observation, never a crash (docs/design.md §3)
            return f"Error during execution: {e}"

    def snapshot(self) -> bytes:
        """Canonical bytes of every instance's full state (`canonical_state`); equal exactly when the states are."""
        state = [[name, canonical_state(self.instances[name])] for name in sorted(self.instances)]
        return json.dumps(state, sort_keys=True, separators=(",", ":")).encode("utf-8")

    def state_digest(self) -> str:
        """sha256 hex digest of `snapshot`, for logs."""
        return hashlib.sha256(self.snapshot()).hexdigest()


class SingleTurnBackend:
    """The backend of a single-turn (AST) task: it has no state and runs nothing.

    Single-turn BFCL tasks are answered, not executed: the first ACT message's calls are the answer and the
    AST checker scores them. `execute` says so as an error observation.
    """

    def __init__(self, task_id: str = ""):
        self.task_id = task_id

    def execute(self, call: ToolCall) -> str:
        """Always an error string (never raises): single-turn tasks have no executable tools."""
        name = getattr(call, "name", "?")
        return (
            f"Error during execution: {name!r} cannot be executed: single-turn BFCL task {self.task_id!r} is "
            "answered, not executed; your first message's function calls are your answer."
        )

    def snapshot(self) -> bytes:
        """Always ``b""`` (no state)."""
        return b""
