"""Can the selected tasks be completed within the configured budgets? Computed from the ground truth.

A run whose budgets make a task impossible can only ever give it R = 0: a group of such trajectories has no
reward variance and teaches nothing, and an evaluation reports a failure the policy never had a chance to
avoid. `envace train`, `envace eval`, `envace sft` and `envace pipeline` therefore compute, before any model
loads, the fraction of their selected tasks that a policy *could* complete, print it, and refuse to start
below ``min_solvable_fraction`` with a message that names the option to raise (`require_solvable`).

What "can be completed" means (per task, from the suite's reference solution ``Suite.ground_truth(task)``:
the calls of each user turn). ACT messages are counted as `envace_gym.envs.tool_use.ToolUseEnv` counts them,
with BFCL's semantics (the limit is per user turn; a turn that uses them all up is force-quit, R = 0):

1. A user turn with calls needs at least one calling message and one closing message without a call, so it
   takes ``m + 1`` ACT messages when its calls are written in ``m`` messages; a turn without calls takes 1.
   The env truncates a turn whose ``max_steps_per_turn``-th message still holds a call (or is malformed), so
   ``m + 1 <= max_steps_per_turn`` is required.
2. Each calling message must fit ``max_new_tokens`` (the ACT generation cap): the calls are written in the
   Hermes format the prompt teaches (`envace_gym.parsing.format_tool_calls`) and counted with the policy's
   tokenizer, without the end-of-message token (a message cut right after its last ``</tool_call>`` still
   parses). ``m`` is the fewest messages into which the turn's calls split, in order, so that each fits
   (greedy packing, which is optimal for an ordered split); a single call longer than the cap makes the
   task impossible.
3. Single-step tasks (BFCL single-turn) have one message holding every call.
4. With ``max_episode_tokens`` set (BFCL multi-turn only), the real-execution demonstration with every
   call of a turn in one message (`agents.training.demonstrations.demonstration_for_task`, ``calls_per_message=
   "all"``: the fewest template tokens) must fit it, final closing message included (the env does not check
   the budget on the step that ends the episode, so this is a few tokens stricter than the env). Rehearsed
   tool outputs may be longer or shorter than the real ones, and a policy writing one call per message
   uses more template tokens; this uses the real outputs and the fewest messages.

The report also gives the fraction under one call per ACT message (what `agents.training.demonstrations` teaches by
default, so what an SFT-warm-started policy does): a turn with n calls then needs n + 1 messages.

``max_steps_per_turn`` counts every ACT message of a turn, the closing one included, as
`envace_gym.envs.tool_use.ToolUseEnv` does. BFCL v4's multi-turn harness (bfcl-eval
``model_handler/base_handler.py``) counts calling messages only and force-quits the turn (failing the entry)
after ``MAXIMUM_STEP_LIMIT = 20`` of them, so BFCL's limit is ``max_steps_per_turn = 21`` here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from envace_gym.parsing import format_tool_calls
from envace_gym.types import Task, ToolCall

__all__ = [
    "TaskNeeds",
    "BudgetReport",
    "BudgetError",
    "task_needs",
    "budget_report",
    "require_solvable",
    "check_task_budgets",
]

BUDGET_KINDS = ("max_steps_per_turn", "max_new_tokens", "max_episode_tokens")


class BudgetError(ValueError):
    """Too few of the selected tasks can be completed within the configured budgets (the message says which
    option to raise)."""


@dataclass
class TaskNeeds:
    """What one task's reference solution needs, enough to test any (steps, tokens) budget.

    Attributes:
        task_id: the task.
        turns: per user turn, the Hermes token count of each ground-truth call alone, ``(turns, calls)``.
        group_tokens: ``group_tokens(turn, i, j)``: tokens of the message holding calls ``i..j-1`` of a turn.
        single_step: the whole task is one message (BFCL single-turn).
        demo_tokens: tokens of the real-execution demonstration with one message per turn's calls (None:
            not computed, or not available for this suite).
    """

    task_id: str
    turns: list[list[int]]
    group_tokens: Callable[[int, int, int], int]
    single_step: bool = False
    demo_tokens: int | None = None

    @property
    def min_new_tokens(self) -> int:
        """The smallest ``max_new_tokens`` that lets every call be written (one call per message)."""
        if self.single_step:
            return self.group_tokens(0, 0, len(self.turns[0])) if self.turns and self.turns[0] else 0
        return max((t for turn in self.turns for t in turn), default=0)

    def messages_needed(self, turn: int, max_new_tokens: int) -> int | None:
        """Fewest calling messages turn `turn` splits into under `max_new_tokens` (None: a call never fits)."""
        calls = self.turns[turn]
        if not calls:
            return 0
        if self.single_step:
            return 1 if self.group_tokens(turn, 0, len(calls)) <= max_new_tokens else None
        count, start = 0, 0
        while start < len(calls):
            end = start + 1
            if self.group_tokens(turn, start, end) > max_new_tokens:
                return None
            while end < len(calls) and self.group_tokens(turn, start, end + 1) <= max_new_tokens:
                end += 1
            count += 1
            start = end
        return count

    def steps_needed(self, max_new_tokens: int, one_call_per_message: bool = False) -> int | None:
        """Most ACT messages any user turn needs under `max_new_tokens` (None: impossible at that cap)."""
        if self.single_step:
            return 1 if self.messages_needed(0, max_new_tokens) is not None else None
        worst = 1
        for t, calls in enumerate(self.turns):
            m = self.messages_needed(t, max_new_tokens)
            if m is None:
                return None
            if one_call_per_message:
                m = len(calls)
            worst = max(worst, m + 1 if calls else 1)
        return worst

    def blocked_by(self, budgets: dict[str, int | None], one_call_per_message: bool = False) -> str | None:
        """The first budget (a `BUDGET_KINDS` name) that makes the task impossible, or None if it is solvable."""
        # these two budgets are always set (None only ever stands for an unlimited max_episode_tokens)
        steps = self.steps_needed(int(cast(int, budgets["max_new_tokens"])), one_call_per_message)
        if steps is None:
            return "max_new_tokens"
        if steps > int(cast(int, budgets["max_steps_per_turn"])):
            return "max_steps_per_turn"
        cap = budgets.get("max_episode_tokens")
        if cap is not None and self.demo_tokens is not None and self.demo_tokens > cap:
            return "max_episode_tokens"
        return None


@dataclass
class BudgetReport:
    """How many of the selected tasks the budgets leave completable.

    Attributes:
        budgets: the budgets tested, keyed by `BUDGET_KINDS` name (``max_episode_tokens`` may be None).
        num_tasks: selected tasks.
        solvable: tasks that can be completed (fewest messages the token cap allows per turn).
        solvable_one_call_per_message: tasks completable with one call per ACT message.
        blocked_by: count of unsolvable tasks per budget that blocks them.
        no_reference: tasks without a reference solution (counted as solvable: nothing says otherwise).
        needed: per budget, the smallest value that reaches the threshold with the other budgets as they are
            (None when no value does, e.g. a step limit cannot fix a call longer than the token cap).
        blocked_ids: up to 5 unsolvable task ids per budget, for the message.
    """

    budgets: dict[str, int | None]
    num_tasks: int
    solvable: int
    solvable_one_call_per_message: int
    blocked_by: dict[str, int] = field(default_factory=dict)
    no_reference: int = 0
    needed: dict[str, int | None] = field(default_factory=dict)
    blocked_ids: dict[str, list[str]] = field(default_factory=dict)

    @property
    def fraction(self) -> float:
        """solvable / num_tasks (1.0 for no task)."""
        return self.solvable / self.num_tasks if self.num_tasks else 1.0

    @property
    def fraction_one_call_per_message(self) -> float:
        """solvable_one_call_per_message / num_tasks."""
        return self.solvable_one_call_per_message / self.num_tasks if self.num_tasks else 1.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-compatible dict (fractions included)."""
        d = dict(self.__dict__)
        d.update(fraction=self.fraction, fraction_one_call_per_message=self.fraction_one_call_per_message)
        return d

    def summary(self, names: dict[str, str] | None = None) -> str:
        """One line: the fraction, the budgets (under the caller's option names) and the one-call fraction."""
        names = names or {}
        shown = ", ".join(f"{names.get(k, k)}={v}" for k, v in self.budgets.items() if v is not None)
        line = (
            f"{self.solvable}/{self.num_tasks} ({100 * self.fraction:.1f}%) of the selected tasks can be "
            f"completed within {shown}; with one call per ACT message (as the SFT demonstrations write them) "
            f"{self.solvable_one_call_per_message}/{self.num_tasks} ({100 * self.fraction_one_call_per_message:.1f}%)"
        )
        if self.no_reference:
            line += f"; {self.no_reference} without a reference solution are counted as solvable"
        return line


