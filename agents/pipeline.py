"""``envace pipeline``: the README's main job, the whole EnvACE recipe at small scale.

Stages, each in its own folder under ``run_dir`` (a re-run resumes: finished stages are skipped, and the
SFT and GRPO trainers resume from their newest checkpoints):

1. ``eval_base/``: the untrained policy against real BFCL backends on ``eval_tasks`` test-split tasks;
2. ``sft/``: warm start on demonstrations built from real executions of the suite's reference solutions
   (BFCL: its ground truth), both roles (ACT:
   the calls; REHEARSE: the real tool results), `agents.sft.SFTTrainer`;
3. ``eval_sft/``: the warm-started policy, same tasks;
4. ``grpo/``: role-wise GRPO over ``EnvACE-Rehearse-v0`` from the SFT checkpoint (the policy both acts and
   rehearses; rewards from replaying its calls on real backends), `agents.trainer.RoleWiseGRPOTrainer`;
5. ``eval_grpo/``: the trained policy, same tasks;
6. ``plots/stages.png`` (accuracy and the fraction of ACT steps that parse as tool calls, per stage) and
   ``grpo/plots/`` (training curves, `agents.plots.report`); ``summary.json`` and a printed table.

The defaults take about 20 minutes on 2 CPU cores with SmolLM2-135M-Instruct (18.3 measured on idle cores): few SFT steps on the shortest demonstrations (prompts alone are 3k-6.5k tokens, the
length cap keeps whole demos), B=1 x K=2 GRPO, 4 evaluation tasks, and ACT budgets (128 tokens, 5 messages per
user turn) that leave every selected task completable (`agents.budgets`, checked before any model loads). A GPU-scale run would instead use all four multi-turn
categories for SFT with no length cap, hundreds of GRPO steps at 16 instructions x K=4 with 20 steps per
turn and 256+ new tokens (the paper: Qwen3-8B, ~470 steps, lr 1e-6), and the whole test split for eval.
"""

from __future__ import annotations

import argparse
import json
import time
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.config import add_dataclass_arguments, config_field, dataclass_from_args

__all__ = ["PipelineConfig", "run_pipeline", "register_pipeline_parser", "STAGES"]

_f = config_field
STAGES = ("eval_base", "sft", "eval_sft", "grpo", "eval_grpo")


