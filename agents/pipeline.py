"""``envace pipeline``: the main job (``make demo``), the whole EnvACE recipe at small scale.

Stages, each in its own folder under ``run_dir`` (a re-run resumes: finished stages are skipped, and the
SFT and GRPO trainers resume from their newest checkpoints):

1. ``eval_base/``: the untrained policy against the suite's real backends on ``eval.limit`` test-split tasks per
   category;
2. ``sft/``: warm start on demonstrations built from real executions of the suite's reference solutions
   (BFCL: its ground truth), both roles (ACT:
   the calls; REHEARSE: the real tool results), `agents.training.sft.SFTTrainer`;
3. ``eval_sft/``: the warm-started policy, same tasks;
4. ``grpo/``: role-wise GRPO over ``EnvACE-Rehearse-v0`` from the SFT checkpoint (the policy both acts and
   rehearses; rewards from replaying its calls on real backends), `agents.training.trainer.RoleWiseGRPOTrainer`;
5. ``eval_grpo/``: the trained policy, same tasks;
6. with ``fidelity``, a ``fidelity_<model>/`` stage after each evaluation: the same tasks played rehearsed, every
   rehearsed tool output scored against a shadow real backend; with ``test_time_rehearsal_n`` > 0,
   ``eval_grpo_rehearsal/``: the trained policy with test-time rehearsal on the same tasks (or, with
   ``test_time_rehearsal_limit``, the first of them in each category, beside a table row that scores
   ``eval_grpo`` on those tasks only);
7. ``plots/stages.png`` (success, the fraction of ACT steps that parse as tool calls and, where measured, exact
   rehearsal fidelity, per model) and ``grpo/plots/`` (training curves, `agents.evaluation.plots.report`);
   ``summary.json`` and a printed table (`stage_table`).

``configs/recipes/lab.yaml`` is the main job (``make demo``): the hidden-rules lab suite (``lab``) on ``lab-tiny``;
``configs/recipes/lab-stated.yaml`` is the stated-rules suite (``lab-stated``) on ``smollm2-lab``.

The defaults (BFCL, ``make demo-bfcl``) take about 20 minutes on 2 CPU cores with SmolLM2-135M-Instruct (18.3 measured
on idle cores): few SFT steps on the shortest demonstrations (prompts alone are 3k-6.5k tokens, the length cap keeps
whole demos), B=1 x K=2 GRPO, 4 evaluation tasks, and ACT budgets (128 tokens, 5 messages per user turn) that leave
every selected task completable (`agents.training.budgets`, checked before any model loads). A GPU-scale run would
instead use all four multi-turn categories for SFT with no length cap, hundreds of GRPO steps at 16 instructions x K=4
with 20 steps per turn and 256+ new tokens (the paper: Qwen3-8B, ~470 steps, lr 1e-6), and the whole test split for
eval.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.config import (
    TrainConfig,
    config_field,
    flat_fields,
    nested_config_field,
    replace_fields,
)
from agents.evaluation.evaluate import EvalConfig, resume_ignores
from agents.models import ModelStore, default_store
from agents.training.run_folder import read_jsonl
from agents.training.sft import SFTConfig

__all__ = [
    "PipelineConfig",
    "run_pipeline",
    "StageRunner",
    "latest_model",
    "sft_stage",
    "sft_task_ids",
    "grpo_stage",
    "STAGES",
    "REHEARSAL_STAGE",
    "stage_rows",
    "stage_table",
    "same_tasks_row",
    "SAME_TASKS_ROW",
    "stage_settings",
    "stage_ignores",
]

_f = config_field
STAGES = ("eval_base", "sft", "eval_sft", "grpo", "eval_grpo")
"""The stages every run has; ``fidelity`` adds ``fidelity_<model>`` after each evaluation and
``test_time_rehearsal_n`` adds `REHEARSAL_STAGE`."""
REHEARSAL_STAGE = "eval_grpo_rehearsal"

PER_STAGE = "(one folder per stage)"
"""The default of ``eval.out``: each evaluation writes to its stage's folder."""


