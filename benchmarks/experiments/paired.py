"""What the lab experiments share (a module, not a script): a recipe run's start (the recipe, the model store,
the stage runner, the warm start), per-task rewards of an evaluation folder, and the paired comparison of
per-task rewards by seed."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from pathlib import Path
from typing import Any

from benchmarks.stats import mcnemar_exact, mean_ci95

__all__ = ["episodes", "task_rewards", "rehearsal_tokens_per_task", "paired_comparison", "start_recipe_run"]


def episodes(folder: Path) -> dict[str, dict[str, Any]]:
    """Task id -> its ``episodes.jsonl`` record in an evaluation folder (`agents.evaluation.evaluate`)."""
    from agents.training.run_folder import read_jsonl

    return {e["task_id"]: e for e in read_jsonl(Path(folder) / "episodes.jsonl")}


def task_rewards(folder: Path) -> dict[str, float]:
    """Task id -> reward of the evaluation written to `folder` (its ``episodes.jsonl``)."""
    return {task: float(e["reward"]) for task, e in episodes(folder).items()}


def rehearsal_tokens_per_task(folder: Path) -> float:
    """Mean tokens generated per task for test-time rehearsal in an evaluation folder (every attempt's ACT and
    REHEARSE tokens; the episodes' ``rehearsal_generated_tokens``), on top of what the committed episode generates."""
    eps = episodes(folder)
    return sum(float(e.get("rehearsal_generated_tokens") or 0) for e in eps.values()) / max(len(eps), 1)


def paired_comparison(rows: list[dict[str, float]], references: list[dict[str, float]]) -> dict[str, Any]:
    """Per-task rewards paired by seed: `rows[i]` against `references[i]` (the same seed, the same tasks).

    Returns:
        ``success`` (per seed), its ``mean`` and ``ci95`` (half-width of the 95% t-interval over seeds), the mean
        paired difference ``diff_mean`` with ``diff_ci95`` (seeds are the unit: the same tasks repeat in every
        seed), ``gained`` / ``lost`` (discordant tasks summed over seeds), ``p_values`` (per seed, the exact
        McNemar test on that seed's own tasks, `benchmarks.stats.mcnemar_exact`) and ``resolved_up`` /
        ``resolved_down`` (the seeds with p < 0.05 and more tasks gained / lost).
    """
    success = [sum(r.values()) / len(r) for r in rows]
    mean, half = mean_ci95(success)
    diff_mean, diff_half = mean_ci95([s - sum(r.values()) / len(r) for s, r in zip(success, references)])
    gained = [sum(row[t] > ref[t] for t in ref) for row, ref in zip(rows, references)]
    lost = [sum(row[t] < ref[t] for t in ref) for row, ref in zip(rows, references)]
    p_values = [mcnemar_exact(g, lo) for g, lo in zip(gained, lost)]
    return {
        "success": success,
        "mean": mean,
        "ci95": half,
        "diff_mean": diff_mean,
        "diff_ci95": diff_half,
        "gained": sum(gained),
        "lost": sum(lost),
        "p_values": p_values,
        "resolved_up": sum(p < 0.05 and g > lo for p, g, lo in zip(p_values, gained, lost)),
        "resolved_down": sum(p < 0.05 and g < lo for p, g, lo in zip(p_values, gained, lost)),
    }


def load_recipe(path: str | Path, out: str | Path, threads: int, limit: int | None) -> Any:
    """The envace pipeline recipe at `path` as an experiment runs it: stages under `out`, `threads` torch threads,
    evaluations on the first `limit` tasks per family, and without the recipe's own test-time rehearsal
    evaluation (``test_time_rehearsal_n``: the experiments that rehearse at test time have their own rows).

    Raises:
        ValueError: the recipe is invalid (`agents.pipeline.PipelineConfig` names the field).
    """
    from agents.config import load_dataclass
    from agents.pipeline import PipelineConfig

    recipe = load_dataclass(PipelineConfig, str(path), run_dir=str(out), threads=threads)
    return dataclasses.replace(  # one replace: the fields are validated together
        recipe,
        test_time_rehearsal_n=0,
        test_time_rehearsal_limit=None,
        eval=dataclasses.replace(recipe.eval, limit=limit),
    )


WORLD_INFIXES = {"lab": "", "lab-blind": "_blind", "lab-stated": "_stated"}
"""What a lab world adds to an experiment's results kind (``lab_ttr_blind``), so each world's run is its own section
of the results page (`benchmarks.results.WORLDS` titles them); the experiments that use it run on these suites."""


def world_kind(base: str, suite: str) -> str:
    """`base` (an experiment's results kind on the default lab) with `suite`'s `WORLD_INFIXES` entry.

    Raises:
        ValueError: `suite` has no entry (the message names the experiment and the suites it runs on).
    """
    if suite not in WORLD_INFIXES:
        raise ValueError(f"{base} runs on suites {', '.join(WORLD_INFIXES)}; the recipe's suite is {suite!r}")
    return base + WORLD_INFIXES[suite]


def _check_warm_suite(warm: Path, suite: str) -> None:
    """Refuse a warm start trained on another world than the recipe's: its run's config names the suites it
    trained on (an SFT run's ``config.json`` ``data``, a GRPO run's ``config.yaml`` ``suite``); a folder with
    neither is not checked.

    Raises:
        ValueError: `suite` is not among them.
    """
    import json

    import yaml

    if (warm / "config.json").is_file():
        config = json.loads((warm / "config.json").read_text())
    elif (warm / "config.yaml").is_file():
        config = yaml.safe_load((warm / "config.yaml").read_text()) or {}
    else:
        return
    trained = config.get("data") if isinstance(config.get("data"), list) else [config.get("suite")]
    if trained != [None] and suite not in trained:
        raise ValueError(
            f"the warm start {warm} was trained on {trained}, the recipe's suite is {suite!r}: pass a warm start of "
            "that suite, or none (leave --warm out; --warm none where it has a default) to train the recipe's"
        )


def start_recipe_run(args: Any, log: Any = print, suites: Collection[str] | None = None) -> tuple[Any, Any, Any, str]:
    """The start every lab experiment shares: the recipe at ``args.recipe`` (its evaluations limited to
    ``args.limit`` tasks per family, ``args.threads`` torch threads), the default model store, a stage runner
    in ``args.out`` and the warm start: the newest checkpoint of the SFT run folder ``args.warm``, or the
    recipe's SFT stage run (or resumed) in ``<out>/warm_start/sft``.

    Args:
        suites: the suites the experiment supports (None: any); checked before any training.

    Returns:
        ``(recipe, models, stages, warm)``: the `agents.pipeline.PipelineConfig`, the `agents.models.ModelStore`,
        the `agents.pipeline.StageRunner` and the warm start's model folder.

    Raises:
        ValueError: the recipe's suite is not one of `suites`, or ``args.warm`` was trained on another suite.
    """
    import torch

    from agents.models import default_store
    from agents.pipeline import StageRunner, latest_model, sft_stage
    from benchmarks.provenance import stamp

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    recipe = load_recipe(args.recipe, out, args.threads, args.limit)
    if suites is not None and recipe.suite not in suites:
        raise ValueError(
            f"this experiment runs on suites {', '.join(suites)}; the recipe {args.recipe} names suite {recipe.suite!r}"
        )
    models = default_store()
    stages = StageRunner(out, log, stamp=stamp)
    if args.warm:
        _check_warm_suite(Path(args.warm), recipe.suite)
        return recipe, models, stages, latest_model(args.warm)
    stages.stage("warm_start/sft", lambda folder: sft_stage(recipe, folder, models, log))
    return recipe, models, stages, latest_model(out / "warm_start" / "sft")
