"""Test-time rehearsal on the hidden-rules lab: does a small policy act better after reading its own rehearsals,
once it has been trained to read them, and which control locates the difference.

    python -m benchmarks.experiments.lab_ttr                                            # 3 seeds (defaults below)
    python -m benchmarks.experiments.lab_ttr --warm runs/lab_ablations/warm_start/sft   # reuse a warm start
    python -m benchmarks.experiments.lab_ttr --recipe configs/recipes/lab-blind.yaml    # the blind variant

The blind variant (suite ``lab-blind``, `benchmarks.lab.hidden`) offers no look tool, so whether a move breaks
an item is known only to a learned rule or to a rehearsal of the move; in the default world the committed run can
always look first, so a memory carries nothing it cannot get in time. A run on it is its own results kind
(`result_kind`).

Protocol (fixed before any result was seen, except the two SFT runs from scratch of step 2, added after the
continuations had been measured, for the reason given there; every setting is reported):

1. **Memory demonstrations** (`agents.training.demonstrations.record_memory_demonstrations`): for N = 1, 2, 3 the warm
   start rehearses ``--memory-tasks`` train tasks per family N times each (parallel attempts, T = 1, the whole
   turn, failed attempts kept); its trace memory is inserted before the reference execution on the real backend.
   Only the sets the chosen ``--policies`` train on are recorded (`memory_sources`).
2. **Two continuations of the warm start per seed**, the same SFT budget (``--sft-steps`` at the recipe's SFT lr
   and batch) on the same train tasks: ``memory_sft`` trains on the memory demonstrations and the plain
   demonstrations of those tasks; ``plain_sft`` (the control for "more SFT") on the plain ones only.
   **Two SFT runs from scratch per seed** (the recipe's own SFT stage, its budget, schedule and train stream, at
   that seed, ``max_seq_len`` at least 1024 so that a memory fits): ``memory_scratch`` has the memory
   demonstrations added to its train demonstrations, so the policy learns to read a memory from its first step
   beside everything else; ``plain_scratch`` (its control) is the same stage without them (on ``lab.yaml``, whose
   demonstrations all fit 512 tokens, the recipe's warm start at that seed, weight for weight). Why both: the
   continuations cost plain (N = 0) success (a continuation restarts a trained model at the recipe's peak lr on a
   few hundred tasks), while training from scratch keeps the whole train stream and schedule.
   ``real_memory_scratch`` (added after the blind variant's table had been read, for the reason given here) is
   ``memory_scratch`` with memories whose attempts were answered by the real backend
   (``record_memory_demonstrations(attempt_outputs="real")``, the same tasks, attempts and seeds): a warm start
   that foresees almost no break rehearses memories that almost never hold one, so ``memory_scratch`` is never
   shown what a break in a memory means; this policy is, and asks only whether reading can be learned at all.
   ``real_memory_restated_scratch`` (added after ``real_memory_scratch``'s transcripts had been read: after a
   memory the policy often moved an item the request did not name) trains on the same real-output memories
   with the request restated after each memory (``restate_request``), and is evaluated that way in every row:
   the request then sits next to the act, as it does without a memory. Their control at N = 0 is
   ``plain_scratch``.
   ``memory_restated_scratch`` (added after the blind outcomes run with 660 memory tasks had been read: with true
   outcomes and the restated layout, reading was learned in part) is ``memory_scratch`` in that layout: the
   method's own memories, the warm start's rehearsed outputs, with the request restated after each memory.
3. **Evaluation on the same test tasks** (greedy commits on the real backend, ``--limit`` per family): every
   policy (``--policies``, the warm start always) at N = 0 and at N = 1, 2, 3 parallel attempts of its own
   rehearsal (trace memory); for each memory-trained policy at N = 2 also three controls: the attempts' outputs
   from a constant (null rehearser: the memory then carries calls, not outcomes), from a copy of the real backend
   (oracle: diagnosis only), and another task's memory (``--memory-from``: if it ties, the memory is ignored);
   for every policy past the warm start at N = 2 also sequential attempts and the warm start as the rehearser (the
   paper's base-model rehearser: the policy acts, the pre-RL model imagines the outputs; for a continuation that
   is the model it continued, for a run from scratch the recipe's warm start, trained without memories).

``--memory outcomes`` (added after the blind variant's restated policy had been read: attempts that stopped early
leave a ``reply: Done.`` line, and after a memory the act often stopped after one call of a three-call task) runs
the same protocol with every memory, in training and in evaluation, laid out as the trace's call lines only
(`wrappers.TestTimeRehearsal`'s ``memory="outcomes"``); its results are their own kind (`result_kind`).

``--rl-steps S`` (the issue's "trained without and with steps 3-4" in one run) continues every policy but the warm
start by S role-wise GRPO steps at the recipe's GRPO settings and the run's seed (``<policy>_rl``): a
memory-trained policy's rollouts rehearse first (``--rl-n`` attempts per user turn and the memory in the layout it
was trained on: `agents.rollout.collect_rollouts` with ``rehearsal_n``, the committed reward also training the
attempts), a plain one's do not. Each continuation is evaluated like the others, with its own start as the pre-RL
rehearser; what memory training costs at N = 0 is also reported between the continuations. Its results are their
own kind (`result_kind`). (At equal steps a rehearsing rollout generates more tokens: equal-token comparisons are
`benchmarks.experiments.lab_rehearsal_rl`'s.)

What memory training costs at N = 0: each memory-trained policy at N = 0 paired with its plain control at N = 0
(``memory_sft`` with ``plain_sft``, every ``*memory*_scratch`` with ``plain_scratch``; `PLAIN_CONTROL`), the same
statistics.

Each row is paired by seed and task with the same policy at N = 0: the mean difference with its 95% t-interval
over seeds, tasks gained and lost summed over seeds, and per seed an exact McNemar test on that seed's own tasks
(the seeds it resolves up or down are counted). Each row also reports the tokens generated per task for rehearsal
(every attempt's ACT and REHEARSE tokens, on top of the committed episode's), so a gain can be weighed against its
compute. Each row with rehearsal also splits its tasks by how many attempts made the reference's calls (all, some,
none: `memory_hits`, `memory_use`; added after the blind outcomes run had been read), each part against N=0 on the
same tasks: whether the memory is read; and splits by task family (`by_family`; the table shows N=2 and the
oracle): where rehearsal helps or hurts. Then the paper's claims and the controls (`TTR_CLAIMS`), each a paired
difference between two settings of the same policy with its verdict. Stages resume (`agents.pipeline.StageRunner`).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.experiments.paired import (
    WORLD_INFIXES,
    episodes,
    load_recipe,
    paired_comparison,
    rehearsal_tokens_per_task,
    start_recipe_run,
    world_kind,
)
from benchmarks.experiments.result_tables import ttr_claims
from benchmarks.experiments.result_tables import ttr_table as table
from benchmarks.experiments.workers import add_worker_options, check_worker_options, run_workers
from benchmarks.provenance import provenance

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "configs" / "recipes" / "lab.yaml"
POLICIES = (
    "warm",
    "plain_sft",
    "memory_sft",
    "plain_scratch",
    "memory_scratch",
    "real_memory_scratch",
    "real_memory_restated_scratch",
    "memory_restated_scratch",
)
PLAIN_CONTROL = {
    "memory_sft": "plain_sft",
    "memory_scratch": "plain_scratch",
    "real_memory_scratch": "plain_scratch",
    "real_memory_restated_scratch": "plain_scratch",
    "memory_restated_scratch": "plain_scratch",
}
"""Each memory-trained policy's control at N=0: the same training without the memory demonstrations."""
DIAGNOSTIC_POLICIES = ("real_memory_scratch", "real_memory_restated_scratch")
"""Policies trained on memories of true outcomes (diagnosis: can reading be learned at all)."""
NAMED_ONLY = (*DIAGNOSTIC_POLICIES, "memory_restated_scratch")
"""Policies run only when named in ``--policies``: the diagnostic ones, and ``memory_restated_scratch`` (the
method's own rehearsed memories in the restated layout), which the default run leaves out to keep its budget."""
MEMORY_SOURCES: dict[str, tuple[str, bool]] = {
    "memory_sft": ("rehearsed", False),
    "memory_scratch": ("rehearsed", False),
    "real_memory_scratch": ("real", False),
    "real_memory_restated_scratch": ("real", True),
    "memory_restated_scratch": ("rehearsed", True),
}
"""Each memory-trained policy's memory demonstrations: who answered the attempts' calls
(``record_memory_demonstrations(attempt_outputs=...)``) and whether the request follows the memory again
(``restate_request``, which its evaluations then play too)."""