def _tool_message_tokens(tokenizer: Any) -> Callable[[Sequence[ToolCall]], int]:
    """The token length of a message of these calls, remembered by the calls' repr: a stream of generated
    tasks repeats the same calls thousands of times (12,000 lab tasks: ~80k groups of calls, a few thousand
    distinct), and formatting and encoding each again was most of a trainer's start."""
    memo: dict[str, int] = {}

    def count(calls: Sequence[ToolCall]) -> int:
        key = repr([(c.name, c.arguments, c.id) for c in calls])
        if key not in memo:
            memo[key] = len(tokenizer.encode(format_tool_calls(list(calls), "hermes"), add_special_tokens=False))
        return memo[key]

    return count


def task_needs(
    task: Task,
    reference: list[list[ToolCall]],
    tokenizer: Any,
    count: Callable[[Sequence[ToolCall]], int] | None = None,
) -> TaskNeeds:
    """`TaskNeeds` of `task` from its reference solution (turns × calls), counted with `tokenizer` (or with
    `count`, a `_tool_message_tokens` counter shared by many tasks)."""
    count = count or _tool_message_tokens(tokenizer)
    memo: dict[tuple[int, int, int], int] = {}

    def group_tokens(turn: int, i: int, j: int) -> int:
        key = (turn, i, j)
        if key not in memo:
            memo[key] = count(reference[turn][i:j])
        return memo[key]

    turns = [[group_tokens(t, i, i + 1) for i in range(len(calls))] for t, calls in enumerate(reference)]
    return TaskNeeds(task.id, turns, group_tokens, single_step=bool(task.metadata.get("single_step")))