@dataclass
class PipelineConfig:
    """Settings of ``envace pipeline``: what every stage shares, and one config per stage.

    ``sft`` (an `agents.training.sft.SFTConfig`), ``grpo`` (an `agents.config.TrainConfig`) and ``eval`` (an
    `agents.evaluation.evaluate.EvalConfig`, used by every evaluation) are the stage commands' own configs, with
    this job's defaults; on the command line their fields are ``--sft.<field>``, ``--grpo.<field>`` and
    ``--eval.<field>`` (a shared group's one level down: ``--grpo.optim.lr``), in YAML mappings under ``sft:``,
    ``grpo:`` and ``eval:`` (``grpo: {optim: {lr: 1e-6}}``). The pipeline sets some stage fields itself
    (`pipeline_fields`): from its own options, the model, seed, suite, categories, CPU threads and budget check
    of every stage; per stage, the run folders, the model each stage starts from, the splits (train for SFT and
    GRPO, test for evaluation), the SFT task ids (the ``sft.max_demos`` shortest train demonstrations that fit
    ``sft.max_seq_len`` whole) and which evaluations score fidelity or rehearse at test time. A stage config
    given as an object (``PipelineConfig(grpo=TrainConfig(...))``) is used with its own defaults; given as a
    mapping (YAML, ``grpo={"optim": {"lr": 1e-6}}``, the options) it starts from this job's.

    Raises:
        ValueError: a bad value (naming its field), or a stage field the pipeline sets (naming the option to use).
    """

    run_dir: str = _f("runs/demo", "folder of the whole run (one sub-folder per stage)")
    model: str = _f(
        "smollm2-135m",
        (
            "the policy to start from: 'smollm2-135m', 'lab-tiny' (the hidden-rules lab recipe's), 'smollm2-lab' (the "
            "stated-rules lab recipe's), a local HF folder, or 'tiny-random'"
        ),
    )
    seed: int = _f(0, "seed of every stage")
    threads: int = _f(2, "torch CPU threads (0: torch's default)")
    suite: str = _f(
        "bfcl",
        (
            "registered suite (envace_gym.suites) of every stage: demonstrations from its reference solutions, GRPO on "
            "its tasks, evaluation on its real backends"
        ),
    )
    categories: list[str] | None = _f(
        None, "suite categories for SFT, GRPO and eval (none given: the suite's default, BFCL's multi_turn_base)"
    )
    min_solvable_fraction: float = _f(
        0.9,
        (
            "refuse to start when fewer of the SFT demonstrations, GRPO tasks or evaluation tasks than this fit their "
            "budgets (agents.training.budgets; checked before any model loads)"
        ),
    )
    fidelity: bool = _f(
        False,
        (
            "after each evaluation, also play the same tasks rehearsed and score every rehearsed tool output against "
            "the real backend (exact / JSON structure / token F1)"
        ),
    )
    test_time_rehearsal_n: int = _f(
        0,
        (
            "also evaluate the trained policy with test-time rehearsal of this many attempts per turn "
            "(eval.rehearsal_mode) on the same tasks, or the first test_time_rehearsal_limit of each category (0: "
            "skip)"
        ),
    )
    test_time_rehearsal_limit: int | None = _f(
        None,
        (
            "tasks per category in the test-time rehearsal evaluation: the first this many of the evaluations' own "
            "(none: all of them); below eval.limit, the table adds the plain evaluation scored on those tasks"
        ),
    )
    sft: SFTConfig = nested_config_field(
        SFTConfig,
        "the SFT warm start (envace sft's options)",
        max_steps=8,
        max_demos=16,
        max_seq_len=3584,
        overflow="drop",
        batch_tokens=3584,
        max_batch_rows=1,
        optim={"lr": 1e-4, "lr_schedule": "constant"},
    )
    grpo: TrainConfig = nested_config_field(
        TrainConfig,
        "role-wise GRPO (envace train's options)",
        num_steps=3,
        batch_tasks=1,
        group_size=2,
        optim={"lr": 1e-5},
        max_steps_per_turn=5,
        max_new_tokens=128,
        rehearse_max_new_tokens=64,
        run={"save_every": 3},
    )
    eval: EvalConfig = nested_config_field(
        EvalConfig,
        "the evaluations on the test split (envace eval's options)",
        limit=4,
        max_new_tokens=128,
        temperature=0.0,
        max_steps_per_turn=5,
        out=PER_STAGE,
    )

    def __post_init__(self) -> None:
        from agents.config import coerce_fields

        coerce_fields(self)
        if self.seed < 0 or self.threads < 0 or self.test_time_rehearsal_n < 0:
            raise ValueError(
                f"invalid PipelineConfig: seed, threads and test_time_rehearsal_n must be >= 0, got "
                f"{self.seed}, {self.threads}, {self.test_time_rehearsal_n}"
            )
        limit = self.test_time_rehearsal_limit
        if limit is not None:
            if limit < 1 or (self.eval.limit is not None and limit > self.eval.limit):
                bound = ">= 1" if self.eval.limit is None else f"between 1 and eval.limit ({self.eval.limit})"
                raise ValueError(
                    f"invalid PipelineConfig: test_time_rehearsal_limit must be {bound} so its tasks are "
                    f"some of the evaluations' own, got {limit}"
                )
            if not self.test_time_rehearsal_n:
                raise ValueError(
                    "invalid PipelineConfig: test_time_rehearsal_limit sizes the test-time rehearsal "
                    "evaluation, which runs only with --test-time-rehearsal-n N > 0; set it or leave the limit out"
                )
        if not 0 <= self.min_solvable_fraction <= 1:
            raise ValueError(
                f"invalid PipelineConfig: min_solvable_fraction must be in [0, 1], got {self.min_solvable_fraction}"
            )
        from envace_gym.suites import make_suite, proposes_mistakes, registered_suites

        if self.suite not in registered_suites():
            raise ValueError(f"invalid PipelineConfig: suite must be one of {registered_suites()}, got {self.suite!r}")
        if self.sft.error_demos and not proposes_mistakes(make_suite(self.suite)):
            raise ValueError(
                f"invalid PipelineConfig: sft.error_demos: suite {self.suite!r} proposes no mistakes (no "
                "Suite.mutations); set --sft.error-demos 0"
            )
        for f in dataclasses.fields(self):
            if f.name not in ("sft", "grpo", "eval"):
                continue
            given = flat_fields(getattr(self, f.name))
            default = flat_fields(f.default_factory())  # type: ignore[operator]  # a nested_config_field has one
            for name in self.pipeline_fields(f.name):
                if given[name] != default[name]:
                    raise ValueError(
                        f"invalid PipelineConfig: the pipeline sets {f.name}.{name} itself; {self._instead(name)}"
                    )

    def pipeline_fields(
        self,
        stage: str,
        out: str | Path = "",
        start: str = "",
        task_ids: Sequence[str] = (),
        fidelity: bool = False,
        rehearsal_n: int = 0,
    ) -> dict[str, Any]:
        """The fields of stage config `stage` (``"sft"``, ``"grpo"`` or ``"eval"``) that the pipeline sets itself,
        with their values (a shared group's field as ``<group>.<field>``, as `agents.config.replace_fields` takes
        them): the pipeline's model, seed, categories and budget check in every stage, its suite and CPU threads
        where the stage has them, and per stage the folder `out`, the split, the model folder `start` a stage
        after SFT starts from, the SFT `task_ids`, and whether an evaluation scores `fidelity` or rehearses at test
        time (`rehearsal_n`). These must stay at their defaults in ``sft``, ``grpo`` and ``eval``."""
        every = {
            "model": self.model,
            "seed": self.seed,
            "categories": self._categories(),
            "min_solvable_fraction": self.min_solvable_fraction,
        }
        if stage == "sft":
            return {
                **every,
                "run_dir": str(out),
                "run.threads": self.threads,
                "data": [self.suite],
                "split": "train",
                "task_ids": list(task_ids),
            }
        if stage == "grpo":
            return {
                **every,
                "run_dir": str(out),
                "run.threads": self.threads,
                "init": start,
                "suite": self.suite,
                "split": "train",
            }
        if stage == "eval":
            return {
                **every,
                "model": start,
                "suite": self.suite,
                "split": "test",
                "out": str(out),
                "fidelity": fidelity,
                "rehearsal_n": rehearsal_n,
            }
        raise ValueError(f"no stage {stage!r}; the stages with a config are sft, grpo and eval")

    def _instead(self, name: str) -> str:
        """What to set instead of the stage field `name` that the pipeline sets itself."""
        option = {
            "run.threads": "threads",
            "data": "suite",
            "rehearsal_n": "test_time_rehearsal_n",
        }.get(name, name)
        if option == "fidelity":
            return "set --fidelity true to add a fidelity stage after each evaluation"
        if option == "test_time_rehearsal_n":
            return "set --test-time-rehearsal-n N to add an evaluation of the trained policy with test-time rehearsal"
        if option in ("run_dir", "out"):
            return "each stage writes to its own folder under --run-dir"
        if option in {f.name for f in dataclasses.fields(self)}:
            return f"set --{option.replace('_', '-')} for every stage"
        return "leave it out"

    def rehearsal_subset_limit(self) -> int | None:
        """``test_time_rehearsal_limit`` when the test-time rehearsal stage runs on fewer tasks per category
        than the other evaluations, else None (it plays all of theirs, or does not run)."""
        limit = self.test_time_rehearsal_limit
        if self.test_time_rehearsal_n and limit is not None and (self.eval.limit is None or limit < self.eval.limit):
            return limit
        return None

    def _categories(self) -> list[str] | None:
        return None if self.categories is None else list(self.categories)

    def sft_config(self, out: str | Path, task_ids: list[str]) -> SFTConfig:
        """The SFT stage's config: ``sft`` with the pipeline's fields, training on `task_ids` into `out`."""
        return replace_fields(self.sft, self.pipeline_fields("sft", out, task_ids=task_ids))

    def grpo_config(self, out: str | Path, init: str) -> TrainConfig:
        """The GRPO stage's config: ``grpo`` with the pipeline's fields, from the model folder `init` into `out`."""
        return replace_fields(self.grpo, self.pipeline_fields("grpo", out, start=init))

    def eval_config(self, out: str | Path, model: str, fidelity: bool = False, rehearsal_n: int = 0) -> EvalConfig:
        """An evaluation stage's config: ``eval`` with the pipeline's fields, of `model`, written to `out`; with
        `fidelity`, a fidelity stage, and with `rehearsal_n` > 0, test-time rehearsal of that many attempts."""
        return replace_fields(
            self.eval, self.pipeline_fields("eval", out, start=model, fidelity=fidelity, rehearsal_n=rehearsal_n)
        )

    def to_dict(self) -> dict[str, Any]:
        """Every field, stage configs as nested mappings (JSON/YAML-compatible)."""
        return dataclasses.asdict(self)

    def recipe_dict(self) -> dict[str, Any]:
        """`to_dict` without the stage configs' fields the pipeline sets itself (`pipeline_fields`: the model, the
        run folders, ...), whose values there are unused placeholders; each stage's whole config is its
        ``stage_configs`` entry in the summary."""
        out = self.to_dict()
        for stage in ("sft", "grpo", "eval"):
            for key in self.pipeline_fields(stage):
                *groups, name = key.split(".")
                section = out[stage]
                for group in groups:
                    section = section[group]
                section.pop(name, None)
        return out


