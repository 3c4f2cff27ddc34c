"""Evaluation: the policy plays a suite's tasks against real backends (`envace eval`), and `envace report`.

`evaluate` builds one env per task: a `ToolUseEnv` over that task answered by its real backend (the
token sequence is kept, so the policy acts token in, token out on ``env.unwrapped.trajectory.token_ids``,
which ends with the assistant opener after every non-final step), optionally in
`wrappers.TestTimeRehearsal` (``rehearsal_n > 0``). All tasks are played together: every round, one
batched `Policy.act` call serves the ACT step of every unfinished task, then every env steps in its own
worker thread, and the generate calls they make inside `reset`/`step` (test-time rehearsals, rehearsed
tool outputs) are merged across envs into one batched call per setting (`agents.engines.batching`), so they cost
about what one env's would. With ``fidelity=True`` the env is instead the *rehearsing*
`RehearseEnv` wrapped in `wrappers.RehearsalFidelity` (no real tools; the shadow backend scores the
rehearsed responses).

Scores are BFCL's: the reward of an episode is the env's final reward (multi-turn: our replay verifier,
single-turn: the AST checker; a truncated episode scores 0), accuracy of a category is the mean reward of
its tasks, and the overall accuracy is the unweighted mean of the category accuracies, as BFCL reports it.

Output folder (``out``):

| file | content |
|---|---|
| ``eval_config.json`` | the settings that decide the results (a re-run with the same ones resumes) |
| ``episodes.jsonl`` | one line per task: `EPISODE_FIELDS`, appended as each task finishes, rewritten in task order at the end |
| ``summary.csv`` | one row per category plus ``overall``: `SUMMARY_FIELDS` |
| ``summary.json`` | ``{"config": {...}, "overall_accuracy": float, "categories": {name: row}}`` |
| ``transcripts.jsonl`` | one line per task as it finishes (finish order): ``task_id``, the committed ``messages`` (OpenAI chat dicts, the system prompt left out: the suite rebuilds it) and, under test-time rehearsal, ``rehearsals``: per user turn its ``memory``, ``critiques`` and ``attempts`` (`wrappers.TestTimeRehearsal`'s record, token counts included) |
| ``fidelity_calls.jsonl`` | ``--fidelity``: one line per rehearsed call (`wrappers.RehearsalFidelity` records) |
| ``fidelity_per_tool.csv``, ``fidelity_per_category.csv`` | ``--fidelity``: `FIDELITY_FIELDS` per group |
| ``fidelity_per_output.csv`` | ``--fidelity``: the same over calls whose real output is an error, the others, and all |

An interrupted evaluation keeps every finished task; running it again with the same settings plays only the
others (a cut last line is dropped). Results of an evaluation with other settings in the same folder make
it refuse (``--overwrite`` replaces them), so no summary sits beside another run's files. A progress bar
over the tasks shows the ETA.
"""  # noqa: E501 (markdown table rows in this docstring cannot be wrapped)

from __future__ import annotations

import csv
import dataclasses
import functools
import json
import os
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from agents.config import config_field, field_default
from agents.training.run_folder import append_jsonl, drop_cut_last_line, filter_jsonl, read_jsonl

_f = config_field

__all__ = [
    "EvalConfig",
    "evaluate",
    "summarize",
    "fidelity_tables",
    "EPISODE_FIELDS",
    "SUMMARY_FIELDS",
    "FIDELITY_FIELDS",
]

EPISODE_FIELDS = [
    "task_id",
    "category",
    "reward",
    "valid",
    "terminated",
    "truncated",
    "turns",
    "num_turns",
    "steps",
    "parse_errors",
    "tool_call_fraction",
    "rehearsal_turns",
    "rehearsal_attempts",
    "rehearsal_generated_tokens",
    "memory_tokens",
    "fidelity_calls",
    "wall_s",
]
"""Per-task record: ``turns`` user turns reached (1-based) of ``num_turns``; ``steps`` ACT steps;
``parse_errors`` malformed ACT messages; ``tool_call_fraction`` ACT steps whose message parsed into at least
one tool call / ACT steps; ``rehearsal_*`` test-time rehearsal totals (0 without); ``memory_tokens`` summed
over turns; ``fidelity_calls`` rehearsed calls shadowed (``--fidelity``); ``wall_s`` the episode's share
of the wall time of the rounds it took part in (every round's batched ACT call and env steps, rehearsals
included, split evenly over the episodes still running)."""