def _demo_tokens(tasks: Sequence[Task], tokenizer: Any, suite: str) -> dict[str, int]:
    """Token length of each multi-step task's real-execution demonstration (all of a turn's calls in one
    message); empty for a suite without reference solutions."""
    from agents.training.demonstrations import demonstration_env, demonstration_for_task
    from envace_gym.suites import make_suite

    multi = [t for t in tasks if not t.metadata.get("single_step")]
    if not multi or not callable(getattr(make_suite(suite), "ground_truth", None)):
        return {}
    env = demonstration_env(tokenizer, suite, tasks=multi)
    out = {}
    for t in multi:
        try:
            traj, _ = demonstration_for_task(env, t, "all")
        except (RuntimeError, ValueError):
            continue
        out[t.id] = len(traj.token_ids)
    env.close()
    return out


def budget_report(
    tasks: Sequence[Task],
    suite: Any,
    tokenizer: Any,
    *,
    max_steps_per_turn: int,
    max_new_tokens: int,
    max_episode_tokens: int | None = None,
    min_fraction: float = 0.9,
) -> BudgetReport:
    """The `BudgetReport` of `tasks` under the budgets (see the module docstring for the rules).

    Args:
        tasks: the selected tasks.
        suite: their `envace_gym.suites.Suite` object; its optional ``ground_truth(task)`` gives the reference
            solution (turns × calls, or None). A suite without it leaves every task counted as solvable.
        tokenizer: the policy's tokenizer (a Transformers tokenizer: ``encode``).
        max_steps_per_turn: ACT messages per user turn (>= 1).
        max_new_tokens: tokens per ACT message (>= 1).
        max_episode_tokens: token budget per episode, or None for none.
        min_fraction: the threshold `needed` is computed for.

    Returns:
        `BudgetReport`.
    """
    budgets = {
        "max_steps_per_turn": int(max_steps_per_turn),
        "max_new_tokens": int(max_new_tokens),
        "max_episode_tokens": max_episode_tokens,
    }
    reference = getattr(suite, "ground_truth", None)
    needs: list[TaskNeeds] = []
    no_reference = 0
    count_tokens = _tool_message_tokens(tokenizer)
    for t in tasks:
        ref = reference(t) if reference is not None else None
        if ref is None:
            no_reference += 1
            continue
        needs.append(task_needs(t, ref, tokenizer, count_tokens))
    if max_episode_tokens is not None and needs:
        lengths = _demo_tokens(tasks, tokenizer, getattr(suite, "name", ""))
        for n in needs:
            n.demo_tokens = lengths.get(n.task_id)

    def count(b: dict[str, int | None], one: bool = False) -> int:
        return no_reference + sum(n.blocked_by(b, one) is None for n in needs)

    blocked: dict[str, int] = {}
    blocked_ids: dict[str, list[str]] = {}
    for n in needs:
        why = n.blocked_by(budgets)
        if why is not None:
            blocked[why] = blocked.get(why, 0) + 1
            blocked_ids.setdefault(why, [])
            if len(blocked_ids[why]) < 5:
                blocked_ids[why].append(n.task_id)
    report = BudgetReport(
        budgets, len(tasks), count(budgets), count(budgets, True), blocked, no_reference, blocked_ids=blocked_ids
    )

    def enough(b: dict[str, int | None]) -> bool:  # the same comparison as require_solvable
        return (count(b) / len(tasks) if tasks else 1.0) >= min_fraction

    # each count is monotone in each budget, so the smallest sufficient value is a binary search away
    upper = {
        "max_new_tokens": max(
            (n.group_tokens(t, 0, len(c)) for n in needs for t, c in enumerate(n.turns) if c), default=1
        ),
        "max_steps_per_turn": max((len(c) + 1 for n in needs for c in n.turns), default=1),
        "max_episode_tokens": max((n.demo_tokens for n in needs if n.demo_tokens is not None), default=1),
    }
    for kind in BUDGET_KINDS:
        if kind == "max_episode_tokens" and max_episode_tokens is None:
            continue
        lo, hi = 1, upper[kind]
        if not enough({**budgets, kind: hi}):
            report.needed[kind] = None
            continue
        while lo < hi:
            mid = (lo + hi) // 2
            if enough({**budgets, kind: mid}):
                hi = mid
            else:
                lo = mid + 1
        report.needed[kind] = lo
    return report