def _mark_done(folder: Path, info: dict[str, Any]) -> None:
    (folder / "stage_done.json").write_text(json.dumps(info, indent=1))


class StageRunner:
    """Runs named stages of a job once each, every stage in its own folder under `run`, and resumes.

    A stage that finished wrote ``<run>/<name>/stage_done.json`` (what its function returned, plus
    ``seconds``); running the job again skips it, unless it was run with other settings, which refuses
    rather than mixing two runs' results. Used by `run_pipeline` and by ``benchmarks/experiments/lab_ablations.py``.

    Args:
        run: the job's folder (stage names may hold ``/`` for nested folders).
        log: where progress lines go.
        stamp: called when a stage runs; the dict it returns (JSON-compatible) is stored in the stage's
            ``stage_done.json`` as ``provenance``: which code ran it (``benchmarks.provenance.stamp``), since
            a resumed job's stages may have run at several commits. None: not recorded.

    Attributes:
        timings: seconds per stage name (a skipped stage: the seconds it took when it ran).
        evals: the evaluation row (`evaluate`'s) per stage name.
        configs: the settings each stage ran with, per stage name.
        stamps: each stage's ``provenance`` (None: the stage ran without a `stamp`), per stage name.
    """

    def __init__(self, run: str | Path, log=print, stamp: Callable[[], dict[str, Any]] | None = None) -> None:
        self.run = Path(run)
        self.log = log
        self.stamp = stamp
        self.timings: dict[str, float] = {}
        self.evals: dict[str, dict[str, Any]] = {}
        self.configs: dict[str, dict[str, Any]] = {}
        self.stamps: dict[str, dict[str, Any] | None] = {}

    def stage(
        self, name: str, fn, expected: dict[str, Any] | None = None, ignore: Sequence[str] = ()
    ) -> dict[str, Any]:
        """Run ``fn(folder)`` unless stage `name` is done; returns its info (``fn``'s dict plus ``seconds``).

        Args:
            name: the stage's folder under ``run``.
            fn: folder -> dict (JSON-compatible) or None; an ``"eval"`` entry is the stage's evaluation row,
                a ``"config"`` entry the settings it ran with.
            expected: the settings a finished stage must have run with to be skipped (None: not checked).
                Paths inside the run folder it ran in are read as if that folder were ``run`` (a run folder
                may move); fields it did not store are not compared.
            ignore: fields of `expected` that may differ (speed, memory, bookkeeping).

        Raises:
            ValueError: the stage finished with other settings than `expected` (the message names them).
        """
        from agents.training.run_folder import changed_fields

        folder = self.run / name
        folder.mkdir(parents=True, exist_ok=True)
        info = self.finished(name)
        if info is not None:
            stored = self._here(name, info.get("config", {})) if expected is not None else {}
            changed = sorted(changed_fields(stored, expected or {}, ignore))
            if changed:
                raise ValueError(
                    f"{folder} was run with other settings ({', '.join(changed)}); use another run folder, "
                    f"or delete that folder to run the stage again"
                )
            self.log(f"[stage] {name}: already done, skipped")
        else:
            self.log(f"[stage] {name} ...")
            t0 = time.perf_counter()
            info = fn(folder) or {}
            info["seconds"] = time.perf_counter() - t0
            if self.stamp is not None:
                info["provenance"] = self.stamp()
            _mark_done(folder, info)
            self.log(f"[stage] {name}: done in {info['seconds']:.0f} s")
        self.timings[name] = info.get("seconds", 0.0)
        self.stamps[name] = info.get("provenance")
        if "eval" in info:
            self.evals[name] = info["eval"]
        if "config" in info:
            self.configs[name] = info["config"]
        return info

    def finished(self, name: str) -> dict[str, Any] | None:
        """What stage `name` returned when it finished (its ``stage_done.json``), or None if it has not."""
        done = self.run / name / "stage_done.json"
        return json.loads(done.read_text()) if done.is_file() else None

    def _here(self, name: str, stored: dict[str, Any]) -> dict[str, Any]:
        """`stored` settings of stage `name` with the paths under the run folder they were written in (found
        from the stage's own folder, ``out`` or ``run_dir``) moved under ``run``."""
        own = next((stored[k] for k in ("out", "run_dir") if isinstance(stored.get(k), str)), None)
        stage = Path(name).parts
        if own is None or Path(own).parts[-len(stage) :] != stage or len(Path(own).parts) == len(stage):
            return stored  # no stage folder to learn the old run folder from (or it was ".": nothing to strip)
        old = Path(own).parts[: -len(stage)]

        def moved(value: Any) -> Any:
            if not isinstance(value, str) or Path(value).parts[: len(old)] != old:
                return value
            return str(Path(self.run, *Path(value).parts[len(old) :]))

        return {k: moved(v) for k, v in stored.items()}

    def evaluate(self, name: str, eval_config: EvalConfig, models: ModelStore | None = None) -> dict[str, Any]:
        """Stage `name`: `agents.evaluation.evaluate.evaluate` with `eval_config` (its ``out`` should be the stage's
        folder); returns the evaluation row (accuracy, tool-call fraction, parse errors, fidelity fields)."""
        settings = stage_settings(eval_config)
        ignore = resume_ignores(eval_config)  # the same fields `evaluate` itself resumes with changed
        info = self.stage(
            name, lambda out: {"eval": _evaluate(eval_config, models), "config": settings}, settings, ignore=ignore
        )
        log_row(name, info["eval"], self.log)
        return info["eval"]