SUMMARY_FIELDS = [
    "category",
    "n_tasks",
    "accuracy",
    "valid_rate",
    "mean_steps",
    "parse_errors_per_task",
    "tool_call_fraction",
]
"""Per-category row; the ``overall`` row holds unweighted means over the categories' rows."""

FIDELITY_FIELDS = ["group", "n_calls", "exact_match", "json_structure_match", "token_f1", "outcome_match"]
"""Fidelity table row: the group (tool or category name, ``error`` / ``ordinary`` output, or ``all``), call count,
the means of `wrappers.fidelity.METRICS`."""


@dataclass
class EvalConfig:
    """Settings of one evaluation run; see each field's help (``envace eval --help``)."""

    model: str = _f(
        "smollm2-135m",
        ("model to evaluate: 'smollm2-135m', 'lab-tiny', 'smollm2-lab', 'tiny-random' or a local Hugging Face folder"),
    )
    suite: str = _f("bfcl", "registered suite name (envace_gym.suites)")
    categories: list[str] | None = _f(
        None,
        "suite categories (none given: the suite's default; tau2: its domains, --domains is the same option)",
        aliases=("domains",),
    )
    split: Literal["train", "valid", "test", "all"] = _f("test", "task split (valid: the lab's validation split)")
    limit: int | None = _f(None, "play only the first N tasks of each category (none: all)")
    max_new_tokens: int = _f(256, "cap per generated message (ACT and rehearsed tool responses)")
    temperature: float = _f(0.0, "ACT sampling temperature; 0 is greedy")
    max_steps_per_turn: int = _f(
        21,
        (
            "ACT messages per user turn, the closing one included (21: BFCL's harness, 20 calling messages then a "
            "force-quit)"
        ),
    )
    seed: int = _f(0, "episode i uses seed + i")
    rehearsal_n: int = _f(0, "test-time rehearsal attempts per user turn (0: off)")
    rehearsal_mode: Literal["parallel", "sequential"] = _f(
        "parallel", "test-time rehearsal: attempts from the same context in one batch, or each seeing the earlier ones"
    )
    rehearser_model: str | None = _f(
        None, "another model plays REHEARSE in test-time rehearsal and --fidelity (none: the policy itself)"
    )
    memory: Literal["trace", "outcomes", "summary"] = _f(
        "trace",
        "test-time rehearsal memory: a trace of the attempts' calls and rehearsed outputs (no text generated), "
        "the same without the attempts' closing replies (outcomes), or English critiques and a summary the policy "
        "writes (instruction-tuned models)",
    )
    memory_tokens: int = _f(256, "bound on the rehearsal memory, tokens")
    restate_request: bool = _f(
        False,
        "test-time rehearsal: the user's request again right after the memory, so it stays next to the act "
        "(a model trained on memories in that layout expects it)",
    )
    attempt_outputs: Literal["rehearsed", "null", "real"] = _f(
        "rehearsed",
        (
            "who answers the rehearsal attempts' calls: the rehearser (the method), a constant (the null-rehearser "
            "control) or a copy of the real backend (an oracle memory, diagnosis only)"
        ),
    )
    memory_from: str | None = _f(
        None,
        (
            "control: an earlier test-time rehearsal evaluation folder (same rehearsal_n and memory); each task "
            "reads, at user turn t, the memory that run built for the next task of its category (cyclic, in id order; "
            "the next task overall for a category of one) at turn t, or that task's last memory when it had fewer "
            "turns; no attempts run"
        ),
    )
    attempt_max_steps: int | None = _f(None, "ACT steps per rehearsal attempt (none: max_steps_per_turn)")
    critique_tokens: int = _f(64, "cap per rehearsal critique, tokens (memory summary only)")
    fidelity: bool = _f(False, "play rehearsed episodes; score each rehearsed call against a shadow real backend")
    out: str | None = _f(None, "output folder (none: eval_out/<model>-<suite>-<split>-<mode>)")
    min_solvable_fraction: float = _f(
        0.9,
        (
            "refuse to start when fewer of the selected tasks than this can be completed within max_steps_per_turn and "
            "max_new_tokens (computed from the ground truth before any model loads; agents.training.budgets)"
        ),
    )
    overwrite: bool = _f(
        False,
        (
            "replace earlier results in out (otherwise the same evaluation resumes after its last finished task, and "
            "another refuses)"
        ),
    )
    engine: str = _f(
        "auto",
        "generation engine registered in agents.engines.registry ('hf', 'hf-nocache', 'hf-generate', 'vllm'; 'auto': "
        "'vllm' where installed for models of 10M parameters or more, else 'hf')",
    )
    user_model: str | None = _f(
        None, "suites with a simulated user (tau2): the model that plays the user (none: the evaluated model itself)"
    )
    user_max_new_tokens: int = _f(128, "cap per simulated-user message, tokens")
    user_temperature: float = _f(0.0, "sampling temperature of the simulated user (0: greedy, tau2's default)")
    user_max_turns: int = _f(
        10, "messages a simulated user may write before it gives up (the episode is then truncated, R = 0)"
    )

    def __post_init__(self) -> None:
        import math

        from agents.config import coerce_fields

        coerce_fields(self)
        if self.out is None:
            mode = "fidelity" if self.fidelity else f"n{self.rehearsal_n}-{self.rehearsal_mode}"
            if self.rehearsal_n and self.attempt_outputs != "rehearsed":
                mode += f"-{self.attempt_outputs}"
            if self.rehearsal_n and self.memory_from:
                mode += "-other-task"
            self.out = os.path.join("eval_out", f"{Path(self.model).name}-{self.suite}-{self.split}-{mode}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(
                f"invalid EvalConfig: temperature must be a finite number >= 0 (0 is greedy), got {self.temperature!r}"
            )
        for name in (
            "max_new_tokens",
            "max_steps_per_turn",
            "memory_tokens",
            "critique_tokens",
            "user_max_new_tokens",
            "user_max_turns",
        ):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"invalid EvalConfig: {name} must be an integer >= 1, got {getattr(self, name)!r}")
        if self.attempt_max_steps is not None and (
            not isinstance(self.attempt_max_steps, int) or self.attempt_max_steps < 1
        ):
            raise ValueError(
                f"invalid EvalConfig: attempt_max_steps must be none or an integer >= 1, got {self.attempt_max_steps!r}"
            )
        if self.seed < 0:
            raise ValueError(f"invalid EvalConfig: seed must be >= 0, got {self.seed!r}")
        if Path(self.out).exists() and not Path(self.out).is_dir():
            raise ValueError(f"invalid EvalConfig: out {self.out!r} is a file; give a folder for the results")
        if not 0 <= self.min_solvable_fraction <= 1:
            raise ValueError(f"min_solvable_fraction must be in [0, 1], got {self.min_solvable_fraction!r}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be None or >= 1, got {self.limit!r}")
        if self.rehearsal_n < 0:
            raise ValueError(f"rehearsal_n must be >= 0, got {self.rehearsal_n!r}")
        from agents.engines.registry import registered_engines

        if self.engine not in registered_engines():
            raise ValueError(f"invalid EvalConfig: engine must be one of {registered_engines()}, got {self.engine!r}")
        if not (math.isfinite(self.user_temperature) and self.user_temperature >= 0):
            raise ValueError(
                f"invalid EvalConfig: user_temperature must be a finite number >= 0, got {self.user_temperature!r}"
            )
        if self.fidelity and self.rehearsal_n:
            raise ValueError("--fidelity plays rehearsed episodes; it cannot be combined with --rehearsal-n > 0")
        if self.memory_from and not self.rehearsal_n:
            raise ValueError(
                "invalid EvalConfig: memory_from replaces test-time rehearsal memories; set rehearsal_n >= 1"
            )
        if self.memory_from and not Path(self.memory_from, "transcripts.jsonl").is_file():
            raise ValueError(
                f"invalid EvalConfig: memory_from {self.memory_from!r} has no transcripts.jsonl; give the folder of a "
                "test-time rehearsal evaluation"
            )
        if self.memory_from:
            source = Path(self.memory_from, "eval_config.json")
            ran = json.loads(source.read_text()) if source.is_file() else {}
            for name in ("rehearsal_n", "memory"):
                if name in ran and ran[name] != getattr(self, name):
                    raise ValueError(
                        f"invalid EvalConfig: memory_from {self.memory_from!r} ran with {name}={ran[name]!r}, this "
                        f"evaluation has {name}={getattr(self, name)!r}; the control reads memories of the same kind"
                    )
        if self.attempt_outputs != "rehearsed" and not self.rehearsal_n:
            raise ValueError("invalid EvalConfig: attempt_outputs shapes test-time rehearsal; set rehearsal_n >= 1")
        if self.restate_request and not self.rehearsal_n:
            raise ValueError(
                "invalid EvalConfig: restate_request repeats the request after a rehearsal memory; set rehearsal_n >= 1"
            )