def memory_sources(policies: list[str]) -> set[tuple[str, bool]]:
    """The memory demonstration sets (`MEMORY_SOURCES` entries) that `policies` train on: only these are recorded,
    since at a large ``--memory-tasks`` each takes minutes."""
    return {MEMORY_SOURCES[p] for p in policies if p in MEMORY_SOURCES}


def memory_folder(attempt_outputs: str, restate_request: bool) -> str:
    """The run folder's subfolder of one set of memory demonstrations (`MEMORY_SOURCES`)."""
    return (
        "memory_demos"
        + ("" if attempt_outputs == "rehearsed" else f"_{attempt_outputs}")
        + ("_restated" if restate_request else "")
    )


RL_SUFFIX = "_rl"
"""A policy's RL continuation (``--rl-steps``) is named ``<policy>_rl``."""


def base_policy(policy: str) -> str:
    """The SFT policy an RL continuation (``<policy>_rl``) started from; a policy without RL is its own."""
    return policy.removesuffix(RL_SUFFIX)


def evaluated_policies(policies: list[str], rl_steps: int) -> list[str]:
    """Every policy a run evaluates, in page order: each of `policies`, followed by its RL continuation when
    ``rl_steps`` > 0 (not the warm start's: it is the start of every policy from scratch only by recipe)."""
    return [q for p in policies for q in (p, p + RL_SUFFIX) if q == p or (rl_steps and p != "warm")]