def stage_ignores(config_class: Any) -> tuple[str, ...]:
    """The fields a trainer may resume with changed (``RESUME_IGNORES``) less its length: a finished stage's
    step or epoch count is part of what it produced."""
    length = ("num_steps", "max_steps", "num_epochs", "generated_token_budget")
    return tuple(f for f in config_class.RESUME_IGNORES if f not in length)


def stage_settings(config: Any) -> dict[str, Any]:
    """A config dataclass as ``stage_done.json`` stores it (JSON types)."""
    return json.loads(json.dumps(dataclasses.asdict(config)))


def latest_model(run_dir: str | Path) -> str:
    """The model folder of the newest checkpoint in `run_dir`.

    Raises:
        FileNotFoundError: `run_dir` holds no complete checkpoint.
    """
    from agents.training.checkpoint import latest_checkpoint

    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        raise FileNotFoundError(f"no checkpoint in {run_dir}")
    return str(ckpt / "model")


def sft_task_ids(config: PipelineConfig, tokenizer: Any) -> list[str]:
    """The SFT stage's train tasks: train-split task ids whose whole demonstration fits ``sft.max_seq_len``, the
    ``sft.max_demos`` shortest (every one when it is 0), shortest first."""
    from agents.training.demonstrations import build_demonstrations

    demos, _ = build_demonstrations(
        tokenizer,
        config.suite,
        config.categories,
        "train",
        calls_per_message=config.sft.calls_per_message,
        max_tokens=config.sft.max_seq_len,
        overflow="drop",
        progress=False,
    )
    demos.sort(key=lambda d: len(d.token_ids))
    return [d.task.id for d in demos[: config.sft.max_demos or None]]