@dataclass
class EvalResult:
    """What `evaluate` returns: per-task records, the summary rows and the fidelity call records."""

    episodes: list[dict[str, Any]]
    summary: list[dict[str, Any]]
    fidelity_calls: list[dict[str, Any]] = field(default_factory=list)

    @property
    def overall_accuracy(self) -> float:
        """The ``overall`` row's accuracy (unweighted mean over categories)."""
        return float(self.summary[-1]["accuracy"])


def select_tasks(config: EvalConfig) -> list[Any]:
    """The tasks `evaluate` plays: the suite's categories and split, the first ``limit`` of each category."""
    from envace_gym.suites import make_suite

    tasks = make_suite(config.suite).tasks(config.categories, config.split)
    if config.limit is None:
        return tasks
    kept: dict[str, int] = defaultdict(int)
    out = []
    for t in tasks:
        cat = _category(t)
        if kept[cat] < config.limit:
            kept[cat] += 1
            out.append(t)
    return out


def _category(task: Any) -> str:
    return str(task.metadata.get("category", task.suite))


def other_task_memories(folder: str | Path, tasks: Sequence[Any]) -> dict[str, list[str]]:
    """The other-task memory control (``EvalConfig.memory_from``): task id -> the memories, per user turn, that
    the evaluation in `folder` (its ``transcripts.jsonl``) built for another task of the same category, the
    next one in id order among `tasks` (cyclic). A category with a single task keeps its own memory.

    Raises:
        FileNotFoundError: `folder` has no ``transcripts.jsonl``.
        ValueError: a task of `tasks` has no recorded memory there (that run did not evaluate it with test-time
            rehearsal).
    """
    from agents.training.run_folder import read_jsonl

    path = Path(folder) / "transcripts.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"memory_from: {path} does not exist (give a test-time rehearsal evaluation folder)")
    recorded = {r["task_id"]: [m["memory"] for m in r.get("rehearsals") or []] for r in read_jsonl(path)}
    missing = [t.id for t in tasks if not recorded.get(t.id)]
    if missing:
        raise ValueError(f"memory_from: {path} holds no memory for {len(missing)} tasks, e.g. {missing[:3]}")
    ordered = sorted(t.id for t in tasks)
    if len(set(ordered)) < 2:
        raise ValueError("memory_from: the other-task control needs at least two tasks")
    by_category: dict[str, list[str]] = {}
    for t in sorted(tasks, key=lambda t: t.id):
        by_category.setdefault(str(t.metadata.get("category", "")), []).append(t.id)
    out = {}
    for ids in by_category.values():
        for k, task_id in enumerate(ids):
            other = ids[(k + 1) % len(ids)] if len(ids) > 1 else ordered[(ordered.index(task_id) + 1) % len(ordered)]
            out[task_id] = recorded[other]
    return out


