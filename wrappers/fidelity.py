"""`RehearsalFidelity`: shadow every rehearsed tool response with the real backend's answer to the same call.

Four per-call metrics (`METRICS`) compare a rehearsed response (the policy's REHEARSE text) with the real response
(what a real backend returns for the same call at the same point of the same trajectory):

* `exact_match`: the two texts are equal after stripping leading and trailing whitespace.
* `json_structure_match`: both texts parse as JSON (``json.loads`` after stripping) and have the same
  *structure*, defined recursively: JSON numbers (int or float) match each other; strings, booleans and
  null match only their own type; two objects match when they have the same key set and the values of
  every key match; two arrays match when they have the same length and match element by element. Values
  of strings, numbers and booleans are ignored. Text that is not JSON never matches.
* `token_f1`: SQuAD-style token F1: both texts are lower-cased, every punctuation character
  (``string.punctuation``) becomes a space, the articles a/an/the are dropped, the rest is split on
  whitespace; F1 = 2PR/(P+R) over the multiset overlap of the two token lists. Two empty token lists give
  1.0, one empty list 0.0.
* `outcome_match`: both texts report a failed call or neither does (`is_error_output`). Over the calls whose
  real output is an error it is the share of failures the world model foresaw; over the others, the share of
  successes it did not mistake for failures. This is the bit a rehearsal before an irreversible call must get
  right, whatever the wording of the output.

Every call is also sorted by its real output (`is_error_output`): an *error* output (the call failed: the
world model must foresee a mistake) or an *ordinary* one. `fidelity_summary` reports the metrics over
all calls and over each kind separately, because a world model that copies the usual shape of a success
scores well overall while never foreseeing a failure, which is what rehearsing before committing is for.
"""

from __future__ import annotations

import json
import re
import string
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
from gymnasium.utils import RecordConstructorArgs

from envace_gym.responders import Hybrid, Rehearsal
from envace_gym.suites import ToolBackend
from envace_gym.types import Task, ToolCall

__all__ = [
    "RehearsalFidelity",
    "exact_match",
    "json_structure_match",
    "token_f1",
    "outcome_match",
    "fidelity_metrics",
    "is_error_output",
    "fidelity_summary",
    "mean_metrics",
    "METRICS",
]

_PUNCT = re.compile("[" + re.escape(string.punctuation) + "]")
_ARTICLES = {"a", "an", "the"}
_ERROR_PREFIXES = ("Error during execution:", "Error:")


def exact_match(rehearsed: str, real: str) -> float:
    """1.0 when the texts are equal after ``str.strip()``, else 0.0."""
    return 1.0 if rehearsed.strip() == real.strip() else 0.0


def _structure_equal(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool)
    if isinstance(a, (int, float)) or isinstance(b, (int, float)):
        return isinstance(a, (int, float)) and isinstance(b, (int, float))
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, str) or isinstance(b, str):
        return isinstance(a, str) and isinstance(b, str)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_structure_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_structure_equal(x, y) for x, y in zip(a, b))
    return False


def json_structure_match(rehearsed: str, real: str) -> float:
    """1.0 when both texts are JSON with the same structure (module docstring), else 0.0. Never raises."""
    try:
        a, b = json.loads(rehearsed.strip()), json.loads(real.strip())
    except (ValueError, RecursionError):
        return 0.0
    try:
        return 1.0 if _structure_equal(a, b) else 0.0
    except RecursionError:
        return 0.0


def _tokens(text: str) -> list[str]:
    return [t for t in _PUNCT.sub(" ", text.lower()).split() if t not in _ARTICLES]