def sft_stage(config: PipelineConfig, out: Path, models: ModelStore, log=print) -> dict[str, Any]:
    """The SFT warm start of `config` into `out` (`agents.training.sft.SFTTrainer` on the ``sft.max_demos`` shortest
    train-split demonstrations that fit whole); returns the stage info (last metrics, task ids, config)."""
    from agents.training.sft import SFTTrainer

    ids = sft_task_ids(config, models.tokenizer(config.model))
    sft_config = config.sft_config(out, ids)
    log(f"[pipeline] sft on {len(ids)} demonstrations of real executions, {sft_config.max_steps} steps")
    history = SFTTrainer(sft_config, models=models).train()
    return {"last": history[-1] if history else None, "task_ids": ids, "config": dataclasses.asdict(sft_config)}


def grpo_stage(grpo_config: TrainConfig, models: ModelStore, log=print) -> dict[str, Any]:
    """Role-wise GRPO with `grpo_config` (`agents.training.trainer.RoleWiseGRPOTrainer`, resuming in its run folder);
    returns the stage info: the last step's metrics, per step the groups with reward variance, the totals
    of real tool calls in the rollouts (backend executions), of real answers, of world-model target tokens and of
    verifier replays (`agents.rollout.RolloutStats`) over every step in ``metrics.jsonl`` (those of an interrupted
    earlier invocation included), the config."""
    from agents.training.trainer import RoleWiseGRPOTrainer

    trainer = RoleWiseGRPOTrainer(grpo_config, log=lambda *_: None, models=models)
    try:
        history = trainer.train()
    finally:
        trainer.close()
    every = list(read_jsonl(Path(grpo_config.run_dir) / "metrics.jsonl"))  # a resumed run's earlier steps too
    groups = [h["rollout/groups_with_reward_variance"] for h in every]
    log(
        f"[pipeline] grpo: groups with non-zero reward variance per step: {groups} (of {grpo_config.batch_tasks} "
        "per step)"
    )
    return {
        "last": history[-1] if history else None,
        "groups_with_reward_variance": groups,
        "real_tool_calls": sum(h.get("rollout/real_tool_calls", 0) for h in every),
        "real_answers": sum(h.get("rollout/real_answers", 0) for h in every),
        "world_model_tokens": sum(h.get("rollout/world_model_tokens", 0) for h in every),
        "demo_tool_calls": sum(h.get("rollout/demo_tool_calls", 0) for h in every),
        "verifier_replay_calls": sum(h.get("rollout/verifier_replay_calls", 0) for h in every),
        "config": dataclasses.asdict(grpo_config),
    }


def check_budgets(config: PipelineConfig, log=print, models: ModelStore | None = None) -> dict[str, Any]:
    """The solvable fractions of the GRPO and evaluation tasks under the pipeline's budgets, before any model loads.

    Returns ``{"grpo": report, "eval": report}`` as dicts (`agents.training.budgets.BudgetReport.to_dict`), and
    `REHEARSAL_STAGE`'s report when it plays fewer tasks (`PipelineConfig.rehearsal_subset_limit`).

    Raises:
        agents.training.budgets.BudgetError: a stage's fraction is below ``min_solvable_fraction`` (the message names
            the pipeline option to raise).
    """
    from agents.evaluation.evaluate import select_tasks
    from agents.training.budgets import check_task_budgets
    from envace_gym.suites import make_suite

    tokenizer = (models or default_store()).tokenizer(config.model)
    grpo = config.grpo_config("unused", config.model)
    tasks = make_suite(config.suite).tasks(config.categories, "train")
    if grpo.task_ids:
        tasks = [t for t in tasks if t.id in set(grpo.task_ids)]
    grpo = check_task_budgets(
        tasks,
        config.suite,
        tokenizer,
        max_steps_per_turn=grpo.max_steps_per_turn,
        max_new_tokens=grpo.max_new_tokens,
        max_episode_tokens=grpo.max_episode_tokens,
        min_fraction=config.min_solvable_fraction,
        command="envace pipeline (grpo stage, train split)",
        names={
            "max_steps_per_turn": "--grpo.max-steps-per-turn",
            "max_new_tokens": "--grpo.max-new-tokens",
            "max_episode_tokens": "--grpo.max-episode-tokens",
        },
        log=log,
    )
    ev = config.eval_config("unused", config.model)
    reports = {"grpo": grpo.to_dict()}
    limits = {"eval": ev.limit}
    if config.rehearsal_subset_limit() is not None:
        # a subset can fall below the fraction that the whole set clears; refuse now, not after training
        limits[REHEARSAL_STAGE] = config.rehearsal_subset_limit()
    for name, limit in limits.items():
        reports[name] = check_task_budgets(
            select_tasks(dataclasses.replace(ev, limit=limit)),
            config.suite,
            tokenizer,
            max_steps_per_turn=ev.max_steps_per_turn,
            max_new_tokens=ev.max_new_tokens,
            max_episode_tokens=None,
            min_fraction=config.min_solvable_fraction,
            command=f"envace pipeline ({'eval stages' if name == 'eval' else name}, test split)",
            names={"max_steps_per_turn": "--eval.max-steps-per-turn", "max_new_tokens": "--eval.max-new-tokens"},
            log=log,
        ).to_dict()
    return reports