def _make_env(
    task: Any, config: EvalConfig, policy: Any, rehearser_policy: Any, memories: list[str] | None = None
) -> Any:
    import gymnasium as gym

    from agents.policy import PolicyRehearser
    from envace_gym.envs.rehearse import RehearseEnv
    from envace_gym.envs.tool_use import ToolUseEnv
    from envace_gym.responders import RealBackend
    from wrappers import RehearsalFidelity, TestTimeRehearsal

    common: dict[str, Any] = dict(
        suite=config.suite,
        tasks=[task],
        max_new_tokens=config.max_new_tokens,
        temperature=config.temperature,
        max_steps_per_turn=config.max_steps_per_turn,
    )
    if config.fidelity:  # the rehearser answers; each rehearsed call is scored against a shadow real backend
        fidelity_rehearser = PolicyRehearser(rehearser_policy if rehearser_policy is not None else policy)
        return RehearsalFidelity(RehearseEnv(rehearser=fidelity_rehearser, **common))
    # Real tools answer the committed calls, in the policy's token format (test-time rehearsal brings its own
    # rehearser).
    env: gym.Env = ToolUseEnv(tokenizer=policy.tokenizer, responder=RealBackend(), **common)
    if config.rehearsal_n:
        rehearser: PolicyRehearser | None = None
        if rehearser_policy is not None:  # another model plays REHEARSE; separate prompts if its vocabulary differs
            same = rehearser_policy.tokenizer.get_vocab() == policy.tokenizer.get_vocab()
            rehearser = PolicyRehearser(rehearser_policy, prompt_mode="inline" if same else "separate")
        env = TestTimeRehearsal(
            env,
            policy,
            n=config.rehearsal_n,
            mode=config.rehearsal_mode,
            memory_tokens=config.memory_tokens,
            rehearser_policy=rehearser,
            attempt_max_steps=config.attempt_max_steps,
            critique_tokens=config.critique_tokens,
            memory=config.memory,
            seed=config.seed,
            attempt_outputs=config.attempt_outputs,
            restate_request=config.restate_request,
            memory_provider=None if memories is None else (lambda base: memories[min(base.turn, len(memories) - 1)]),
        )
    return env