@dataclass
class PipelineConfig:
    """Settings of ``envace pipeline``; see each field's help (``envace pipeline --help``)."""

    run_dir: str = _f("runs/demo", "folder of the whole run (one sub-folder per stage)")
    model: str = _f("smollm2-135m", "the policy to start from: 'smollm2-135m', a local HF folder, or 'tiny-random'")
    seed: int = _f(0, "seed of every stage")
    threads: int = _f(2, "torch CPU threads (0: torch's default)")
    suite: str = _f("bfcl", "registered suite (envace_gym.suites) of every stage: demonstrations from its reference solutions, GRPO on its tasks, evaluation on its real backends")
    categories: list[str] = _f(["multi_turn_base"], "suite categories for SFT, GRPO and eval (BFCL: multi-turn categories)")
    # SFT
    sft_steps: int = _f(8, "SFT optimizer steps")
    sft_max_demos: int = _f(16, "SFT demonstrations (the shortest ones that fit sft_max_seq_len)")
    sft_max_seq_len: int = _f(3584, "SFT length cap in tokens; longer demonstrations are dropped, not cut")
    sft_lr: float = _f(1e-4, "SFT learning rate")
    # GRPO
    grpo_steps: int = _f(3, "role-wise GRPO steps")
    grpo_batch_tasks: int = _f(1, "GRPO instructions per step (B)")
    grpo_group_size: int = _f(2, "GRPO group size (K)")
    grpo_lr: float = _f(1e-5, "GRPO learning rate")
    grpo_max_steps_per_turn: int = _f(5, "ACT messages per user turn in GRPO rollouts (BFCL's semantics: a turn that uses them all up truncates the episode with R = 0)")
    max_new_tokens: int = _f(128, "cap on generated tokens per ACT message, in GRPO and evaluation (the longest multi_turn_base ground-truth call is 114 SmolLM2 tokens)")
    rehearse_max_new_tokens: int = _f(64, "cap on generated tokens per rehearsed tool response in GRPO")
    # eval
    eval_tasks: int = _f(4, "BFCL test-split tasks per category for each evaluation")
    eval_max_steps_per_turn: int = _f(5, "ACT messages per user turn during evaluation")
    min_solvable_fraction: float = _f(0.9, "refuse to start when fewer of the GRPO or evaluation tasks than this can be completed within their step and token budgets (agents.budgets; checked before any model loads)")

    REMOVED_FIELDS: typing.ClassVar[dict[str, str]] = {
        "grpo_max_rollout_steps": "it capped every GRPO episode at that many ACT messages in total with R = 0 after; "
                                  "use grpo_max_steps_per_turn (a limit per user turn, BFCL's semantics)",
    }

    def __post_init__(self) -> None:
        from agents.config import coerce_fields

        coerce_fields(self)
        if self.seed < 0 or self.threads < 0:
            raise ValueError(f"invalid PipelineConfig: seed and threads must be >= 0, got {self.seed}, {self.threads}")
        for name in ("sft_lr", "grpo_lr"):
            if getattr(self, name) <= 0:
                raise ValueError(f"invalid PipelineConfig: {name} must be > 0, got {getattr(self, name)}")
        for name in ("sft_steps", "sft_max_demos", "sft_max_seq_len", "grpo_steps", "grpo_batch_tasks",
                     "max_new_tokens", "rehearse_max_new_tokens", "eval_tasks", "eval_max_steps_per_turn",
                     "grpo_max_steps_per_turn"):
            if getattr(self, name) < 1:
                raise ValueError(f"invalid PipelineConfig: {name} must be >= 1, got {getattr(self, name)}")
        if self.grpo_group_size < 2:
            raise ValueError("invalid PipelineConfig: grpo_group_size K must be >= 2 (K = 1 makes every advantage 0)")
        if not 0 <= self.min_solvable_fraction <= 1:
            raise ValueError(f"invalid PipelineConfig: min_solvable_fraction must be in [0, 1], got {self.min_solvable_fraction}")
        from envace_gym.suites import registered_suites

        if self.suite not in registered_suites():
            raise ValueError(f"invalid PipelineConfig: suite must be one of {registered_suites()}, got {self.suite!r}")


def _stage_done(folder: Path) -> bool:
    return (folder / "stage_done.json").is_file()


def _mark_done(folder: Path, info: dict[str, Any]) -> None:
    (folder / "stage_done.json").write_text(json.dumps(info, indent=1))


def _latest_model(run_dir: Path) -> str:
    from agents.checkpoint import latest_checkpoint

    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        raise FileNotFoundError(f"no checkpoint in {run_dir}")
    return str(ckpt / "model")


def _shortest_demo_ids(config: PipelineConfig, tokenizer: Any) -> list[str]:
    """Train-split task ids whose whole demonstration fits the SFT length cap, shortest first."""
    from agents.demonstrations import build_demonstrations

    demos, _ = build_demonstrations(
        tokenizer, config.suite, config.categories, "train", max_tokens=config.sft_max_seq_len, overflow="drop", progress=False
    )
    demos.sort(key=lambda d: len(d.token_ids))
    return [d.task.id for d in demos[: config.sft_max_demos]]


def _eval_config(config: PipelineConfig, model: str, out: Path | str) -> Any:
    from agents.evaluate import EvalConfig

    return EvalConfig(
        model=model, suite=config.suite, categories=list(config.categories), split="test", limit=config.eval_tasks,
        max_new_tokens=config.max_new_tokens, temperature=0.0, max_steps_per_turn=config.eval_max_steps_per_turn,
        seed=config.seed, out=str(out), min_solvable_fraction=config.min_solvable_fraction,
    )


def _grpo_config(config: PipelineConfig, init: str, out: Path | str) -> Any:
    from agents.config import TrainConfig

    return TrainConfig(
        run_dir=str(out), seed=config.seed, init=init, suite=config.suite, categories=list(config.categories), split="train",
        num_steps=config.grpo_steps, batch_tasks=config.grpo_batch_tasks, group_size=config.grpo_group_size,
        max_new_tokens=config.max_new_tokens, rehearse_max_new_tokens=config.rehearse_max_new_tokens,
        max_steps_per_turn=config.grpo_max_steps_per_turn, lr=config.grpo_lr, save_every=config.grpo_steps,
        min_solvable_fraction=config.min_solvable_fraction, threads=config.threads,
    )