def _overall_row(overall: dict[str, Any]) -> dict[str, Any]:
    """An evaluation stage's row from the ``overall`` row of `agents.evaluation.evaluate.summarize`."""
    return {
        "accuracy": float(overall["accuracy"]),
        "tool_call_fraction": float(overall["tool_call_fraction"]),
        "parse_errors_per_task": float(overall["parse_errors_per_task"]),
        "n_tasks": int(overall["n_tasks"]),
    }


def _evaluate(eval_config: EvalConfig, models: ModelStore | None) -> dict[str, Any]:
    """The evaluation row of one stage (`StageRunner.evaluate`): `_overall_row`, and with ``fidelity`` the
    rehearsal fidelity fields (over every rehearsed call, and apart on error and ordinary outputs) and, where the
    suite proposes mistakes, the one-step fidelity fields."""
    from agents.evaluation.evaluate import evaluate, fidelity_tables

    result = evaluate(eval_config, log=None, progress=True, models=models)
    row = _overall_row(result.summary[-1])
    if eval_config.fidelity:
        tables = fidelity_tables(result.fidelity_calls)
        every = tables["tool"][-1]
        n_calls = int(every["n_calls"])  # no rehearsed call: the metrics are undefined (None), not 0
        # outcome_match only per output kind below: over all calls it mostly counts how often calls succeed
        row.update(
            {
                f"fidelity_{m}": float(every[m]) if n_calls else None
                for m in ("exact_match", "json_structure_match", "token_f1")
            },
            fidelity_calls=n_calls,
        )
        for kind in tables["output"][:2]:  # error, ordinary: a world model may get successes right, errors never
            row[f"fidelity_{kind['group']}_calls"] = int(kind["n_calls"])
            for m in ("exact_match", "outcome_match"):
                row[f"fidelity_{kind['group']}_{m}"] = float(kind[m]) if kind["n_calls"] else None
        one_step = _one_step(eval_config, result, models)
        if one_step is not None:
            for group in ("ordinary", "error"):
                cell = one_step.get(group, {"outputs": 0, "exact_match": None})
                row[f"one_step_{group}_outputs"] = cell["outputs"]
                row[f"one_step_{group}_exact_match"] = cell["exact_match"]
    return row


def log_row(name: str, row: dict[str, Any], log=print) -> None:
    """Print an evaluation stage's row (`_evaluate`'s): success, tool-call fraction and parse errors, or for a
    fidelity stage its rehearsal fidelity and, where measured, its one-step fidelity. `StageRunner.evaluate`
    prints it whether the stage ran or was read back, so a resumed run shows every stage's numbers."""
    if "fidelity_calls" not in row:
        log(
            f"[pipeline] {name}: success {row['accuracy']:.3f}, ACT steps parsed as tool calls "
            f"{row['tool_call_fraction']:.3f}, parse errors/task {row['parse_errors_per_task']:.2f}"
        )
        return
    n_calls = row["fidelity_calls"]
    scores = (
        f"exact {row['fidelity_exact_match']:.3f}, structure {row['fidelity_json_structure_match']:.3f}, "
        f"token F1 {row['fidelity_token_f1']:.3f}"
        if n_calls
        else "nothing to score"
    )

    def share(key: str) -> str:
        return "n/a" if row.get(key) is None else f"{row[key]:.3f}"

    split = "".join(
        f"; {k} outputs {row[f'fidelity_{k}_calls']} calls, exact {share(f'fidelity_{k}_exact_match')}"
        + (f", outcome {share(f'fidelity_{k}_outcome_match')}" if f"fidelity_{k}_outcome_match" in row else "")
        for k in ("error", "ordinary")
        if f"fidelity_{k}_calls" in row  # (rows stored before the split have none)
    )
    rehearsed_world = f"success in the rehearsed world {row['accuracy']:.3f}"
    log(f"[pipeline] {name}: {n_calls} rehearsed calls: {scores}{split} ({rehearsed_world})")
    if "one_step_error_outputs" in row:
        cells = []
        for g in ("error", "ordinary"):
            exact = row[f"one_step_{g}_exact_match"]
            shown = "n/a" if exact is None else f"{exact:.3f}"
            cells.append(f"{g} outputs {row[f'one_step_{g}_outputs']}, exact {shown}")
        log(f"[pipeline] {name}: one-step fidelity (real output from the real history): {'; '.join(cells)}")