def evaluate(
    config: EvalConfig,
    policy: Any = None,
    rehearser_policy: Any = None,
    log: Any = print,
    progress: bool = True,
    models: Any = None,
) -> EvalResult:
    """Play every selected task once and write the output folder (module docstring).

    Args:
        config: the run's settings.
        policy: a loaded `agents.policy.Policy`; None loads ``config.model``.
        rehearser_policy: the REHEARSE model for test-time rehearsal and ``--fidelity``; None loads
            ``config.rehearser_model`` when set, else uses `policy`.
        log: a print-like callable for progress lines (None: silent).
        progress: show a progress bar over the tasks (with ETA).
        models: the `agents.models.ModelStore` that loads ``config.model`` (None: the default store).

    Returns:
        `EvalResult` (also written to ``config.out``).

    Raises:
        ValueError: no task is selected (unknown categories raise the suite's own ValueError).
        agents.training.budgets.BudgetError: fewer than ``min_solvable_fraction`` of the tasks can be completed within
            ``max_steps_per_turn`` and ``max_new_tokens`` (checked before the model loads).
    """
    from agents.models import default_store
    from agents.policy import load_policy
    from agents.training.budgets import check_task_budgets

    models = models or default_store()
    log = log or (lambda *a, **k: None)
    tasks = select_tasks(config)
    if not tasks:
        raise ValueError(f"no tasks for suite={config.suite!r} categories={config.categories!r} split={config.split!r}")
    check_task_budgets(
        tasks,
        config.suite,
        policy.tokenizer if policy is not None else models.tokenizer(config.model),
        max_steps_per_turn=config.max_steps_per_turn,
        max_new_tokens=config.max_new_tokens,
        max_episode_tokens=None,
        min_fraction=config.min_solvable_fraction,
        command="envace eval",
        log=log,
    )
    policy = policy if policy is not None else load_policy(config.model, engine=config.engine, models=models)
    if rehearser_policy is None and config.rehearser_model:
        rehearser_policy = load_policy(config.rehearser_model, engine=config.engine, models=models)
    from agents.users import simulated_user

    with simulated_user(config, policy, models) as user_policy:
        return _play(config, tasks, policy, rehearser_policy, user_policy, log, progress)