def check_budgets(config: PipelineConfig, log=print) -> dict[str, Any]:
    """The solvable fractions of the GRPO and evaluation tasks under the pipeline's budgets, before any model loads.

    Returns ``{"grpo": report, "eval": report}`` as dicts (`agents.budgets.BudgetReport.to_dict`).

    Raises:
        agents.budgets.BudgetError: a stage's fraction is below ``min_solvable_fraction`` (the message names the
            pipeline option to raise).
    """
    from agents.evaluate import _select_tasks
    from agents.budgets import check_task_budgets
    from agents.trainer import _load_tokenizer_of
    from envace_gym.suites import make_suite

    tokenizer = _load_tokenizer_of(config.model)
    grpo = check_task_budgets(
        make_suite(config.suite).tasks(config.categories, "train"), config.suite, tokenizer,
        max_steps_per_turn=config.grpo_max_steps_per_turn, max_new_tokens=config.max_new_tokens, max_episode_tokens=None,
        min_fraction=config.min_solvable_fraction, command="envace pipeline (grpo stage, train split)",
        names={"max_steps_per_turn": "--grpo-max-steps-per-turn"}, log=log,
    )
    ev = check_task_budgets(
        _select_tasks(_eval_config(config, config.model, "unused")), config.suite, tokenizer,
        max_steps_per_turn=config.eval_max_steps_per_turn, max_new_tokens=config.max_new_tokens, max_episode_tokens=None,
        min_fraction=config.min_solvable_fraction, command="envace pipeline (eval stages, test split)",
        names={"max_steps_per_turn": "--eval-max-steps-per-turn"}, log=log,
    )
    return {"grpo": grpo.to_dict(), "eval": ev.to_dict()}


def _evaluate(config: PipelineConfig, model: str, out: Path, log) -> dict[str, Any]:
    from agents.evaluate import evaluate

    result = evaluate(_eval_config(config, model, out), log=None, progress=True)
    overall = result.summary[-1]
    row = {"accuracy": float(overall["accuracy"]), "tool_call_fraction": float(overall["tool_call_fraction"]),
           "parse_errors_per_task": float(overall["parse_errors_per_task"]), "n_tasks": len(result.episodes)}
    log(f"[pipeline] {out.name}: accuracy {row['accuracy']:.3f}, ACT steps parsed as tool calls "
        f"{row['tool_call_fraction']:.3f}, parse errors/task {row['parse_errors_per_task']:.2f}")
    return row