def _one_step(eval_config: EvalConfig, result: Any, models: ModelStore | None) -> dict[str, Any] | None:
    """`agents.evaluation.one_step.one_step_fidelity` of the model that plays REHEARSE in the evaluation
    (``rehearser_model`` where set, else the evaluated model) on the evaluated tasks' demonstrations, each task also
    with one error demonstration, where the suite proposes mistakes (``Suite.mutations``); else None (no error
    outputs to score)."""
    from agents.evaluation.one_step import one_step_fidelity
    from agents.models import default_store
    from agents.training.demonstrations import build_demonstrations
    from envace_gym.suites import make_suite, proposes_mistakes

    suite = make_suite(eval_config.suite)
    if not proposes_mistakes(suite):
        return None
    store = models or default_store()
    rehearser = eval_config.rehearser_model or eval_config.model
    tokenizer = store.tokenizer(rehearser)
    ids = [str(e["task_id"]) for e in result.episodes]
    demos, _ = build_demonstrations(
        tokenizer, eval_config.suite, eval_config.categories, eval_config.split, task_ids=ids, max_tokens=None,
        mutations=1, seed=0,
    )  # fmt: skip
    return one_step_fidelity(store.model(rehearser), tokenizer, demos, getattr(suite, "error_kind", None))


SAME_TASKS_ROW = "grpo, same tasks"
"""The `stage_rows` label of the plain evaluation scored on the test-time rehearsal stage's tasks only."""


def same_tasks_row(plain: str | Path, rehearsed: str | Path) -> dict[str, Any]:
    """The plain evaluation in folder `plain` scored on the tasks of the evaluation in `rehearsed` only (its
    ``episodes.jsonl``), so a test-time rehearsal stage on fewer tasks is compared on equal tasks: the
    ``overall`` row of `agents.evaluation.evaluate.summarize` (unweighted category means, BFCL's rule) with the keys of
    an evaluation stage's row. Equal tasks, not equal sampling: an episode's seed is its index in its evaluation's
    task list, which differs between the two at temperature > 0.

    Raises:
        ValueError: some task of `rehearsed` is not in `plain`.
    """
    from agents.evaluation.evaluate import summarize

    wanted = {e["task_id"] for e in read_jsonl(Path(rehearsed) / "episodes.jsonl")}
    episodes = [e for e in read_jsonl(Path(plain) / "episodes.jsonl") if e["task_id"] in wanted]
    missing = wanted - {e["task_id"] for e in episodes}
    if missing:
        raise ValueError(f"{plain} did not play the tasks {sorted(missing)} of {rehearsed}")
    return _overall_row(summarize(episodes)[-1])


