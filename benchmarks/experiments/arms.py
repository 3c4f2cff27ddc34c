"""What the lab's GRPO comparisons share (a module, not a script): the environment-cost arms, and one arm's stages
from a shared warm start (role-wise GRPO with the arm's settings, the test evaluation on the real backend, rehearsal
fidelity) with the per-run record that `benchmarks.experiments.lab_ablations` and
`benchmarks.experiments.lab_env_cost` both tabulate."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.experiments.paired import task_rewards

__all__ = [
    "ENV_COST_PROBS",
    "WORLD_MODEL_WEIGHT",
    "arm_name",
    "env_cost_arms",
    "ANCHOR_WEIGHTS",
    "ANCHOR_DEMOS",
    "anchor_arm",
    "anchor_arms",
    "TRAIN_TOTALS",
    "FIDELITY_SPLITS",
    "train_reward",
    "row_fidelity",
    "evaluate",
    "train_and_score",
]

ENV_COST_PROBS = (0.0, 0.05, 0.2, 1.0)
"""The shares p of tool calls answered by the real backend in training (``rollout: hybrid``): none (EnvACE's
rehearsed rollouts), a few, a fifth, all (the real-rollout ablation)."""

WORLD_MODEL_WEIGHT = 1.0
"""λ of the world-model loss arms (``world_model_loss_weight``). Fixed before any run, not tuned: the cross-entropy
is a mean in nats per target token, as the SFT warm start's loss on its REHEARSE targets, so λ = 1 trains each real
output as the warm start trained its rehearsal targets, beside a GRPO term whose advantages are of order one
(rewards in [0, 1])."""


def arm_name(p: float, weight: float = 0.0) -> str:
    """``hybrid_p<p>`` (``hybrid_p0.05``), with ``_wm<λ>`` when the world-model loss is on (``hybrid_p0.2_wm1``)."""
    return f"hybrid_p{p:g}" + (f"_wm{weight:g}" if weight else "")


def env_cost_arms(
    probs: tuple[float, ...] = ENV_COST_PROBS, weight: float = WORLD_MODEL_WEIGHT
) -> dict[str, dict[str, Any]]:
    """Each environment-cost arm's `agents.config.TrainConfig` fields over a recipe's GRPO stage, by `arm_name`:
    every p of `probs` without the world-model loss, then every p > 0 with it at `weight` (p = 0 makes no real
    output, so the loss would train nothing: that run is the one without it)."""
    arms: dict[str, dict[str, Any]] = {}
    for w in (0.0, weight) if weight else (0.0,):
        for p in probs:
            if w and not p:
                continue
            arms[arm_name(p, w)] = {
                "rollout": "hybrid",
                "real_call_prob": p,
                **({"world_model_loss_weight": w} if w else {}),
            }
    return arms


ANCHOR_WEIGHTS = (0.03, 0.1, 0.3, 1.0)
"""The world-model anchor's weights λ (``world_model_loss_weight`` over ``world_model_demos``) chosen among on the
validation split: 1 (the unit argued at `WORLD_MODEL_WEIGHT`) and smaller ones. At λ = 1 the anchor's gradient norm
was about 10x role-wise GRPO's (0.3-0.7 against 0.03-0.08), which under AdamW shrinks the policy-gradient step; the
smaller weights bring the two to about the same size."""

ANCHOR_DEMOS = 16
"""Real demonstrations per step of the anchor arms (``world_model_demos``): as many tasks as a step's rollouts have
(the lab recipe's ``batch_tasks``), each with one error demonstration, the warm start's own mix."""


def anchor_arm(weight: float) -> str:
    """``role_grpo_wm_demos`` at λ = 1, else ``role_grpo_wm_demos_w<λ>`` (``role_grpo_wm_demos_w0.1``)."""
    return "role_grpo_wm_demos" if weight == 1.0 else f"role_grpo_wm_demos_w{weight:g}"


def anchor_arms(weights: tuple[float, ...] = ANCHOR_WEIGHTS) -> dict[str, dict[str, Any]]:
    """Each world-model anchor arm's `agents.config.TrainConfig` fields over a recipe's GRPO stage, by `anchor_arm`:
    rehearsed rollouts (the recipe's) plus the world-model loss at λ on `ANCHOR_DEMOS` real demonstrations per step,
    each with one error demonstration (``world_model_demos``, `agents.training.trainer`)."""
    return {
        anchor_arm(w): {"world_model_demos": ANCHOR_DEMOS, "world_model_demo_errors": 1, "world_model_loss_weight": w}
        for w in weights
    }


TRAIN_TOTALS = (
    "real_tool_calls",
    "real_answers",
    "verifier_replay_calls",
    "world_model_tokens",
    "demo_tool_calls",
    "groups_with_reward_variance",
)
"""The training totals of a GRPO stage (`agents.pipeline.grpo_stage`) a run's record keeps (a stage that finished
before a total was recorded reads 0 for it)."""


def train_reward(metrics: str | Path, window: int = 5) -> dict[str, float] | None:
    """The mean reward of a GRPO run's training rollouts (``rollout/reward_mean`` of its ``metrics.jsonl``; in the
    rehearsed world unless its rollouts were real): ``first`` and ``last`` over the first and last `window` steps,
    ``mean`` over all; the newest record of a step counts where a resumed run logged it twice. None without a
    metrics file or a logged reward."""
    from agents.evaluation.plots import load_metrics

    if not Path(metrics).is_file():
        return None
    by_step = {m["step"]: m["rollout/reward_mean"] for m in load_metrics(metrics) if "rollout/reward_mean" in m}
    rewards = [by_step[k] for k in sorted(by_step)]
    if not rewards:
        return None
    return {
        "first": float(np.mean(rewards[:window])),
        "last": float(np.mean(rewards[-window:])),
        "mean": float(np.mean(rewards)),
    }


FIDELITY_SPLITS = {
    "exact": "fidelity_exact_match",
    "ordinary exact": "fidelity_ordinary_exact_match",
    "error exact": "fidelity_error_exact_match",
    "one-step ordinary exact": "one_step_ordinary_exact_match",
    "one-step error exact": "one_step_error_exact_match",
}
"""Per-row fidelity columns: exact match over every rehearsed output, over ordinary outputs, over error outputs
(rehearsed rollouts), and one-step exact match on ordinary and error outputs (`agents.evaluation.one_step`; None
for a fidelity stage run before it was measured)."""


def row_fidelity(evaluations: list[dict[str, Any]]) -> dict[str, float | None]:
    """Mean over seeds of each `FIDELITY_SPLITS` field (None when no evaluation measured it)."""
    out = {}
    for column, key in FIDELITY_SPLITS.items():
        values = [e[key] for e in evaluations if e.get(key) is not None]
        out[column] = float(np.mean(values)) if values else None
    return out


def evaluate(stages: Any, recipe: Any, models: Any, name: str, model: str, **changes: Any) -> dict[str, Any]:
    """Stage `name` (under the stage runner's folder): the recipe's evaluation of `model` with `changes` to its
    `agents.evaluation.EvalConfig` fields; returns the evaluation row (`agents.pipeline.StageRunner.evaluate`)."""
    config = dataclasses.replace(recipe.eval_config(stages.run / name, model), **changes)
    return stages.evaluate(name, config, models)


def grpo_run(
    stages: Any, recipe: Any, models: Any, name: str, start: str, changes: dict[str, Any], log: Any = print
) -> tuple[dict[str, Any], str]:
    """Stage ``<name>/grpo``: the recipe's GRPO stage from the model folder `start` with `changes` (fields named as
    `agents.config.replace_fields` takes them: ``{"seed": 0, "run.save_every": 20, ...}``), in
    ``<stages.run>/<name>/grpo``; skipped when done.

    Returns:
        ``(info, model)``: the stage's record (`agents.pipeline.StageRunner.stage`: its totals and ``seconds``) and
        the trained model folder (its newest checkpoint).
    """
    from agents.config import TrainConfig, replace_fields
    from agents.pipeline import grpo_stage, latest_model, stage_ignores, stage_settings

    folder = stages.run / name / "grpo"
    config = replace_fields(recipe.grpo_config(folder, start), changes)
    info = stages.stage(
        f"{name}/grpo",
        lambda _: grpo_stage(config, models, log),
        stage_settings(config),
        ignore=stage_ignores(TrainConfig),
    )
    return info, latest_model(folder)


def train_and_score(
    stages: Any,
    recipe: Any,
    models: Any,
    name: str,
    warm: str,
    changes: dict[str, Any],
    *,
    fidelity_limit: int,
    log: Any = print,
) -> dict[str, Any]:
    """One run of an arm: stages ``<name>/grpo`` (the recipe's GRPO stage from `warm` with `changes`, fields named
    as `agents.config.replace_fields` takes them: ``{"seed": 0, "run.save_every": 20, ...}``), ``<name>/eval``
    (the recipe's evaluation on the real backend) and, when `fidelity_limit` > 0, ``<name>/fidelity`` (rehearsal
    fidelity on the first `fidelity_limit` tasks per family). Each is skipped when done.

    Returns:
        ``model`` (the trained model folder), ``eval`` (the evaluation row with ``task_rewards``, task id ->
        reward, and ``where_failed``, `agents.evaluation.failures.where_failed`), ``train`` (`TRAIN_TOTALS` of
        the GRPO stage), ``train_reward`` (`train_reward`), ``fidelity`` (the fidelity evaluation's row, ``{}``
        without one), ``train_s`` and ``eval_s`` (seconds the GRPO and evaluation stages took when they ran).
    """
    from agents.evaluation.failures import where_failed

    out = stages.run
    info, trained = grpo_run(stages, recipe, models, name, warm, changes, log)
    row = evaluate(stages, recipe, models, f"{name}/eval", trained)
    row["task_rewards"] = task_rewards(out / name / "eval")
    row["where_failed"] = where_failed(out / name / "eval")
    fidelity = (
        evaluate(stages, recipe, models, f"{name}/fidelity", trained, fidelity=True, limit=fidelity_limit)
        if fidelity_limit
        else {}
    )
    return {
        "model": trained,
        "eval": row,
        "train": {k: info.get(k, 0) for k in TRAIN_TOTALS},
        "train_reward": train_reward(out / name / "grpo" / "metrics.jsonl"),
        "fidelity": fidelity,
        "train_s": info["seconds"],
        "eval_s": stages.timings[f"{name}/eval"],
    }