def require_solvable(
    report: BudgetReport,
    min_fraction: float,
    *,
    command: str,
    names: dict[str, str] | None = None,
    threshold_name: str = "--min-solvable-fraction",
    log: Callable[[str], Any] | None = print,
) -> None:
    """Print the report's summary line and raise `BudgetError` when its fraction is below `min_fraction`.

    Args:
        report: from `budget_report`.
        min_fraction: the threshold in [0, 1].
        command: what is starting (``"envace train"``), for the messages.
        names: the caller's option name of each budget (``{"max_steps_per_turn": "--grpo.max-steps-per-turn"}``);
            a budget not in it is shown as ``--max-steps-per-turn``.
        threshold_name: the caller's option name of the threshold.
        log: where the summary line goes (None: nowhere).

    Raises:
        BudgetError: ``report.fraction < min_fraction``; the message names each budget that blocks tasks,
            the value that would reach the threshold, and the threshold option.
    """
    names = {k: (names or {}).get(k, "--" + k.replace("_", "-")) for k in BUDGET_KINDS}
    if log is not None:
        log(f"[budget] {command}: {report.summary(names)}")
    if report.fraction >= min_fraction:
        return
    parts = []
    for kind, n in sorted(report.blocked_by.items(), key=lambda kv: -kv[1]):
        current = report.budgets[kind]
        need = report.needed.get(kind)
        fix = (
            f"raise {names[kind]} to {need} or more"
            if need is not None
            else f"raising {names[kind]} alone is not enough"
        )
        parts.append(
            f"{n} task(s) need more than {names[kind]}={current} allows ({fix}; e.g. "
            f"{', '.join(report.blocked_ids.get(kind, []))})"
        )
    raise BudgetError(
        f"{command}: only {100 * report.fraction:.1f}% of the {report.num_tasks} selected tasks can be completed "
        "within "
        f"the budgets, below {threshold_name}={min_fraction}; their trajectories could only ever earn R = 0. "
        + "; ".join(parts)
        + f". Or lower {threshold_name} to start anyway."
    )