def token_f1(rehearsed: str, real: str) -> float:
    """SQuAD-style token F1 in [0, 1] (module docstring).

    Examples:
        >>> token_f1('{"total": 3}', '{"total": 5}')
        0.5
        >>> token_f1("The file a.txt", "file a txt")
        1.0
    """
    pred, gold = _tokens(rehearsed), _tokens(real)
    if not pred and not gold:
        return 1.0
    if not pred or not gold:
        return 0.0
    common = sum((Counter(pred) & Counter(gold)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(gold)
    return 2 * precision * recall / (precision + recall)


def outcome_match(rehearsed: str, real: str) -> float:
    """1.0 when both texts report a failed call or neither does, else 0.0: `is_error_output` of `real`; for
    `rehearsed` also a JSON object cut short after its first key ``"error"`` (a rehearsal stopped by its token
    cap foresaw the failure all the same)."""
    return 1.0 if _reports_failure(rehearsed) == is_error_output(real) else 0.0


def _reports_failure(text: str) -> bool:
    return is_error_output(text) or re.match(r'\s*\{\s*"error"\s*:', text) is not None


_METRIC_FUNCTIONS: dict[str, Callable[[str, str], float]] = {
    "exact_match": exact_match,
    "json_structure_match": json_structure_match,
    "token_f1": token_f1,
    "outcome_match": outcome_match,
}
METRICS = tuple(_METRIC_FUNCTIONS)
"""The per-call metrics, in the order tables show them."""


def fidelity_metrics(rehearsed: str, real: str) -> dict[str, float]:
    """Every metric of `METRICS` for one pair of texts (floats in [0, 1])."""
    return {name: metric(rehearsed, real) for name, metric in _METRIC_FUNCTIONS.items()}


def is_error_output(text: str) -> bool:
    """True when a real tool output reports a failed call: a JSON object with an ``"error"`` key (the lab's
    backend, BFCL's dict results), or a text starting with ``"Error during execution:"`` (BFCL's prefix, and
    what the responders write for a backend that raised) or ``"Error:"`` (the envs' parse-error message).
    Never raises."""
    stripped = text.strip()
    if stripped.startswith(_ERROR_PREFIXES):
        return True
    if not stripped.startswith("{"):
        return False
    try:
        value = json.loads(stripped)
    except (ValueError, RecursionError):
        return False
    return isinstance(value, dict) and "error" in value


def _metric(record: dict[str, Any], key: str) -> float:
    # records written before a metric existed (a resumed evaluation) have their texts: score them now
    return record[key] if key in record else _METRIC_FUNCTIONS[key](record["rehearsed"], record["real"])


def mean_metrics(records: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The mean of each of `METRICS` over `records` (call records as `fidelity_summary` takes them); 0.0 each
    over no record."""
    n = len(records)
    return {key: sum(_metric(r, key) for r in records) / n if n else 0.0 for key in METRICS}


def fidelity_summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Means of the metrics over `records` (call records with ``real`` and the `METRICS` keys; a metric a
    record lacks is scored from its ``rehearsed`` and ``real`` texts), overall and split by the real output's
    kind (`is_error_output`).

    Returns:
        ``{"num_calls": int, <each of METRICS>: float, "error": {...}, "ordinary": {...}}``; ``error`` and
        ``ordinary`` hold ``num_calls`` and the means over their own calls. A mean over no call is 0.0 (read
        ``num_calls`` to tell it from a measured 0).

    Raises:
        KeyError: a record lacks ``real``, or lacks a metric and ``rehearsed``.
    """
    errors = [r for r in records if is_error_output(r["real"])]
    ordinary = [r for r in records if not is_error_output(r["real"])]
    return {
        "num_calls": len(records),
        **mean_metrics(records),
        "error": {"num_calls": len(errors), **mean_metrics(errors)},
        "ordinary": {"num_calls": len(ordinary), **mean_metrics(ordinary)},
    }


class RehearsalFidelity(gym.Wrapper, RecordConstructorArgs):
    """Record how close each rehearsed tool response is to the real backend's response to the same call.

    The wrapped env is a token-level `ToolUseEnv` that rehearses (``EnvACE-Rehearse-v0``, no `RealTools`). At every
    `reset` the wrapper builds its own *shadow* backend with `backend_factory` (default: the suite's real backend, in
    the task's initial state), isolated from everything else. After each step it executes every call the
    step rehearsed (``info["rehearsals"]``, in order) on the shadow backend, so the shadow follows the
    rehearsed trajectory's calls, and compares the two responses (`fidelity_metrics`). The rehearsed
    trajectory itself is not changed: the shadow's answers are never shown to the policy. Steps with a
    parse error or no call rehearse nothing and add no record.

    ``info["fidelity"]`` on every step (after `reset`: the same keys, ``calls`` empty):

    * ``calls``: list of dicts, one per rehearsed call of this step: ``task_id`` (str), ``category`` (str:
      ``task.metadata["category"]`` or the suite name), ``turn`` (int), ``tool`` (str), ``arguments``
      (dict), ``rehearsed`` (str), ``real`` (str), ``real_error`` (bool: `is_error_output` of ``real``),
      and each of `METRICS` (floats in [0, 1]).
    * ``episode``: `fidelity_summary` of the episode's calls so far: ``num_calls`` (int) and the means of the
      metrics (0.0 when there are none), and the same over the calls whose real output is an error
      (``error``) and over the others (``ordinary``).

    ``self.episode_calls`` holds every record of the current episode.

    Examples:
        >>> import gymnasium as gym, envace_gym  # doctest: +SKIP
        >>> env = RehearsalFidelity(gym.make("EnvACE-Rehearse-v0", model="tiny-random"))  # doctest: +SKIP
        >>> _ = env.reset(seed=0)  # doctest: +SKIP
        >>> *_, info = env.step("[ls()]")  # doctest: +SKIP
        >>> info["fidelity"]["calls"][0]["real"]  # the real GorillaFileSystem answer  # doctest: +SKIP

    Args:
        env: an env whose ``unwrapped`` is a rehearsing `ToolUseEnv` (no real backend).
        backend_factory: Task -> ToolBackend for the shadow; None uses ``env.unwrapped.suite.make_backend``.

    Raises:
        TypeError: the wrapped env is not a rehearsing `ToolUseEnv` (or it answers some calls from a real backend,
            `envace_gym.responders.Hybrid`), or `backend_factory` is not callable.

    Change log:
        * v0.1.0: initial version.
    """

    def __init__(self, env: gym.Env, backend_factory: Callable[[Task], ToolBackend] | None = None) -> None:
        RecordConstructorArgs.__init__(self, backend_factory=backend_factory)
        gym.Wrapper.__init__(self, env)
        base: Any = env.unwrapped  # duck-typed: a token-level ToolUseEnv (checked below)
        if not getattr(base, "keeps_tokens", False):
            raise TypeError(f"RehearsalFidelity wraps a token-level ToolUseEnv, got {type(base).__name__}")
        if not isinstance(base.upcoming_responder, Rehearsal):
            raise TypeError(
                "RehearsalFidelity needs a rehearsing env; this one answers with a real backend (RealTools, "
                "or EnvACE-Tool-v0's default)"
            )
        if isinstance(base.upcoming_responder, Hybrid):  # the shadow would miss the calls the backend answered
            raise TypeError(
                "RehearsalFidelity needs an env that rehearses every call; this one's Hybrid responder answers some "
                "from the real backend (give it Rehearsal(rehearser))"
            )
        if backend_factory is not None and not callable(backend_factory):
            raise TypeError(f"backend_factory must be callable (Task -> ToolBackend), got {backend_factory!r}")
        self.backend_factory = backend_factory or base.suite.make_backend
        self.shadow: ToolBackend | None = None
        self.episode_calls: list[dict[str, Any]] = []

    def reset(self, **kwargs: Any):
        """Reset the wrapped env and build a fresh shadow backend for its task."""
        obs, info = self.env.reset(**kwargs)
        base: Any = self.env.unwrapped  # a ToolUseEnv (checked in __init__)
        self.shadow = self.backend_factory(base.task)
        self.episode_calls = []
        info["fidelity"] = self._summary([])
        return obs, info

    def step(self, action: str):
        """Step the wrapped env, then shadow each rehearsed call on the real backend.

        Raises:
            RuntimeError: `step` before `reset`.
        """
        if self.shadow is None:
            raise RuntimeError("call reset() before step()")
        obs, reward, terminated, truncated, info = self.env.step(action)
        base: Any = self.env.unwrapped  # a ToolUseEnv (checked in __init__)
        task = base.task
        records = []
        for reh in info.get("rehearsals", []):
            call = ToolCall.from_openai(reh.call)
            try:
                real = str(self.shadow.execute(call))
            except Exception as err:  # a backend must not crash the env (docs/design.md §3)
                real = f"Error during execution: {type(err).__name__}: {err}"
            record = {
                "task_id": task.id,
                "category": str(task.metadata.get("category", task.suite)),
                "turn": info.get("turn", 0),
                "tool": call.name,
                "arguments": call.arguments,
                "rehearsed": reh.text,
                "real": real,
                "real_error": is_error_output(real),
                **fidelity_metrics(reh.text, real),
            }
            records.append(record)
        self.episode_calls.extend(records)
        info["fidelity"] = self._summary(records)
        return obs, reward, terminated, truncated, info

    def _summary(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        return {"calls": records, "episode": fidelity_summary(self.episode_calls)}