def _play(
    config: EvalConfig, tasks: list[Any], policy: Any, rehearser_policy: Any, user_policy: Any, log: Any, progress: bool
) -> EvalResult:
    """`evaluate` after the models are loaded: play the unfinished tasks, write and return the results."""
    from agents.engines.batching import BatchCoordinator, coalesced

    if config.out is None:  # unreachable: EvalConfig.__post_init__ fills it in (Path(None) raised TypeError too)
        raise TypeError("EvalConfig.out is not set")
    out = Path(config.out)
    finished, finished_fidelity = _prepare_out(out, config)
    done_ids = {e["task_id"] for e in finished}
    all_tasks, tasks = tasks, [t for t in tasks if t.id not in done_ids]
    if done_ids:
        log(f"[eval] resuming in {out}: {len(done_ids)} of {len(all_tasks)} tasks already done")
    from tqdm.auto import tqdm

    bar = tqdm(
        total=len(all_tasks), initial=len(all_tasks) - len(tasks), desc="eval", unit="task", disable=not progress
    )

    memories = other_task_memories(config.memory_from, all_tasks) if config.memory_from else {}
    envs = [_make_env(t, config, policy, rehearser_policy, memories.get(t.id)) for t in tasks]
    state = [_new_state(t) for t in tasks]
    t_start = time.perf_counter()
    batcher = BatchCoordinator()
    with coalesced([policy, rehearser_policy, user_policy], batcher):
        resets = batcher.run(
            [
                functools.partial(envs[i].reset, seed=config.seed + i, options={"task_id": tasks[i].id})
                for i in range(len(tasks))
            ]
        )
    infos = [r[1] for r in resets]
    share = (time.perf_counter() - t_start) / max(len(tasks), 1)
    for s, info in zip(state, infos):
        _absorb(s, info)
        s["wall_s"] += share
    active = list(range(len(tasks)))
    round_ = 0
    while active:
        round_ += 1
        t0 = time.perf_counter()
        actions = policy.act(
            [envs[i].unwrapped.trajectory.token_ids for i in active],
            max_new_tokens=config.max_new_tokens,
            temperature=config.temperature,
            seeds=[config.seed * 1_000_003 + 7919 * i + round_ for i in active],
        )
        with coalesced([policy, rehearser_policy, user_policy], batcher):
            steps = batcher.run([functools.partial(envs[i].step, action) for i, action in zip(active, actions)])
        share = (time.perf_counter() - t0) / len(active)
        still = []
        for i, (_, reward, terminated, truncated, info) in zip(active, steps):
            s = state[i]
            s["wall_s"] += share
            s["steps"] += 1
            s["tool_steps"] += bool(info["tool_calls"])
            _absorb(s, info)
            if terminated or truncated:
                s.update(
                    reward=float(reward),
                    terminated=bool(terminated),
                    truncated=bool(truncated),
                    valid=bool(info.get("verifier", {}).get("valid", False)),
                )
                # one whole line per finished task, on disk at once: an interrupted eval keeps it and resumes
                # transcript first: the episode line marks the task done, so a kill between the two replays it
                append_jsonl(out / "transcripts.jsonl", [_transcript_record(tasks[i], envs[i], s)])
                append_jsonl(out / "episodes.jsonl", [_episode_record(tasks[i], s)])
                if s["fidelity"]:
                    append_jsonl(out / "fidelity_calls.jsonl", s["fidelity"])
                bar.update(1)
                bar.set_postfix(reward=f"{reward:.2f}")
                log(
                    f"[eval] {tasks[i].id}: reward {reward:.2f} after {s['steps']} steps "
                    f"({'terminated' if terminated else 'truncated'}), {time.perf_counter() - t_start:.0f} s"
                )
            else:
                still.append(i)
        active = still
    bar.close()

    by_id = {e["task_id"]: e for e in finished}
    by_id.update({t.id: _episode_record(t, s) for t, s in zip(tasks, state)})
    episodes = [by_id[t.id] for t in all_tasks]
    fidelity_calls = list(finished_fidelity) + [c for s in state for c in s["fidelity"]]
    summary = summarize(episodes)
    _write(out, config, episodes, summary, fidelity_calls)
    return EvalResult(episodes, summary, fidelity_calls)


OUTPUT_FILES = (
    "eval_config.json",
    "episodes.jsonl",
    "transcripts.jsonl",
    "summary.csv",
    "summary.json",
    "fidelity_calls.jsonl",
    "fidelity_per_tool.csv",
    "fidelity_per_category.csv",
    "fidelity_per_output.csv",
)
"""The files `evaluate` writes (and the only ones it removes from an output folder)."""

_RESUME_IGNORES = ("out", "min_solvable_fraction", "overwrite", "engine")
REHEARSAL_ONLY_FIELDS = (
    "rehearsal_mode",
    "memory",
    "memory_tokens",
    "restate_request",
    "attempt_max_steps",
    "critique_tokens",
    "attempt_outputs",
    "memory_from",
)
"""`EvalConfig` fields that shape test-time rehearsal only: an evaluation with ``rehearsal_n == 0`` does not
depend on them, so resuming one (or skipping its finished stage) does not compare them."""
_FIELDS_BEFORE_TRACE_MEMORY = {
    "memory": "summary",
    "attempt_max_steps": 3,
    "attempt_outputs": "rehearsed",
    "memory_from": None,
}
"""What a run folder written before these fields existed ran with (the English memory, 3-step attempts)."""


def resume_ignores(config: EvalConfig) -> tuple[str, ...]:
    """The fields an evaluation may resume with changed: bookkeeping, the engine (the same sampling distribution up
    to float rounding), and the test-time rehearsal fields when `config` runs no test-time rehearsal."""
    return _RESUME_IGNORES + (() if config.rehearsal_n else REHEARSAL_ONLY_FIELDS)