MEMORIES = ("trace", "outcomes")
"""``--memory``: the layout of every memory of a run (`wrappers.TestTimeRehearsal`'s ``memory``), in its memory
demonstrations and in every evaluation with rehearsal; ``outcomes`` (the trace without the attempts' closing
replies) writes results of its own kind."""


CONTROLS: dict[str, dict[str, Any]] = {
    "null outputs": {"attempt_outputs": "null"},
    "real outputs (oracle)": {"attempt_outputs": "real"},
    "other task's memory": {},  # memory_from: the same policy's own N=2 evaluation
}
CONTROL_N = 2
MEMORY_TASKS = 40
"""The default ``--memory-tasks``: a run at another value is its own results kind (`result_kind`)."""


def result_kind(suite: str, memory_tasks: int, memory: str = "trace", rl_steps: int = 0) -> str:
    """The ``kind`` of a run's ``results.json``: ``lab_ttr`` with the recipe's world
    (`benchmarks.experiments.paired.world_kind`), ``_memory_tasks`` when ``--memory-tasks`` is not
    `MEMORY_TASKS`, ``_outcomes`` for ``--memory outcomes`` and ``_rl`` with ``--rl-steps`` (so none ever replaces
    the default run's section).

    Raises:
        ValueError: a suite without a kind (the lab's worlds have one each).
    """
    return (
        world_kind("lab_ttr", suite)
        + ("" if memory_tasks == MEMORY_TASKS else "_memory_tasks")
        + ("" if memory == "trace" else f"_{memory}")
        + (RL_SUFFIX if rl_steps else "")
    )


VARIANTS: dict[str, dict[str, Any]] = {
    "sequential": {"rehearsal_mode": "sequential"},
    "warm-start rehearser": {},  # rehearser_model: the warm start (the paper's base-model rehearser)
}
"""Settings at N=2 for every policy trained past the warm start (for the warm start itself they are its own rows);
an RL continuation's rehearser row has its own start rehearse instead (`PRE_RL_REHEARSER`)."""
PRE_RL_REHEARSER = "pre-RL rehearser (its SFT start)"
"""An RL continuation's (``--rl-steps``) base-rehearser row: the policy acts, the model RL started from rehearses
(the paper's base-model rehearser control)."""