def plot_stages(rows: dict[str, dict[str, Any]], path: str | Path) -> Path:
    """Bars of accuracy and tool-call fraction per evaluated stage (``rows``: stage -> eval row)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stages = list(rows)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    width = 0.38
    xs = range(len(stages))
    acc = ax.bar([x - width / 2 for x in xs], [rows[s]["accuracy"] for s in stages], width, label="accuracy (real backends)")
    calls = ax.bar([x + width / 2 for x in xs], [rows[s]["tool_call_fraction"] for s in stages], width,
                   label="ACT steps parsed as tool calls")
    for bars in (acc, calls):  # values printed, so a zero bar is still readable
        ax.bar_label(bars, fmt="%.2f", fontsize=8)
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


def run_pipeline(config: PipelineConfig, log=print) -> dict[str, Any]:
    """Run (or resume) every stage; returns the summary that is also written to ``run_dir/summary.json``."""
    import torch

    from agents.models import load_tokenizer
    from agents.plots import report
    from agents.sft import SFTConfig, SFTTrainer
    from agents.trainer import RoleWiseGRPOTrainer

    if config.threads:
        torch.set_num_threads(config.threads)
    budgets = check_budgets(config, log)
    run = Path(config.run_dir)
    run.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    evals: dict[str, dict[str, Any]] = {}

    def stage(name: str, fn) -> None:
        folder = run / name
        folder.mkdir(parents=True, exist_ok=True)
        if _stage_done(folder):
            info = json.loads((folder / "stage_done.json").read_text())
            timings[name] = info.get("seconds", 0.0)
            if "eval" in info:
                evals[name] = info["eval"]
            log(f"[pipeline] {name}: already done, skipped")
            return
        log(f"[pipeline] {name} ...")
        t0 = time.perf_counter()
        info = fn(folder) or {}
        info["seconds"] = timings[name] = time.perf_counter() - t0
        if "eval" in info:
            evals[name] = info["eval"]
        _mark_done(folder, info)
        log(f"[pipeline] {name}: done in {timings[name]:.0f} s")

    stage("eval_base", lambda out: {"eval": _evaluate(config, config.model, out, log)})

    def sft(out: Path) -> dict[str, Any]:
        ids = _shortest_demo_ids(config, load_tokenizer() if config.model in ("smollm2-135m", "tiny-random")
                                 else load_tokenizer(config.model))
        log(f"[pipeline] sft on {len(ids)} demonstrations of real executions")
        trainer = SFTTrainer(SFTConfig(
            run_dir=str(out), model=config.model, seed=config.seed, data=[config.suite], categories=list(config.categories),
            split="train", task_ids=ids, max_seq_len=config.sft_max_seq_len, overflow="drop",
            max_steps=config.sft_steps, batch_tokens=config.sft_max_seq_len, max_batch_rows=1,
            lr=config.sft_lr, lr_schedule="constant", save_every=config.sft_steps,
        ))
        history = trainer.train()
        return {"last": history[-1] if history else None, "task_ids": ids}

    stage("sft", sft)
    sft_model = _latest_model(run / "sft")
    stage("eval_sft", lambda out: {"eval": _evaluate(config, sft_model, out, log)})

    def grpo(out: Path) -> dict[str, Any]:
        trainer = RoleWiseGRPOTrainer(_grpo_config(config, sft_model, out), log=lambda *_: None)
        history = trainer.train()
        groups = [h["rollout/groups_with_reward_variance"] for h in history]
        log(f"[pipeline] grpo: groups with non-zero reward variance per step: {groups} "
            f"(of {config.grpo_batch_tasks} per step)")
        return {"last": history[-1] if history else None, "groups_with_reward_variance": groups}

    stage("grpo", grpo)
    grpo_model = _latest_model(run / "grpo")
    stage("eval_grpo", lambda out: {"eval": _evaluate(config, grpo_model, out, log)})

    plots = [str(p) for p in report(run / "grpo")]
    plots.append(str(plot_stages({k.replace("eval_", ""): v for k, v in evals.items()}, run / "plots" / "stages.png")))
    summary = {"config": config.__dict__, "budgets": budgets, "evals": evals, "seconds": timings, "plots": plots,
               "total_seconds": sum(timings.values())}
    (run / "summary.json").write_text(json.dumps(summary, indent=1))
    log("")
    log(f"{'stage':<10} {'accuracy':>9} {'tool-call fraction':>19} {'parse errors/task':>18} {'seconds':>8}")
    for name in STAGES:
        row = evals.get(name)
        if row is not None:
            log(f"{name:<10} {row['accuracy']:>9.3f} {row['tool_call_fraction']:>19.3f} "
                f"{row['parse_errors_per_task']:>18.2f} {timings.get(name, 0):>8.0f}")
        else:
            log(f"{name:<10} {'':>9} {'':>19} {'':>18} {timings.get(name, 0):>8.0f}")
    log(f"[pipeline] total {summary['total_seconds'] / 60:.1f} min; plots: {', '.join(plots)}")
    return summary


def cmd_pipeline(args: argparse.Namespace) -> int:
    """``envace pipeline``."""
    run_pipeline(dataclass_from_args(PipelineConfig, args))
    return 0


def register_pipeline_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``pipeline`` sub-command (every option a `PipelineConfig` field)."""
    p = sub.add_parser("pipeline", help="the main job: eval, SFT warm start, role-wise GRPO, eval, plots")
    add_dataclass_arguments(p, PipelineConfig)
    p.set_defaults(func=cmd_pipeline)
    return p