def _prepare_out(out: Path, config: EvalConfig) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Make the output folder ready: resume the same evaluation, or start clean; returns what is finished.

    Same config (all fields but `resume_ignores`; a field the folder's run predates is read as that run had it):
    the finished episodes and fidelity records are read back (a cut last line is skipped) and their tasks are
    not played again.
    ``overwrite``: every `OUTPUT_FILES` entry is removed first. Otherwise, earlier results in the folder
    refuse the run, so a new summary never sits beside another run's files.

    Raises:
        ValueError: the folder holds results of another evaluation (the message lists the differing fields).
    """
    out.mkdir(parents=True, exist_ok=True)
    ignored = resume_ignores(config)
    current = {k: v for k, v in asdict(config).items() if k not in ignored}
    present = [f for f in OUTPUT_FILES if (out / f).exists()]
    if config.overwrite:
        for f in present:
            (out / f).unlink()
        present = []
    saved_path = out / "eval_config.json"
    if present:
        saved = json.loads(saved_path.read_text()) if saved_path.is_file() else None
        if saved is not None:  # a field added since that run is read as its default there (or as it ran then)
            defaults = {f.name: field_default(f) for f in dataclasses.fields(EvalConfig)}
            if "memory" not in saved:
                defaults.update(_FIELDS_BEFORE_TRACE_MEMORY)
            saved = {k: v for k, v in saved.items() if k not in ignored}
            saved = {**{k: defaults[k] for k in current if k not in saved and k in defaults}, **saved}
        if saved != current:
            diff = sorted(k for k in current if saved is None or saved.get(k) != current[k])
            raise ValueError(
                f"{out} holds results of another evaluation ({', '.join(present)}"
                + (f"; differing fields: {', '.join(diff)}" if saved is not None else "")
                + "); use another --out, or --overwrite to replace them"
            )
    saved_path.write_text(json.dumps(current, indent=1))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a cut last line is expected after an interruption
        finished = list(read_jsonl(out / "episodes.jsonl")) if (out / "episodes.jsonl").is_file() else []
        fidelity = list(read_jsonl(out / "fidelity_calls.jsonl")) if (out / "fidelity_calls.jsonl").is_file() else []
    drop_cut_last_line(out / "episodes.jsonl")
    drop_cut_last_line(out / "fidelity_calls.jsonl")
    done = {
        e["task_id"] for e in finished
    }  # a task killed after its transcript, before its episode line, is played again
    filter_jsonl(out / "transcripts.jsonl", lambda t: t["task_id"] in done)
    return finished, fidelity


def _new_state(task: Any) -> dict[str, Any]:
    return {
        "steps": 0,
        "tool_steps": 0,
        "parse_errors": 0,
        "turn": 0,
        "reward": 0.0,
        "valid": False,
        "terminated": False,
        "truncated": False,
        "rehearsals": [],
        "fidelity": [],
        "wall_s": 0.0,
    }


def _absorb(s: dict[str, Any], info: dict[str, Any]) -> None:
    s["parse_errors"] = int(info.get("num_parse_errors", s["parse_errors"]))
    s["turn"] = max(s["turn"], int(info.get("turn", 0)))
    if info.get("rehearsal"):
        s["rehearsals"].append(info["rehearsal"])
    if info.get("fidelity"):
        s["fidelity"].extend(info["fidelity"]["calls"])


def _episode_record(task: Any, s: dict[str, Any]) -> dict[str, Any]:
    reh = s["rehearsals"]
    return {
        "task_id": task.id,
        "category": _category(task),
        "reward": s["reward"],
        "valid": s["valid"],
        "terminated": s["terminated"],
        "truncated": s["truncated"],
        "turns": s["turn"] + 1,
        "num_turns": task.num_turns,
        "steps": s["steps"],
        "parse_errors": s["parse_errors"],
        "tool_call_fraction": s["tool_steps"] / s["steps"] if s["steps"] else 0.0,
        "rehearsal_turns": len(reh),
        "rehearsal_attempts": sum(len(r["attempts"]) for r in reh),
        "rehearsal_generated_tokens": sum(r["generated_tokens"] for r in reh),
        "memory_tokens": sum(r["memory_tokens"] for r in reh),
        "fidelity_calls": len(s["fidelity"]),
        "wall_s": round(s["wall_s"], 3),
    }


def _transcript_record(task: Any, env: Any, s: dict[str, Any]) -> dict[str, Any]:
    """What the episode said (``transcripts.jsonl``): the committed messages past the system prompt, and each
    test-time rehearsal's memory, critiques and attempts, so a score can be read back to its cause."""
    messages = [m.to_dict() for m in env.unwrapped.trajectory.messages if m.role != "system"]
    return {"task_id": task.id, "reward": s["reward"], "messages": messages, "rehearsals": s["rehearsals"]}


def summarize(episodes: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per-category rows (in first-seen order) and a final ``overall`` row of unweighted category means.

    Args:
        episodes: records with at least ``category``, ``reward``, ``valid``, ``steps``, ``parse_errors``,
            ``tool_call_fraction``.

    Returns:
        list of dicts with the `SUMMARY_FIELDS` keys; the last has ``category == "overall"`` and
        ``n_tasks`` = total tasks.

    Raises:
        ValueError: `episodes` is empty.
    """
    if not episodes:
        raise ValueError("no episodes to summarise")
    groups: dict[str, list[dict[str, Any]]] = {}
    for e in episodes:
        groups.setdefault(e["category"], []).append(e)
    rows = []
    for cat, es in groups.items():
        n = len(es)
        rows.append(
            {
                "category": cat,
                "n_tasks": n,
                "accuracy": sum(float(e["reward"]) for e in es) / n,
                "valid_rate": sum(bool(e["valid"]) for e in es) / n,
                "mean_steps": sum(e["steps"] for e in es) / n,
                "parse_errors_per_task": sum(e["parse_errors"] for e in es) / n,
                "tool_call_fraction": sum(e["tool_call_fraction"] for e in es) / n,
            }
        )
    overall = {"category": "overall", "n_tasks": len(episodes)}
    for k in SUMMARY_FIELDS[2:]:
        overall[k] = sum(r[k] for r in rows) / len(rows)
    return rows + [overall]


def fidelity_tables(calls: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Mean fidelity metrics per tool, per category and per kind of real output, each table ending with an
    ``all`` row.

    Returns:
        ``{"tool": rows, "category": rows, "output": rows}``, rows with the `FIDELITY_FIELDS` keys (``all``
        with zeros and ``n_calls == 0`` when there are no calls); ``output`` has an ``error`` and an
        ``ordinary`` row (`wrappers.fidelity.is_error_output` of the call's ``real``), zeros when empty.
    """
    from wrappers.fidelity import is_error_output, mean_metrics

    out = {}
    for key in ("tool", "category", "output"):
        groups: dict[str, list[dict[str, Any]]] = {"error": [], "ordinary": []} if key == "output" else {}
        for c in calls:
            name = ("error" if is_error_output(c["real"]) else "ordinary") if key == "output" else str(c[key])
            groups.setdefault(name, []).append(c)
        groups["all"] = list(calls)
        rows = []
        for name, cs in groups.items():
            rows.append({"group": name, "n_calls": len(cs), **mean_metrics(cs)})
        out[key] = rows
    return out


def _write_csv(path: Path, fields: list[str], rows: Sequence[dict[str, Any]]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def _write(out: Path, config: EvalConfig, episodes, summary, fidelity_calls) -> None:
    tmp = out / "episodes.jsonl.tmp"  # the whole set in task order, replacing the per-task lines atomically
    tmp.write_text("".join(json.dumps(e, ensure_ascii=False) + "\n" for e in episodes), encoding="utf-8")
    os.replace(tmp, out / "episodes.jsonl")
    _write_csv(out / "summary.csv", SUMMARY_FIELDS, summary)
    doc = {
        "config": asdict(config),
        "overall_accuracy": summary[-1]["accuracy"],
        "categories": {r["category"]: r for r in summary[:-1]},
    }
    if config.fidelity:
        tables = fidelity_tables(fidelity_calls)
        tmp = out / "fidelity_calls.jsonl.tmp"
        tmp.write_text("".join(json.dumps(c, ensure_ascii=False) + "\n" for c in fidelity_calls), encoding="utf-8")
        os.replace(tmp, out / "fidelity_calls.jsonl")
        _write_csv(out / "fidelity_per_tool.csv", FIDELITY_FIELDS, tables["tool"])
        _write_csv(out / "fidelity_per_category.csv", FIDELITY_FIELDS, tables["category"])
        _write_csv(out / "fidelity_per_output.csv", FIDELITY_FIELDS, tables["output"])
        doc["fidelity"] = tables
    with open(out / "summary.json", "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=2)


def format_table(rows: Sequence[dict[str, Any]], fields: Sequence[str]) -> str:
    """Rows as a fixed-width text table (floats with 3 decimals)."""
    cells = [[f"{r[k]:.3f}" if isinstance(r[k], float) else str(r[k]) for k in fields] for r in rows]
    widths = [max(len(f), *(len(c[j]) for c in cells)) for j, f in enumerate(fields)]
    line = lambda vals: "  ".join(v.ljust(w) for v, w in zip(vals, widths))  # noqa: E731
    return "\n".join([line(list(fields)), line(["-" * w for w in widths])] + [line(c) for c in cells])