_REPORTS: dict[tuple, BudgetReport] = {}


def _tokenizer_key(tokenizer: Any) -> tuple:
    """What a token count depends on: the tokenizer's class and its whole definition (vocabulary, merges,
    normalizer, pre-tokenizer, added tokens: the fast tokenizer's JSON; else the vocabulary) and the chat
    template (demonstration lengths are rendered with it)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    definition = backend.to_str() if backend is not None else repr(sorted(tokenizer.get_vocab().items()))
    return (
        type(tokenizer).__name__,
        hashlib.sha256(definition.encode()).hexdigest(),
        getattr(tokenizer, "chat_template", None),
    )


def check_task_budgets(
    tasks,
    suite_name: str,
    tokenizer,
    *,
    max_steps_per_turn: int,
    max_new_tokens: int,
    max_episode_tokens: int | None,
    min_fraction: float,
    command: str,
    names: dict[str, str] | None = None,
    threshold_name: str = "--min-solvable-fraction",
    log=print,
):
    """`agents.training.budgets.budget_report` of `tasks` then `agents.training.budgets.require_solvable`; returns the
    report.

    Raises:
        agents.training.budgets.BudgetError: fewer than `min_fraction` of the tasks can be completed (the message names
            the option to raise).
    """
    from envace_gym.suites import make_suite

    # a pipeline or an ablation checks the same tasks with the same tokenizer and budgets once per stage;
    # counting 12,000 reference solutions takes ~10 s, so the report is kept per process. The suite is keyed by
    # its class and settings too: a name can be registered again with other settings (another LabConfig).
    suite = make_suite(suite_name)
    key = (
        suite_name,
        type(suite).__qualname__,
        repr(getattr(suite, "config", None)),
        tuple(t.id for t in tasks),
        _tokenizer_key(tokenizer),
        max_steps_per_turn,
        max_new_tokens,
        max_episode_tokens,
        min_fraction,
    )
    report = _REPORTS.get(key)
    if report is None:
        report = budget_report(
            tasks,
            suite,
            tokenizer,
            max_steps_per_turn=max_steps_per_turn,
            max_new_tokens=max_new_tokens,
            max_episode_tokens=max_episode_tokens,
            min_fraction=min_fraction,
        )
        if len(_REPORTS) >= 16:
            _REPORTS.pop(next(iter(_REPORTS)))
        _REPORTS[key] = report
    require_solvable(report, min_fraction, command=command, names=names, threshold_name=threshold_name, log=log)
    return report