_AT = f"N={CONTROL_N}"  # the N of the variants and controls
TTR_CLAIMS: tuple[tuple[str, str, str, tuple[str, ...], int], ...] = (
    (
        "Rehearsing twice in parallel before the committed run beats acting without rehearsal",
        "paper: τ² 36.7% without rehearsal → 40.9% with N=2 parallel",
        "N=2",
        ("N=0",),
        1,
    ),
    ("Two parallel attempts beat one", "paper: N=2 parallel is the best setting reported", "N=2", ("N=1",), 1),
    (
        "Parallel attempts beat sequential ones",
        "paper: N=2 parallel 40.9%, sequential 38.5%",
        _AT,
        (f"{_AT}, sequential",),
        1,
    ),
    ("A third attempt regresses", "paper: N=3 below N=2, attributed to the longer context", "N=3", ("N=2",), -1),
    (
        "The trained rehearser is what helps: a base-model rehearser gives only a marginal gain",
        "paper: a base-model rehearser +0.1 points over no rehearsal, the trained one +4.2; here the base model is the "
        "warm start, or for an RL continuation its own SFT start",
        _AT,
        (f"{_AT}, warm-start rehearser", f"{_AT}, {PRE_RL_REHEARSER}"),
        1,
    ),
    (
        "The memory is read: another task's memory does worse",
        "control: if it ties, the policy ignores its memory",
        _AT,
        (f"{_AT}, other task's memory",),
        1,
    ),
    (
        "The rehearsed outputs matter: null outputs in the memory do worse",
        "control: if it ties, what helps or hurts is the attempts' calls, not the world model's outputs",
        _AT,
        (f"{_AT}, null outputs",),
        1,
    ),
    (
        "A perfect world model would help: the real backend's outputs in the memory do better",
        "diagnosis: if even these do not help, reading the memory is the problem, not the world model",
        f"{_AT}, real outputs (oracle)",
        (_AT,),
        1,
    ),
)
"""The paper's test-time claims and their controls as paired comparisons within one policy: (claim, its source,
the setting compared, the settings it is compared with (the first one measured), the predicted sign of the
difference: 1 the compared setting ahead, -1 behind). `summarize` writes each measured one under ``claims``."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument(
        "--recipe", default=str(RECIPE), help="the envace pipeline YAML (model, suite, SFT and eval settings)"
    )
    ap.add_argument(
        "--out", default="runs/lab_ttr", help="folder of every stage, results.json and the plot (default: runs/lab_ttr)"
    )
    ap.add_argument("--warm", default=None, help="an SFT run folder to start from (default: train the recipe's in OUT)")
    ap.add_argument("--seeds", type=int, default=3, help="seeds 0..S-1 (SFT batch order, attempt sampling; default 3)")
    ap.add_argument(
        "--n", type=int, nargs="+", default=[1, 2, 3], help="attempts per user turn to evaluate (default: 1 2 3)"
    )
    ap.add_argument(
        "--memory-tasks",
        type=int,
        default=MEMORY_TASKS,
        help=f"train tasks per family and per N with a memory (default {MEMORY_TASKS}), at most a third of a family's "
        f"train split (lab-stated: 32; a value other than {MEMORY_TASKS} writes results of its own kind, a section "
        "of its own on the results page)",
    )
    ap.add_argument(
        "--memory",
        choices=MEMORIES,
        default="trace",
        help="the memory's layout, in the memory demonstrations and every rehearsal evaluation: the trace, or its "
        "call lines only (outcomes: no reply lines; results of their own kind, a section of their own)",
    )
    ap.add_argument(
        "--sft-steps",
        type=int,
        default=150,
        help="SFT steps of each continuation (the runs from scratch take the recipe's sft.max_steps)",
    )
    ap.add_argument("--limit", type=int, default=100, help="test tasks per family (default 100)")
    ap.add_argument(
        "--rl-steps",
        type=int,
        default=0,
        help="also continue every policy but the warm start by this many role-wise GRPO steps (the recipe's GRPO "
        "settings; a memory-trained policy's rollouts rehearse first: --rl-n attempts, its memory layout) and "
        "evaluate each continuation (<policy>_rl) like the others (0: none; results of their own kind)",
    )
    ap.add_argument(
        "--rl-n",
        type=int,
        default=None,
        help=f"rehearsal attempts per user turn in a memory-trained policy's RL rollouts (--rl-steps; default "
        f"{CONTROL_N})",
    )
    ap.add_argument(
        "--no-controls", action="store_true", help="skip the three controls and the sequential and rehearser rows"
    )
    ap.add_argument(
        "--policies",
        nargs="+",
        choices=POLICIES,
        default=[p for p in POLICIES if p not in NAMED_ONLY],
        metavar="POLICY",
        help=f"policies to train and evaluate, of {', '.join(POLICIES[1:])} (default: all but "
        f"{', '.join(NAMED_ONLY)}; a memory-trained one needs its plain control; the warm start is always "
        "evaluated)",
    )
    ap.add_argument("--threads", type=int, default=2, help="torch threads per process (default 2)")
    add_worker_options(
        ap,
        "train and evaluate the seeds in parallel (worker k takes the seeds s with s %% W == k) after the shared "
        "memory demonstrations and the warm start's N=0 evaluation",
    )
    args = ap.parse_args(argv)
    check_worker_options(ap, args)
    args.policies = [p for p in POLICIES if p == "warm" or p in args.policies]  # page order
    unpaired = [p for p, plain in PLAIN_CONTROL.items() if p in args.policies and plain not in args.policies]
    if unpaired:
        ap.error(f"{unpaired[0]} is compared with {PLAIN_CONTROL[unpaired[0]]} at N=0: add it to --policies")
    if args.seeds < 1 or args.memory_tasks < 1 or args.sft_steps < 1 or args.limit < 1 or (args.rl_n or 1) < 1:
        ap.error("--seeds, --memory-tasks, --sft-steps, --limit and --rl-n must be >= 1")
    if args.rl_steps < 0:
        ap.error("--rl-steps must be >= 0")
    if args.rl_steps and args.policies == ["warm"]:
        ap.error("--rl-steps continues the policies past the warm start: name at least one in --policies")
    if args.rl_n is not None and not args.rl_steps:
        ap.error("--rl-n sets the attempts of --rl-steps' rehearsing rollouts: give --rl-steps too")
    args.rl_n = args.rl_n or CONTROL_N
    if any(n < 1 for n in args.n):
        ap.error("--n values must be >= 1 (N = 0 is always evaluated)")
    if not args.no_controls and CONTROL_N not in args.n:
        ap.error(f"the controls are run at N={CONTROL_N}: include it in --n or pass --no-controls")
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what the workers and results.json repeat
    return args


def memory_task_pool(suite: Any, categories: list[str], memory_tasks: int) -> dict[str, list[Any]]:
    """Each family's train tasks, from which N = 1, 2, 3 take ``memory_tasks`` disjoint ones each.

    Raises:
        ValueError: a family with fewer than ``3 * memory_tasks`` train tasks (it would silently give fewer
            memories); checked before any stage runs.
    """
    train = {c: suite.tasks([c], "train") for c in categories}
    for c, tasks in train.items():
        if len(tasks) < 3 * memory_tasks:
            raise ValueError(
                f"--memory-tasks {memory_tasks} needs {3 * memory_tasks} train tasks per family (disjoint ones for "
                f"N = 1, 2, 3); {c} has {len(tasks)}: give at most {len(tasks) // 3}"
            )
    return train


compare = paired_comparison
"""Each setting against the same policy at N=0 (`benchmarks.experiments.paired.paired_comparison`)."""


MADE = ("all", "some", "none")
"""`memory_hits`' answer per task: every attempt, some attempt or no attempt made the reference's calls."""


def memory_hits(folder: Path, suite: Any, tasks: dict[str, Any]) -> dict[str, str]:
    """How many of each rehearsed task's attempts made the reference's calls (`MADE`), from an evaluation folder's
    ``transcripts.jsonl``.

    An attempt made them when its calls are exactly the reference's for the rehearsed user turn
    (`suite.ground_truth`: the same names, arguments and order; in the lab with look tools an extra look counts as
    another call); only a task's first rehearsal counts. Where every attempt made them, the memory shows only
    the right calls and their outcomes, so a policy that reads it can copy them: success there against N = 0 on
    the same tasks measures reading apart from the world model (`memory_use`). Tasks whose reference turn makes no
    call are left out (an attempt that made none, even a broken one, would count).

    Args:
        folder: an evaluation folder with rehearsal (`agents.evaluation.evaluate` with ``rehearsal_n``).
        suite: the suite of its tasks.
        tasks: task id -> `envace_gym.types.Task`, every task the folder evaluated.

    Returns:
        Task id -> ``"all"``, ``"some"`` or ``"none"``, for the tasks whose first rehearsal has attempts and whose
        reference turn has calls (a memory taken from another task has no attempts: an empty dict).

    Raises:
        KeyError: a transcript of a task not in `tasks`.
        ValueError: a rehearsal of a user turn the task's reference does not have.
    """
    from agents.training.run_folder import read_jsonl
    from envace_gym.types import ToolCall

    def key(calls: list[ToolCall]) -> list[tuple[str, str]]:
        return [(c.name, json.dumps(c.arguments, sort_keys=True)) for c in calls]

    hits = {}
    for record in read_jsonl(Path(folder) / "transcripts.jsonl"):
        rehearsals = record.get("rehearsals") or []
        if not rehearsals or not rehearsals[0].get("attempts"):
            continue
        turns = suite.ground_truth(tasks[record["task_id"]])
        turn = int(rehearsals[0].get("turn", 0))
        if not 0 <= turn < len(turns):
            raise ValueError(f"{record['task_id']}: rehearsal of user turn {turn}, its reference has {len(turns)}")
        reference = key(turns[turn])
        if not reference:
            continue
        made = [
            key([ToolCall.from_openai(c) for m in attempt["messages"] for c in m.get("tool_calls") or []]) == reference
            for attempt in rehearsals[0]["attempts"]
        ]
        hits[record["task_id"]] = "all" if all(made) else "some" if any(made) else "none"
    return hits


def memory_use(
    rows: list[dict[str, float]], references: list[dict[str, float]], hits: list[dict[str, str]]
) -> dict[str, Any] | None:
    """Success with a memory on the rehearsed tasks where every attempt, some attempt or none made the reference's
    calls (`memory_hits`), each part paired by seed with N = 0 on the same tasks (`paired_comparison`).

    Where every attempt made them, a policy that reads its memory can copy them; with true outcomes in the memory
    (the oracle row) nothing there argues against them, so a loss against N = 0 says the memory disturbs acting
    whatever it shows. (With imagined outcomes a reader may rightly avoid a call its world model shows failing.)

    Args:
        rows, references: per seed, task id -> reward with rehearsal and at N = 0.
        hits: per seed, `memory_hits` of the rehearsal's folder.

    Returns:
        Per part of `MADE`: ``share`` (per seed, its tasks over the rehearsed tasks), ``tasks`` (summed over seeds)
        and `paired_comparison`'s fields, absent where a seed has no such task; None when no task of some seed was
        rehearsed with attempts (a memory taken from another task).
    """
    if any(not h for h in hits):
        return None
    out: dict[str, Any] = {}
    for part in MADE:
        subsets = [[t for t, made in h.items() if made == part] for h in hits]
        share = [len(subset) / len(h) for subset, h in zip(subsets, hits)]
        out[part] = {"share": share, "tasks": sum(len(subset) for subset in subsets)}
        if all(subsets):
            out[part] |= compare(
                [{t: row[t] for t in subset} for row, subset in zip(rows, subsets)],
                [{t: ref[t] for t in subset} for ref, subset in zip(references, subsets)],
            )
    return out


def run(args: argparse.Namespace, log=print) -> dict[str, Any]:
    """Run (or resume) every stage; return the results (also written to ``<out>/results.json`` after each seed)."""
    import shlex

    from agents.config import replace_fields
    from agents.pipeline import latest_model, sft_task_ids, stage_ignores, stage_settings
    from agents.policy import load_policy
    from agents.training.demonstrations import record_memory_demonstrations
    from agents.training.sft import SFTConfig, SFTTrainer
    from benchmarks.experiments.arms import grpo_run
    from envace_gym.suites import make_suite

    out = Path(args.out)
    t_start = time.perf_counter()
    first = load_recipe(args.recipe, out, args.threads, args.limit)
    # checked before any stage (another suite is refused by start_recipe_run, also before any stage)
    train = (
        {}
        if first.suite not in WORLD_INFIXES
        else memory_task_pool(make_suite(first.suite), list(first.categories), args.memory_tasks)
    )
    recipe, models, stages, warm = start_recipe_run(args, log, suites=WORLD_INFIXES)

    # 1. memory demonstrations: disjoint train tasks per N, the same for every seed
    suite = make_suite(recipe.suite)
    categories = list(recipe.categories)
    per_n: dict[int, list[str]] = {}
    m = args.memory_tasks
    for k, n in enumerate((1, 2, 3)):
        per_n[n] = [t.id for c in categories for t in train[c][k * m : (k + 1) * m]]

    def memory_demos(attempt_outputs: str, restate: bool) -> dict[str, dict[str, Any]]:
        """One file per N of memory demonstrations of one source (`MEMORY_SOURCES`)."""
        folder = memory_folder(attempt_outputs, restate)
        files = {}
        for n, ids in per_n.items():
            files[str(n)] = memory_demo_file(out / folder / f"n{n}.jsonl", n, ids, attempt_outputs, restate)
        return files

    def memory_demo_file(path: Path, n: int, ids: list[str], attempt_outputs: str, restate: bool) -> dict[str, Any]:
        settings = {
            "warm": warm,
            "n": n,
            "task_ids": ids,
            "attempt_max_steps": recipe.eval.max_steps_per_turn,
            "max_new_tokens": recipe.eval.max_new_tokens,
            "memory_tokens": recipe.eval.memory_tokens,
            "mode": recipe.eval.rehearsal_mode,
        }
        if attempt_outputs != "rehearsed":  # the default's stage settings (and so its resumed runs) unchanged
            settings["attempt_outputs"] = attempt_outputs
        if restate:
            settings["restate_request"] = True
        # a run of the other layout in a folder written since this field exists stops here (an older folder's
        # stages lack it and are not compared on it: there the first evaluation with rehearsal refuses)
        settings["memory"] = args.memory

        def record(folder: Path) -> dict[str, Any]:
            path.unlink(missing_ok=True)  # a stage cut short left part of the file: start it again
            counts = record_memory_demonstrations(
                load_policy(warm, models=models),
                path,
                recipe.suite,
                categories,
                task_ids=ids,
                n=n,
                mode=recipe.eval.rehearsal_mode,
                memory_tokens=recipe.eval.memory_tokens,
                attempt_max_steps=recipe.eval.max_steps_per_turn,
                max_new_tokens=recipe.eval.max_new_tokens,
                attempt_outputs=attempt_outputs,
                restate_request=restate,
                memory=args.memory,
                seed=n,
                progress=True,
            )
            return {"counts": counts, "config": settings}

        path.parent.mkdir(parents=True, exist_ok=True)
        info = stages.stage(f"{path.parent.name}/n{n}", record, settings)
        return {"path": str(path), **info["counts"]}

    needed = memory_sources(args.policies)
    demo_files = memory_demos("rehearsed", False) if ("rehearsed", False) in needed else {}
    other_sources = sorted(needed - {("rehearsed", False)})
    other_demos = {memory_folder(*source): memory_demos(*source) for source in other_sources}
    train_ids = [i for ids in per_n.values() for i in ids]
    test_tasks = functools.cache(lambda: {t.id: t for t in suite.tasks(categories, recipe.eval.split)})

    def sft(name: str, seed: int, task_ids: list[str], changes: dict[str, Any]) -> str:
        """The recipe's SFT stage on `task_ids` with `changes`, at `seed`, room for a memory; its model folder."""
        folder = out / name / f"seed{seed}" / "sft"
        config: SFTConfig = replace_fields(
            recipe.sft_config(folder, task_ids),
            {"seed": seed, "max_seq_len": max(recipe.sft.max_seq_len, 1024), **changes},
        )
        stages.stage(
            f"{name}/seed{seed}/sft",
            lambda _: {
                "last": (SFTTrainer(config, models=models).train() or [None])[-1],
                "config": stage_settings(config),
            },
            stage_settings(config),
            ignore=stage_ignores(SFTConfig),
        )
        return latest_model(folder)

    def evaluation(name: str, model: str, seed: int, **changes: Any) -> dict[str, Any]:
        if changes.get("rehearsal_n"):
            changes = {"memory": args.memory, **changes}
        config = dataclasses.replace(recipe.eval_config(out / name, model), seed=seed, **changes)
        stages.evaluate(name, config, models)
        folder = out / name
        played = episodes(folder)
        measured = {
            "rewards": {t: float(e["reward"]) for t, e in played.items()},
            "families": {t: e["category"] for t, e in played.items()},
            "tokens_per_task": rehearsal_tokens_per_task(folder),
            "seconds": stages.timings.get(name),
        }
        if changes.get("rehearsal_n"):
            measured["memory_hits"] = memory_hits(folder, suite, test_tasks())
        return measured

    def continuation(name: str, seed: int, data: list[str]) -> str:
        steps = args.sft_steps
        changes = {"init": warm, "data": data, "max_demos": 0, "max_steps": steps, "run.save_every": steps}
        return sft(name, seed, train_ids, {**changes, "optim.warmup_steps": 0})

    # made once: it builds every train demonstration
    scratch_ids = functools.cache(lambda: sft_task_ids(recipe, models.tokenizer(recipe.model)))

    def from_scratch(name: str, seed: int, data: list[str]) -> str:
        # the recipe's max_demos already chose these tasks; as a cap on the joined data it would cut the memories
        return sft(name, seed, scratch_ids(), {"data": data, "max_demos": 0})

    memory_sets = {memory_folder("rehearsed", False): demo_files, **other_demos}

    def memory_files(policy: str) -> list[str]:
        return [f["path"] for f in memory_sets[memory_folder(*MEMORY_SOURCES[policy])].values()]

    def scratch_trainer(policy: str) -> Any:
        return lambda seed: from_scratch(policy, seed, [recipe.suite, *memory_files(policy)])

    def reinforce(policy: str, seed: int, start: str) -> str:
        """`policy`'s RL continuation at `seed` from its model `start` (``--rl-steps``); its model folder."""
        changes: dict[str, Any] = {"seed": seed, "num_steps": args.rl_steps, "run.save_every": args.rl_steps}
        if policy in MEMORY_SOURCES:  # rehearsal-aware rollouts in the layout the policy learned to read
            changes |= {
                "rehearsal_n": args.rl_n,
                "rehearsal_memory": args.memory,
                "rehearsal_restate_request": MEMORY_SOURCES[policy][1],
            }
        return grpo_run(stages, recipe, models, f"{policy}{RL_SUFFIX}/seed{seed}", start, changes, log)[1]

    trainers = {
        "plain_sft": lambda seed: continuation("plain_sft", seed, [recipe.suite]),
        "memory_sft": lambda seed: continuation("memory_sft", seed, [recipe.suite, *memory_files("memory_sft")]),
        "plain_scratch": lambda seed: from_scratch("plain_scratch", seed, [recipe.suite]),
        "memory_scratch": scratch_trainer("memory_scratch"),
        "real_memory_scratch": scratch_trainer("real_memory_scratch"),
        "real_memory_restated_scratch": scratch_trainer("real_memory_restated_scratch"),
        "memory_restated_scratch": scratch_trainer("memory_restated_scratch"),
    }
    if args.workers > 1 and args.worker is None:
        evaluation("warm/n0", warm, 0)  # shared by every seed: made once, before the workers
        run_workers(args, out, log, module="benchmarks.experiments.lab_ttr")  # the loop below reads them back
    measured: dict[str, list[dict[str, Any]]] = {}
    results: dict[str, Any] = {}
    for seed in range(args.seeds):
        if args.worker is not None and seed % args.workers != args.worker:
            continue
        policies = {}
        for p in args.policies:
            policies[p] = warm if p == "warm" else trainers[p](seed)
            if args.rl_steps and p != "warm":
                policies[p + RL_SUFFIX] = reinforce(p, seed, policies[p])
        for policy, model in policies.items():
            # the warm start's N=0 evaluation is greedy and seed-free: one folder serves every seed
            base_name = "warm/n0" if policy == "warm" else f"{policy}/seed{seed}/n0"
            rows = {"N=0": evaluation(base_name, model, 0 if policy == "warm" else seed)}
            base = base_policy(policy)
            layout = {"restate_request": True} if MEMORY_SOURCES.get(base, ("", False))[1] else {}
            for n in args.n:
                rows[f"N={n}"] = evaluation(f"{policy}/seed{seed}/n{n}", model, seed, rehearsal_n=n, **layout)
            if policy != "warm" and not args.no_controls:
                for variant, changes in VARIANTS.items():
                    slug = variant.split(" ")[0].replace("-", "_")
                    if not changes and base != policy:  # an RL continuation's pre-RL rehearser: its own start
                        changes, variant, slug = {"rehearser_model": policies[base]}, PRE_RL_REHEARSER, "pre_rl"
                    changes = changes or {"rehearser_model": warm}
                    rows[f"N={CONTROL_N}, {variant}"] = evaluation(
                        f"{policy}/seed{seed}/n{CONTROL_N}_{slug}",
                        model,
                        seed,
                        rehearsal_n=CONTROL_N,
                        **changes,
                        **layout,
                    )
            if base in PLAIN_CONTROL and not args.no_controls:
                own = out / f"{policy}/seed{seed}/n{CONTROL_N}"
                for control, changes in CONTROLS.items():
                    changes = changes or {"memory_from": str(own)}
                    slug = control.split(" ")[0].replace("'s", "")
                    rows[f"N={CONTROL_N}, {control}"] = evaluation(
                        f"{policy}/seed{seed}/n{CONTROL_N}_{slug}",
                        model,
                        seed,
                        rehearsal_n=CONTROL_N,
                        **changes,
                        **layout,
                    )
            for setting, row in rows.items():
                measured.setdefault(f"{policy} | {setting}", []).append(row)
        if args.worker is not None:
            continue  # a worker's seeds are a subset: the process that started it writes the results
        results = summarize(args, recipe, warm, demo_files, measured)
        if other_demos:
            results["other_memory_demos"] = other_demos
        results.update(
            seeds_done=seed + 1,
            wall_s=time.perf_counter() - t_start,
            command=("python -m benchmarks.experiments.lab_ttr " + shlex.join(args.argv)).strip(),
            **provenance(stages),
            stage_seconds=dict(stages.timings),
        )
        (out / "results.json").write_text(json.dumps(results, indent=1))
        plot(results, out / "ttr.png")
        log(f"[ttr] {seed + 1}/{args.seeds} seeds in {out / 'results.json'}")
    if args.worker is not None:
        return {}
    for line in (*table(results), "", *ttr_claims(results)):
        log(line)
    return results


