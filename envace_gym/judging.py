"""LLM-judge rewards beside the suite's verifier: the `Judge` interface, verdict parsing, checklists and
`score_with_judge`.

A judge is a chat model asked a yes/no question about a trajectory. This module holds what does not depend on
which model answers: the model side lives in `agents.judges` (`LocalJudge`: a model of the model store on our
engines; `OpenAIJudge`: any OpenAI-compatible endpoint), and a suite that needs a judge (τ²'s ``NL_ASSERTION``
tasks, `benchmarks.tau2.nl_assertions`) takes any `Judge`.

Verdicts are text, never code: `parse_verdict` reads a JSON object with a boolean ``answer`` (or ``result``,
``verdict``, ``met``, ``metExpectation``, ``passed``) or a reply that opens with ``yes``/``no`` (``true``/
``false``), and nothing else; the text is never evaluated. A reply it cannot read is **unparseable**: it scores
the caller's ``unparseable_score`` (default 0.0) and is counted in the judge's `JudgeStats`, and it never raises.

## Checklists (the JSONL format)

A checklist gives, for one task, the items a judge answers for each user turn, with weights, after the
checklist rewards of CM2 (Zhang et al. 2026, "Reinforcement Learning with Checklist Rewards for Multi-Turn and
Multi-Step Agentic Tool Use"; its reference code keeps, per user turn, a list of checklist items with a
``weight`` each and asks the judge one item at a time). One JSON object per line:

```json
{"task_id": "relocate_0", "turns": [[{"item": "The assistant called move with item=\\"lamp\\" and shelf=\\"B\\".",
                                      "weight": 1.0}, ...], ...]}
```

* ``task_id`` (str): the `envace_gym.types.Task` id; one line per task.
* ``turns`` (list, one entry per user turn, in order): each a list of items; an empty list leaves the turn unscored.
* an item: ``item`` (str, non-empty; CM2's name ``question`` is read too) and ``weight`` (float > 0, default 1.0).
  Other keys are allowed and ignored (CM2's ``focus_on``, ``evidence``, ...).

The reward (`score_with_judge`): the judge answers every item of turn ``k`` on the conversation up to the end of
user turn ``k``; turn ``k`` scores the weighted fraction of its items met, ``sum(w_i * s_i) / sum(w_i)`` with
``s_i`` in {0, 1} (an unparseable verdict: ``unparseable_score``); R is the mean over the checklist's scored
turns, in [0, 1]. The last checklist turn also covers any later user turns of the conversation (a simulated user
may take more turns than a checklist written from a one-turn reference); a checklist turn the conversation never
reached scores 0 without asking the judge. Suites derive checklists from their reference solutions
(``Suite.checklist(task)``: `benchmarks.lab.suite.LabSuite.checklist`, `benchmarks.tau2.suite.Tau2Suite.checklist`),
so judge and verifier can be compared on the same trajectories (``benchmarks/experiments/judge_agreement.py``).

## Reward modes

`score_with_judge` judges the trajectory as it was recorded: in a rehearsed rollout its tool messages are the
policy's own REHEARSE outputs, so the reward needs no real backend (the ``judge_imagined`` reward, "no external
environment in the loop"). Given a fresh real ``backend`` it first replays the ACT calls on it and judges the
conversation with the real outputs (`with_real_observations`; the ``judge`` reward).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from envace_gym.parsing import strip_thinking, text_outside_tool_calls
from envace_gym.types import Message, Trajectory

__all__ = [
    "Judge",
    "JudgeError",
    "JudgeStats",
    "VerdictResult",
    "CachedJudge",
    "prompt_key",
    "parse_verdict",
    "parse_json_object",
    "judge_verdicts",
    "ChecklistItem",
    "Checklist",
    "load_checklists",
    "write_checklists",
    "JUDGE_SYSTEM_PROMPT",
    "checklist_prompts",
    "score_with_judge",
    "with_real_observations",
    "transcript",
    "conversation_turns",
]

VERDICT_KEYS = ("answer", "result", "verdict", "met", "metExpectation", "passed")
"""JSON keys `parse_verdict` reads a verdict from, in this order."""

JUDGE_SYSTEM_PROMPT = (
    "You are a strict checklist evaluator. You are given a conversation between a user, an assistant and tools, "
    "and one checklist item about what the assistant did in one user turn. Decide whether the turn satisfies the "
    'item. Reply with only a JSON object: {"answer": true} if it does, {"answer": false} if it does not.'
)
"""System message of every checklist prompt (`checklist_prompts`)."""


class JudgeError(RuntimeError):
    """The judge could not be asked at all (an endpoint unreachable or failing after its retries, a model that
    cannot be loaded). Raised, unlike an unparseable verdict: it is a broken set-up, not a verdict."""


@dataclass
class JudgeStats:
    """What a judge was asked and how its answers read (cumulative; `CachedJudge` and `judge_verdicts` fill it).

    Attributes:
        prompts: prompts asked through `Judge.complete` (cache hits included).
        cache_hits: prompts answered from the cache, the model not asked.
        generated: prompts the model answered.
        verdicts: answers read as a verdict by `judge_verdicts` (or a suite's own parser).
        unparseable: answers that could not be read; each scored as the caller configured.
    """

    prompts: int = 0
    cache_hits: int = 0
    generated: int = 0
    verdicts: int = 0
    unparseable: int = 0

    def to_dict(self) -> dict[str, int]:
        """JSON-compatible dict."""
        return dict(self.__dict__)


@runtime_checkable
class Judge(Protocol):
    """A chat model that answers judge prompts (`agents.judges.LocalJudge`, `agents.judges.OpenAIJudge`).

    Attributes:
        stats: the judge's `JudgeStats` (parsers add their verdict counts to it).
    """

    stats: JudgeStats

    def complete(self, prompts: Sequence[Sequence[Message]]) -> list[str]:
        """One reply text per prompt (a prompt: chat messages, usually a system and a user message), in order.

        Raises:
            JudgeError: the model could not be asked.
        """
        ...


def prompt_key(prompt: Sequence[Message]) -> str:
    """The cache key of a prompt: the SHA-256 of its messages as canonical JSON (`Message.to_dict`)."""
    text = json.dumps([m.to_dict() for m in prompt], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class CachedJudge:
    """Base of the judges: a least-recently-used cache of replies keyed by prompt (`prompt_key`) and the stats.

    A subclass implements ``_generate(prompts) -> list[str]`` for the prompts the cache does not hold; a prompt
    repeated within one call is generated once. Greedy judges give the same reply to the same prompt, so the cache
    changes no reward (a sampling judge's cache pins its first reply). Thread-safe.

    Args:
        cache_size: replies kept (0: no cache).

    Raises:
        ValueError: a negative `cache_size`.
    """

    def __init__(self, cache_size: int = 100_000) -> None:
        if cache_size < 0:
            raise ValueError(f"cache_size must be >= 0, got {cache_size!r}")
        self.cache_size = cache_size
        self.stats = JudgeStats()
        self._cache: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def _generate(self, prompts: list[list[Message]]) -> list[str]:
        raise NotImplementedError

    def complete(self, prompts: Sequence[Sequence[Message]]) -> list[str]:
        """Replies to `prompts` in order, from the cache where it holds them (`Judge.complete`)."""
        keys = [prompt_key(p) for p in prompts]
        out: dict[str, str] = {}
        with self._lock:
            self.stats.prompts += len(keys)
            for k in keys:
                if k in self._cache:
                    self._cache.move_to_end(k)
                    out[k] = self._cache[k]
            self.stats.cache_hits += sum(k in out for k in keys)
        todo: dict[str, list[Message]] = {}
        for k, p in zip(keys, prompts):
            if k not in out and k not in todo:
                todo[k] = list(p)
        if todo:
            replies = self._generate(list(todo.values()))
            if len(replies) != len(todo):
                raise JudgeError(f"the judge returned {len(replies)} replies for {len(todo)} prompts")
            with self._lock:
                self.stats.generated += len(todo)
                for k, reply in zip(todo, replies):
                    out[k] = reply
                    if self.cache_size:
                        self._cache[k] = reply
                        self._cache.move_to_end(k)
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
        return [out[k] for k in keys]


# ------------------------------------------------------------------------------------------------ parsing

_FENCE_RE = re.compile(r"```[A-Za-z]*\s*\n?(.*?)```", re.DOTALL)
_PLAIN_RE = re.compile(
    r"^[\s*_`\"'#>-]*(?:(?:final\s+)?(?:answer|verdict|result)\s*[:=]\s*[*_`\"']*)?(yes|no|true|false)\b",
    re.IGNORECASE,
)
_WORDS = {"yes": True, "true": True, "pass": True, "passed": True, "no": False, "false": False, "fail": False}
_MAX_OBJECT_STARTS = 64  # bounds the JSON scan of a long reply (each start is one linear raw_decode)


def parse_json_object(text: str) -> dict[str, Any] | None:
    """The last top-level JSON object in `text` (the last fenced block that holds one first), or None.

    Objects are read with `json.JSONDecoder.raw_decode` (never evaluated), left to right, an object's nested
    objects skipped (so ``{"results": [{...}]}`` is the whole object, not its last item); at most
    `_MAX_OBJECT_STARTS` starts are tried, which bounds the time on a reply full of braces. Reasoning in
    ``<think>`` blocks is dropped first.
    """
    text = strip_thinking(text)
    decoder = json.JSONDecoder()
    for block in reversed(_FENCE_RE.findall(text)):
        try:
            value = json.loads(block.strip())
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    found: dict[str, Any] | None = None
    i, tries = text.find("{"), 0
    while i != -1 and tries < _MAX_OBJECT_STARTS:
        tries += 1
        try:
            value, end = decoder.raw_decode(text, i)
        except ValueError:
            i = text.find("{", i + 1)
            continue
        if isinstance(value, dict):
            found = value
        i = text.find("{", end)
    return found


def _as_verdict(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        return _WORDS.get(value.strip().strip(".!").lower())
    return None


def parse_verdict(text: str) -> bool | None:
    """A judge's yes/no verdict, or None when the text holds none (never evaluated as code).

    Accepted, in order:

    1. a JSON object (fenced or inline; the last one in the text) with a key of `VERDICT_KEYS` whose value is a
       boolean or one of ``"yes"``, ``"no"``, ``"true"``, ``"false"``, ``"pass"``, ``"fail"``;
    2. a reply that opens with ``yes``/``no``/``true``/``false``, optionally after ``Answer:``, ``Verdict:`` or
       ``Result:`` and Markdown emphasis (``**Yes**, because ...``).

    Anything else (a yes/no later in a sentence, an object without a verdict key) is None: a verdict is never
    guessed from free text.
    """
    obj = parse_json_object(text)
    if obj is not None:
        for key in VERDICT_KEYS:
            if key in obj:
                verdict = _as_verdict(obj[key])
                if verdict is not None:
                    return verdict
    match = _PLAIN_RE.match(strip_thinking(text))
    return _WORDS[match.group(1).lower()] if match else None


@dataclass
class VerdictResult:
    """One item's outcome (`judge_verdicts`).

    Attributes:
        score: 1.0 met, 0.0 not met, or the unparseable score.
        verdict: the parsed verdict, None when unparseable.
        reply: the judge's text.
    """

    score: float
    verdict: bool | None
    reply: str


def judge_verdicts(
    judge: Judge, prompts: Sequence[Sequence[Message]], unparseable_score: float = 0.0
) -> list[VerdictResult]:
    """Ask `judge` every prompt (one `Judge.complete` call) and read each reply with `parse_verdict`; counts
    parsed and unparseable replies in ``judge.stats``.

    Raises:
        JudgeError: from the judge (the model could not be asked); never for a reply.
    """
    replies = judge.complete(prompts) if prompts else []
    out = []
    for reply in replies:
        verdict = parse_verdict(reply)
        if verdict is None:
            judge.stats.unparseable += 1
            out.append(VerdictResult(float(unparseable_score), None, reply))
        else:
            judge.stats.verdicts += 1
            out.append(VerdictResult(1.0 if verdict else 0.0, verdict, reply))
    return out


# --------------------------------------------------------------------------------------------- checklists


@dataclass(frozen=True)
class ChecklistItem:
    """One yes/no question for the judge about one user turn.

    Attributes:
        item: the statement the turn must satisfy, in plain language.
        weight: its weight within the turn (> 0).
    """

    item: str
    weight: float = 1.0

    def to_dict(self) -> dict[str, Any]:
        """``{"item": ..., "weight": ...}``."""
        return {"item": self.item, "weight": self.weight}


@dataclass
class Checklist:
    """The checklist of one task: items per user turn (module docstring, "Checklists").

    Attributes:
        task_id: the task's id.
        turns: per user turn, its items (an empty turn is not scored).
    """

    task_id: str
    turns: list[list[ChecklistItem]] = field(default_factory=list)

    @property
    def num_items(self) -> int:
        """Items over all turns."""
        return sum(len(t) for t in self.turns)

    def to_dict(self) -> dict[str, Any]:
        """One JSONL record."""
        return {"task_id": self.task_id, "turns": [[i.to_dict() for i in turn] for turn in self.turns]}

    @classmethod
    def from_dict(cls, d: Any) -> Checklist:
        """Read and check one record (the format of the module docstring).

        Raises:
            ValueError: not an object, no ``task_id``, ``turns`` not a list of lists, an item without text or
                with a weight that is not a finite number > 0, or no item at all.
        """
        if not isinstance(d, dict):
            raise ValueError(f"a checklist must be a JSON object, got {type(d).__name__}")
        task_id = d.get("task_id")
        if not isinstance(task_id, str) or not task_id:
            raise ValueError(f"a checklist needs a non-empty string 'task_id', got {task_id!r}")
        turns = d.get("turns")
        if not isinstance(turns, list) or not all(isinstance(t, list) for t in turns):
            raise ValueError(f"checklist {task_id!r}: 'turns' must be a list (per user turn) of lists of items")
        out: list[list[ChecklistItem]] = []
        for k, turn in enumerate(turns):
            items = []
            for j, raw in enumerate(turn):
                where = f"checklist {task_id!r}, turn {k}, item {j}"
                if not isinstance(raw, dict):
                    raise ValueError(f"{where}: an item must be an object with 'item' and 'weight'")
                text = raw.get("item", raw.get("question"))
                if not isinstance(text, str) or not text.strip():
                    raise ValueError(f"{where}: 'item' must be a non-empty string, got {text!r}")
                weight = raw.get("weight", 1.0)
                if isinstance(weight, bool) or not isinstance(weight, (int, float)):
                    raise ValueError(f"{where}: 'weight' must be a number, got {weight!r}")
                if not math.isfinite(weight) or weight <= 0:
                    raise ValueError(f"{where}: 'weight' must be finite and > 0, got {weight!r}")
                items.append(ChecklistItem(text, float(weight)))
            out.append(items)
        checklist = cls(task_id, out)
        if checklist.num_items == 0:
            raise ValueError(f"checklist {task_id!r} has no item")
        return checklist


def load_checklists(path: str | os.PathLike[str]) -> dict[str, Checklist]:
    """Read a checklist JSONL file (module docstring): task id -> `Checklist`. Blank lines are skipped.

    Raises:
        FileNotFoundError: no such file.
        ValueError: a line that is not JSON or not a valid checklist, or a task id given twice (the message
            names the file and line).
    """
    out: dict[str, Checklist] = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                checklist = Checklist.from_dict(json.loads(line))
            except ValueError as err:
                raise ValueError(f"{path}:{n}: {err}") from None
            if checklist.task_id in out:
                raise ValueError(f"{path}:{n}: task {checklist.task_id!r} has a checklist on an earlier line")
            out[checklist.task_id] = checklist
    return out


def write_checklists(path: str | os.PathLike[str], checklists: Iterable[Checklist]) -> int:
    """Write checklists as JSONL (one per line, `Checklist.to_dict`), replacing `path`; returns the count."""
    records = [json.dumps(c.to_dict(), ensure_ascii=False) for c in checklists]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("".join(r + "\n" for r in records), encoding="utf-8")
    return len(records)


# ------------------------------------------------------------------------------------------ judge prompts


def conversation_turns(messages: Sequence[Message]) -> list[list[Message]]:
    """The messages grouped by user turn: a turn opens at the first message and at every user or system message
    that follows a closing assistant message (one without tool calls), as `Trajectory.calls_per_turn` counts turns."""
    turns: list[list[Message]] = [[]]
    previous: Message | None = None
    for m in messages:
        if (
            m.role in ("user", "system")
            and previous is not None
            and previous.role == "assistant"
            and not previous.tool_calls
        ):
            turns.append([])
        turns[-1].append(m)
        previous = m
    return turns


def transcript(messages: Sequence[Message]) -> str:
    """Messages as plain text for a judge: ``role: text`` lines; an assistant's calls as ``name {JSON arguments}``
    (read from its parsed calls, so every tool-call format reads the same), a tool output under its tool's name."""
    lines = []
    for m in messages:
        if m.role == "assistant" and m.tool_calls:
            said = text_outside_tool_calls(m.content).strip()
            calls = "; ".join(f"{c.name} {json.dumps(c.arguments, ensure_ascii=False)}" for c in m.tool_calls)
            lines.append(f"assistant: {said + ' ' if said else ''}[calls] {calls}")
        elif m.role == "tool":
            lines.append(f"tool{f' ({m.name})' if m.name else ''}: {m.content}")
        else:
            lines.append(f"{m.role}: {strip_thinking(m.content).strip()}")
    return "\n".join(lines)


def _turn_groups(trajectory: Trajectory, checklist: Checklist) -> list[list[Message] | None]:
    """Per checklist turn, the conversation up to its end, or None when the conversation never reached it (the
    last checklist turn runs to the end of the conversation)."""
    turns = conversation_turns(trajectory.messages)
    n = len(checklist.turns)
    out: list[list[Message] | None] = []
    for k in range(n):
        span = turns[k:] if k == n - 1 else turns[k : k + 1]
        if not any(m.role == "assistant" for t in span for m in t):
            out.append(None)  # the agent never spoke in this turn: nothing to judge
            continue
        upto = turns if k == n - 1 else turns[: k + 1]
        out.append([m for t in upto for m in t])
    return out


def checklist_prompts(
    trajectory: Trajectory, checklist: Checklist, system: bool = True
) -> list[tuple[int, int, list[Message] | None]]:
    """The judge prompts of a checklist on a trajectory: ``(turn, item index, prompt)`` per item, in order; the
    prompt is None for a turn the conversation never reached (it is not asked). A prompt is a system message
    (`JUDGE_SYSTEM_PROMPT`) and a user message holding the conversation before the turn, the turn itself
    (`transcript`) and the item. ``system=False`` leaves the conversation's system messages out of the transcript
    (a long agent policy or world description the items do not need: shorter prompts, a cheaper judge)."""
    if not system:
        trajectory = copy.copy(trajectory)
        trajectory.messages = [m for m in trajectory.messages if m.role != "system"]
    groups = _turn_groups(trajectory, checklist)
    turns = conversation_turns(trajectory.messages)
    out: list[tuple[int, int, list[Message] | None]] = []
    for k, items in enumerate(checklist.turns):
        group = groups[k]
        before = [m for t in turns[:k] for m in t] if group is not None else []
        current = group[len(before) :] if group is not None else []
        for j, item in enumerate(items):
            if group is None:
                out.append((k, j, None))
                continue
            user = (
                (f"Conversation before this turn:\n{transcript(before)}\n\n" if before else "")
                + f"The turn to judge (user turn {k + 1}):\n{transcript(current)}\n\n"
                + f"Checklist item: {item.item}\n\n"
                + 'Does the turn satisfy the item? Reply {"answer": true} or {"answer": false}.'
            )
            out.append((k, j, [Message("system", JUDGE_SYSTEM_PROMPT), Message("user", user)]))
    return out


def with_real_observations(trajectory: Trajectory, backend: Any) -> Trajectory:
    """A copy of `trajectory` whose tool outputs are the real ones: its ACT calls replayed, in order, on
    `backend` (a fresh `envace_gym.suites.ToolBackend` in the task's initial state; the caller makes it with
    ``suite.make_backend(task)``). The tool messages after each assistant message with calls are replaced by one
    message per call (id and name kept from the call); segments and everything else are copied unchanged."""
    out = copy.deepcopy(trajectory)
    messages: list[Message] = []
    skipping = False
    for m in trajectory.messages:
        if m.role == "tool" and skipping:
            continue
        skipping = False
        messages.append(copy.deepcopy(m))
        if m.role == "assistant" and m.tool_calls:
            for c in m.tool_calls:
                messages.append(Message("tool", backend.execute(c), tool_call_id=c.id, name=c.name))
            skipping = True
    out.messages = messages
    return out


def score_with_judge(
    trajectory: Trajectory,
    checklist: Checklist,
    judge: Judge,
    *,
    backend: Any = None,
    unparseable_score: float = 0.0,
    system: bool = True,
) -> tuple[float, dict[str, Any]]:
    """The checklist reward of a trajectory (module docstring): R in [0, 1] and its details.

    Args:
        trajectory: a finished (or cut) episode; its messages are judged.
        checklist: the task's checklist (``checklist.task_id == trajectory.task.id``).
        judge: who answers the items (one `Judge.complete` call for all of them; cached by prompt).
        backend: None judges the trajectory as recorded (rehearsed tool outputs stay: the ``judge_imagined``
            reward); a fresh real backend of the task replays the calls first (`with_real_observations`: the
            ``judge`` reward).
        unparseable_score: the score of an item whose verdict cannot be read (counted in ``judge.stats`` and in
            the details, never raised).
        system: show the judge the conversation's system messages (`checklist_prompts`).

    Returns:
        ``(reward, info)``; ``info``: ``turns`` (per checklist turn: ``turn``, ``reached``, ``score`` and
        ``items``, each with ``item``, ``weight``, ``verdict`` (True, False or None), ``score`` and the judge's
        ``reply`` (None when not asked)), ``judged``
        (items asked) and ``unparseable`` (items whose verdict could not be read).

    Raises:
        ValueError: the checklist is another task's, or `unparseable_score` is outside [0, 1].
        JudgeError: from the judge (it could not be asked at all).
    """
    if checklist.task_id != trajectory.task.id:
        raise ValueError(f"checklist of task {checklist.task_id!r} given for task {trajectory.task.id!r}")
    if not 0.0 <= unparseable_score <= 1.0:
        raise ValueError(f"unparseable_score must be in [0, 1], got {unparseable_score!r}")
    if backend is not None:
        trajectory = with_real_observations(trajectory, backend)
    if not system:
        trajectory = copy.copy(trajectory)
        trajectory.messages = [m for m in trajectory.messages if m.role != "system"]
    asked = checklist_prompts(trajectory, checklist)
    groups = _turn_groups(trajectory, checklist)
    prompts = [p for _, _, p in asked if p is not None]
    results = iter(judge_verdicts(judge, prompts, unparseable_score))
    turns: list[dict[str, Any]] = []
    for k, items in enumerate(checklist.turns):
        rows: list[dict[str, Any]] = []
        for kk, j, prompt in asked:
            if kk != k:
                continue
            item = items[j]
            if prompt is None:
                rows.append({"item": item.item, "weight": item.weight, "verdict": False, "score": 0.0, "reply": None})
            else:
                r = next(results)
                rows.append(
                    {"item": item.item, "weight": item.weight, "verdict": r.verdict, "score": r.score, "reply": r.reply}
                )
        total = sum(r["weight"] for r in rows)
        score = sum(r["weight"] * r["score"] for r in rows) / total if total else None
        reached = groups[k] is not None
        turns.append({"turn": k, "reached": reached, "score": score, "items": rows})
    scored = [t["score"] for t in turns if t["score"] is not None]
    reward = sum(scored) / len(scored) if scored else 0.0
    info = {
        "turns": turns,
        "judged": len(prompts),
        "unparseable": sum(1 for t in turns for r in t["items"] if r["verdict"] is None),
    }
    return float(reward), info