def stage_rows(evals: dict[str, dict[str, Any]], same_tasks: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """One row per evaluated model (``base``, ``sft``, ``grpo``, and ``grpo+rehearsal`` when that stage ran):
    the real-backend evaluation's fields, plus the ``fidelity_*`` fields of its fidelity stage, if any.
    `same_tasks` (`same_tasks_row`), when given, is put before ``grpo+rehearsal`` as `SAME_TASKS_ROW`."""
    rows: dict[str, dict[str, Any]] = {}
    for name, row in evals.items():
        if name.startswith("eval_"):
            label = "grpo+rehearsal" if name == REHEARSAL_STAGE else name[len("eval_") :]
            if label == "grpo+rehearsal" and same_tasks is not None:
                rows[SAME_TASKS_ROW] = dict(same_tasks)
            rows.setdefault(label, {}).update(row)
    for name, row in evals.items():
        if name.startswith("fidelity_") and name[len("fidelity_") :] in rows:
            rows[name[len("fidelity_") :]].update(
                {k: v for k, v in row.items() if k.startswith("fidelity_")}, rehearsed_world_accuracy=row["accuracy"]
            )
    return rows


def stage_table(rows: dict[str, dict[str, Any]], timings: dict[str, float]) -> list[str]:
    """The printed summary: tasks played, success on real backends (the rows' ``accuracy``), tool-call fraction
    and fidelity per evaluated model, and the seconds of the stages behind each row (blank for `SAME_TASKS_ROW`,
    which is computed from another stage's episodes)."""
    lines = [
        f"{'model':<16} {'tasks':>5} {'success':>9} {'tool calls':>10} {'parse err':>9} {'fid exact':>9} "
        f"{'fid struct':>10} {'fid F1':>7} {'seconds':>8}"
    ]
    for label, row in rows.items():
        stages = (
            [REHEARSAL_STAGE]
            if label == "grpo+rehearsal"
            else []
            if label == SAME_TASKS_ROW
            else [f"eval_{label}", f"fidelity_{label}"]
        )
        fid = [
            ""
            if f"fidelity_{m}" not in row
            else "n/a"
            if row[f"fidelity_{m}"] is None
            else f"{row[f'fidelity_{m}']:.3f}"
            for m in ("exact_match", "json_structure_match", "token_f1")
        ]
        seconds = f"{sum(timings.get(s, 0.0) for s in stages):.0f}" if stages else ""
        lines.append(
            f"{label:<16} {row.get('n_tasks', ''):>5} {row['accuracy']:>9.3f} {row['tool_call_fraction']:>10.3f} "
            f"{row['parse_errors_per_task']:>9.2f} {fid[0]:>9} {fid[1]:>10} {fid[2]:>7} {seconds:>8}"
        )
    for name in ("sft", "grpo"):
        lines.append(
            f"{name + ' (training)':<16} {'':>5} {'':>9} {'':>10} {'':>9} {'':>9} {'':>10} {'':>7} "
            f"{timings.get(name, 0.0):>8.0f}"
        )
    return lines


def plot_stages(rows: dict[str, dict[str, Any]], path: str | Path) -> Path:
    """Bars per evaluated model (``rows``: `stage_rows`): success on the real backends, the fraction of ACT
    steps parsed as tool calls and, where measured, the exact-match fidelity of the rehearsed tool outputs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stages = list(rows)
    series = [("accuracy", "success (real backends)"), ("tool_call_fraction", "ACT steps parsed as tool calls")]
    if any("fidelity_exact_match" in rows[s] for s in stages):
        series.append(("fidelity_exact_match", "rehearsed outputs exactly right"))
    fig, ax = plt.subplots(figsize=(1.6 * len(stages) + 2.5, 3.5))
    width = 0.8 / len(series)
    xs = range(len(stages))
    for i, (key, label) in enumerate(series):
        measured = [x for x, s in zip(xs, stages) if rows[s].get(key) is not None]  # no bar where nothing was measured
        bars = ax.bar(
            [x + (i - (len(series) - 1) / 2) * width for x in measured],
            [rows[stages[x]][key] for x in measured],
            width,
            label=label,
        )
        ax.bar_label(bars, fmt="%.2f", fontsize=8)  # values printed, so a zero bar is still readable
    ax.set_xticks(list(xs), stages)
    ax.set_ylim(0, 1)
    ax.set_title("test tasks per stage")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def run_pipeline(config: PipelineConfig, log=print, models: ModelStore | None = None) -> dict[str, Any]:
    """Run (or resume) every stage; returns the summary that is also written to ``run_dir/summary.json``.

    Args:
        config: the pipeline's settings.
        log: where progress lines go.
        models: the `agents.models.ModelStore` every stage loads from (None: the default store).
    """
    import torch

    from agents.evaluation.plots import report

    models = models or default_store()
    if config.threads:
        torch.set_num_threads(config.threads)
    budgets = check_budgets(config, log, models)
    run = Path(config.run_dir)
    run.mkdir(parents=True, exist_ok=True)
    stages = StageRunner(run, log)

    def evaluate_stage(name: str, model: str, limit: int | None = None, **changes: Any) -> None:
        ev = config.eval_config(run / name, model, **changes)
        stages.evaluate(name, ev if limit is None else dataclasses.replace(ev, limit=limit), models)

    def evaluations(name: str, model: str) -> None:
        evaluate_stage(f"eval_{name}", model)
        if config.fidelity:
            evaluate_stage(f"fidelity_{name}", model, fidelity=True)

    evaluations("base", config.model)

    # A finished training stage is skipped only if it ran with today's settings: another budget refuses, naming
    # the field, instead of reporting the old run as the new one. SFT's task ids follow from its other settings
    # (the suite, categories, max_demos, max_seq_len, the tokenizer), so the stored ones stand in for them.
    sft_ids = (stages.finished("sft") or {}).get("task_ids", [])
    stages.stage(
        "sft",
        lambda out: sft_stage(config, out, models, log),
        stage_settings(config.sft_config(run / "sft", sft_ids)),
        ignore=stage_ignores(SFTConfig),
    )
    sft_model = latest_model(run / "sft")
    evaluations("sft", sft_model)

    stages.stage(
        "grpo",
        lambda out: grpo_stage(config.grpo_config(out, sft_model), models, log),
        stage_settings(config.grpo_config(run / "grpo", sft_model)),
        ignore=stage_ignores(TrainConfig),
    )
    grpo_model = latest_model(run / "grpo")
    evaluations("grpo", grpo_model)
    same_tasks = None
    if config.test_time_rehearsal_n:
        subset = config.rehearsal_subset_limit()
        evaluate_stage(REHEARSAL_STAGE, grpo_model, limit=subset, rehearsal_n=config.test_time_rehearsal_n)
        if subset is not None:
            same_tasks = same_tasks_row(run / "eval_grpo", run / REHEARSAL_STAGE)

    evals, timings = stages.evals, stages.timings
    rows = stage_rows(evals, same_tasks)
    plots = [str(p) for p in report(run / "grpo")]
    plots.append(str(plot_stages(rows, run / "plots" / "stages.png")))
    summary: dict[str, Any] = {
        "config": config.recipe_dict(),
        "stage_configs": stages.configs,
        "budgets": budgets,
        "evals": evals,
        "rows": rows,
        "seconds": timings,
        "plots": plots,
        "total_seconds": sum(timings.values()),
    }
    (run / "summary.json").write_text(json.dumps(summary, indent=1))
    log("")
    for line in stage_table(rows, timings):
        log(line)
    # a resumed run reads finished stages' seconds back: this is the stages' time, not this invocation's
    log(f"[pipeline] stages took {summary['total_seconds'] / 60:.1f} min in all; plots: {', '.join(plots)}")
    return summary