def by_family(rows: list[dict[str, Any]], references: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """`compare` within each task family: `rows` and `references` are one measured evaluation per seed (``rewards``
    and ``families``, task id -> family), the same seeds and tasks; families in the order of the tasks."""
    families = list(dict.fromkeys(rows[0]["families"].values()))
    return {
        family: compare(
            *(
                [{t: r for t, r in s["rewards"].items() if s["families"][t] == family} for s in evaluations]
                for evaluations in (rows, references)
            )
        )
        for family in families
    }


def summarize(args, recipe, warm, demo_files, measured) -> dict[str, Any]:
    """The results.json body: one row per (policy, setting), paired with the same policy at N=0."""
    rows = []
    for key, seeds in measured.items():
        policy, setting = key.split(" | ")
        reference = measured[f"{policy} | N=0"]
        row = {"policy": policy, "setting": setting, "n_seeds": len(seeds)}
        row.update(compare([s["rewards"] for s in seeds], [r["rewards"] for r in reference]))
        row["tokens_per_task"] = sum(s["tokens_per_task"] for s in seeds) / len(seeds)
        if setting != "N=0":
            row["by_family"] = by_family(seeds, reference)
        if all("memory_hits" in s for s in seeds):
            hits = [s["memory_hits"] for s in seeds]
            row["memory_use"] = memory_use([s["rewards"] for s in seeds], [r["rewards"] for r in reference], hits)
        rows.append(row)
    memory_cost = []
    pairs = [(p + rl, plain + rl) for rl in ("", RL_SUFFIX) for p, plain in PLAIN_CONTROL.items()]
    for policy, plain in pairs:
        if f"{policy} | N=0" in measured:
            mem, ref = (measured[f"{p} | N=0"] for p in (policy, plain))
            memory_cost.append(
                {
                    "policy": policy,
                    "reference": plain,
                    **compare([s["rewards"] for s in mem], [r["rewards"] for r in ref]),
                }
            )
    claims = []
    policies = list(dict.fromkeys(key.split(" | ")[0] for key in measured))
    for claim, source, setting, references, sign in TTR_CLAIMS:
        compared = []
        for policy in policies:
            reference = next((r for r in references if f"{policy} | {r}" in measured), None)
            if reference is None or f"{policy} | {setting}" not in measured:
                continue
            row, ref = measured[f"{policy} | {setting}"], measured[f"{policy} | {reference}"]
            compared.append(
                {
                    "policy": policy,
                    "reference": reference,
                    **compare([s["rewards"] for s in row], [r["rewards"] for r in ref]),
                }
            )
        if compared:
            claims.append({"claim": claim, "source": source, "setting": setting, "sign": sign, "policies": compared})
    return {
        "kind": result_kind(recipe.suite, args.memory_tasks, args.memory, args.rl_steps),
        "memory": args.memory,
        "recipe": str(args.recipe),
        "model": recipe.model,
        "warm_start": warm,
        "seeds": args.seeds,
        "sft_steps": args.sft_steps,
        "scratch_steps": recipe.sft.max_steps,
        "policies": evaluated_policies(args.policies, args.rl_steps),
        "rl_steps": args.rl_steps,
        "rl_n": args.rl_n,
        "memory_tasks": args.memory_tasks,
        "memory_demos": demo_files,
        "test_tasks": len(next(iter(measured.values()))[0]["rewards"]),
        "rows": rows,
        "memory_cost": memory_cost,
        "claims": claims,
    }


def plot(results: dict[str, Any], path: Path) -> Path:
    """Success against N per policy (mean over seeds, 95% interval bars)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for i, policy in enumerate(results.get("policies", POLICIES[:3])):
        rows = [r for r in results["rows"] if r["policy"] == policy and r["setting"].startswith("N=")]
        rows = [r for r in rows if "," not in r["setting"]]
        ns = [int(r["setting"][2:]) for r in rows]
        ax.errorbar(
            ns,
            [r["mean"] for r in rows],
            yerr=[r["ci95"] or 0 for r in rows],
            marker="o",
            capsize=3,
            color=f"C{i}",
            label=policy,
        )
    ax.set_xlabel(f"test-time rehearsal attempts N (parallel, {results.get('memory', 'trace')} memory)")
    ax.set_ylabel(f"test success ({results['test_tasks']} tasks)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return run(parse_args(argv))


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
