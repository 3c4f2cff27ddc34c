"""Supervised warm-start of both roles: `SFTConfig`, `SFTTrainer`, ``envace sft``, and
the measurement helpers (`demo_logprobs`, `act_parse_rate`, `measure`).

Training data are token-level `Trajectory` objects from `agents.training.demonstrations` (real BFCL executions, or
recorded rollouts filtered by reward): token in, token out, nothing is re-rendered. The loss is token-level
cross-entropy on the ACT and REHEARSE tokens (docs/design.md §3: only those roles carry loss); prompt,
template and observation tokens are masked.

Implementation details:

1. Log-likelihoods come from `agents.training.logprobs.token_logprobs` (decoder once, LM head in checkpointed
   chunks; the ``(N, T, V)`` logits are never built). Position t holds ``log p(ids[t] | ids[:t])``, so a
   token's role in ``role_mask`` says whether that token is a target.
2. Per-token weights ``w = act_weight`` on ACT tokens, ``rehearse_weight`` on REHEARSE tokens (only for the
   roles in ``--roles``), 0 elsewhere (PROMPT, TEMPLATE, OBSERVATION, padding). Two normalisations
   (``--loss-normalization``):
   ``token`` (default): ``loss = -(w * logprobs).sum() / w.sum()``, a weighted mean over the batch's target
   tokens, so a role's share of the gradient grows with its token count (BFCL demos: about 1.6 ACT tokens
   per REHEARSE token on multi_turn_base, far fewer on long_context, whose file contents are long);
   ``role``: ``loss = sum_r w_r * mean_r(-logprobs) / sum_r w_r`` over the roles present in the batch,
   so each role weighs the same whatever its token count.
   ``--prompt-weight`` > 0 adds the leading prompt (system and first user message, `leading_prompt_mask`) as
   a third target of that weight: language-model loss on the prompt, for models trained from scratch.
3. Batches are built by token budget with length bucketing: sequences are sorted by length and cut
   greedily into batches of at most ``batch_tokens`` padded tokens (rows x longest row) and
   ``max_batch_rows`` rows; a sequence longer than the budget is a batch of its own. The batch order is
   shuffled per epoch with a generator seeded by (seed, epoch), so step s always sees the same batch and a
   resumed run continues exactly. ``data/padding_fraction`` is logged per step. ``--group-by-length false``
   instead cuts a fresh per-epoch permutation into batches of one fixed row count (Hugging Face's
   ``group_by_length=False``): more padding, but every batch mixes lengths and so task families, which a
   model trained from scratch needs (length-sorted batches of one family each pull it back and forth).
4. AdamW, gradient clipping, and the GRPO trainer's schedule (`agents.training.optim.make_lr_scheduler`: linear
   warmup then constant, linear or cosine decay over the total steps), set by the ``--optim.*`` options, the
   same `agents.config.OptimConfig` as ``envace train``'s.
5. LoRA (``--lora``, needs ``pip install envace-gym[lora]``): peft adapters on the attention and MLP
   projections; only they are trained and the optimizer holds only their state. A checkpoint's
   ``model/`` is the adapter merged into a copy of the base (a plain Hugging Face folder, valid as
   ``envace train --init``); ``adapter/`` holds the peft adapter, which is what resume loads (on top of
   the original ``--model``/``--init`` weights), so LoRA resume is exact too.
6. Checkpoints use `agents.training.checkpoint.save_checkpoint` (same layout as `RoleWiseGRPOTrainer`); resume
   restores weights, optimizer, scheduler and RNG from the newest one.

Metrics (one JSON line per step in ``run_dir/metrics.jsonl``), ρ in {act, rehearse}:

| key | definition |
|---|---|
| ``train/loss`` | the optimised loss (detail 2) |
| ``train/loss/ρ`` | mean ``-log p`` over the batch's ρ tokens (0 when none) |
| ``train/grad_norm`` | total gradient norm before clipping |
| ``train/lr`` | learning rate used by this step |
| ``data/tokens/ρ`` | ρ target tokens in the batch |
| ``data/rows``, ``data/seq_len`` | rows and padded length of the batch |
| ``data/padding_fraction`` | padding positions / (rows x padded length) |
| ``perf/tokens_per_s`` | real (non-padding) tokens / step seconds |
| ``perf/step_s`` | wall seconds of the step |

Sources: supervised warm-start before RL as in EnvACE (Xu et al., 2026, arXiv 2608.06197; docs/design.md §1);
LoRA: Hu et al., 2021 (arXiv 2106.09685), via Hugging Face peft.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import time
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import torch

from agents.config import (
    MemoryConfig,
    OptimConfig,
    RunConfig,
    coerce_fields,
    config_field,
    nested_config_field,
)
from agents.models import ModelStore, default_store
from agents.rollout import PAD_ROLE
from agents.training.distributed import DataParallel, as_float
from agents.training.optim import apply_optimizer_settings, bucket_batches, make_lr_scheduler, prepare_process
from envace_gym.types import Role, Task, Trajectory

__all__ = [
    "SFTConfig",
    "SFTTrainer",
    "bucket_batches",
    "collate",
    "role_weights",
    "sft_loss",
    "demo_logprobs",
    "act_parse_rate",
    "measure",
]

_ROLE_NAMES = {"act": Role.ACT, "rehearse": Role.REHEARSE}
Normalization = Literal["token", "role"]


_f = config_field


@dataclass
class SFTConfig:
    """Settings of an ``envace sft`` run; see each field's help (``envace sft --help``)."""

    # --- Parameters that control the experiment -------------------------------------------------------
    run_dir: str = _f("runs/sft", "folder for checkpoints, metrics.jsonl, config.json and data_stats.json")
    seed: int = _f(0, "seed of the batch order (per epoch), of LoRA initialisation and of the --error-demos draws")
    model: str = _f(
        "smollm2-135m",
        (
            "model to fine-tune: 'smollm2-135m', 'lab-tiny', 'smollm2-lab', a local Hugging Face folder, or "
            "'tiny-random'"
        ),
    )
    init: str | None = _f(None, "start from this folder (e.g. a checkpoint's model/) instead of --model")
    run: RunConfig = nested_config_field(RunConfig, "checkpoints, resume and the machine (RunConfig)", save_every=50)

    # --- Parameters that control the data -------------------------------------------------------------
    data: list[str] = _f(
        ["bfcl"],
        (
            "sources: a registered suite name such as 'bfcl' (real executions of its reference solutions) and/or JSONL "
            "files from RecordTrajectories(include_tokens=True)"
        ),
    )
    categories: list[str] | None = _f(
        None, "categories of the suite sources (none given: each suite's default, BFCL's multi_turn_base)"
    )
    split: str = _f("train", "split of the suite sources: train, test or all")
    task_ids: list[str] = _f(
        [], "only these task ids of the suite sources (empty: every task of the categories and split)"
    )
    max_demos: int = _f(
        0,
        "cap on the number of training sequences, taken in the order of --data (0: no cap); data_stats.json says "
        "how many of each source it cut",
    )
    min_reward: float = _f(1.0, "JSONL sources: keep records with reward >= this (rejection sampling)")
    calls_per_message: Literal["one", "all"] = _f(
        "one", "BFCL demos: one ground-truth call per ACT message, or all of a turn's calls in one"
    )
    error_demos: int = _f(
        0,
        "suite sources: per task, up to this many extra demonstrations with one mistaken call "
        "played on the real backend (its ACT tokens carry no loss, its error output is a REHEARSE "
        "target; an item that breaks ends the demonstration); drawn from --seed; needs a suite "
        "that proposes mistakes (lab); 0: off",
    )
    max_seq_len: int = _f(
        6144,
        (
            "length cap in tokens (BFCL prompts alone are 2.9k-7.7k SmolLM2 tokens; 6144 holds 92.7% of the "
            "multi_turn_base train demonstrations whole)"
        ),
    )
    overflow: Literal["truncate", "drop"] = _f(
        "truncate", "longer sequences: keep the first max_seq_len tokens, or drop them"
    )
    min_solvable_fraction: float = _f(
        0.9,
        (
            "refuse to start when fewer of the selected demonstrations than this fit max_seq_len whole (a cut one "
            "never shows its task completed); checked before the model loads"
        ),
    )

    # --- Parameters that control the loss -------------------------------------------------------------
    roles: str = _f("act,rehearse", "comma-separated roles that carry loss: act, rehearse")
    act_weight: float = _f(1.0, "loss weight of ACT tokens")
    rehearse_weight: float = _f(1.0, "loss weight of REHEARSE tokens")
    prompt_weight: float = _f(
        0.0,
        (
            "loss weight of the leading prompt's tokens (system and first user message), for models trained from "
            "scratch: predicting the prompt itself (an instruction naming items of the layout) is where a small model "
            "learns to copy; 0: off"
        ),
    )
    loss_normalization: Literal["token", "role"] = _f(
        "token", "'token': weighted mean over target tokens; 'role': weighted mean of per-role means"
    )

    # --- Parameters that control the optimisation -----------------------------------------------------
    num_epochs: int = _f(1, "passes over the data (ignored when max_steps > 0)")
    max_steps: int = _f(0, "optimizer steps to run (0: num_epochs x batches per epoch)")
    batch_tokens: int = _f(8192, "token budget per batch: rows x padded length (length bucketing)")
    max_batch_rows: int = _f(8, "cap on rows per batch")
    group_by_length: bool = _f(
        True,
        "length-bucketed batches (less padding); off: shuffled batches of "
        "min(max_batch_rows, max(1, batch_tokens // longest sequence)) rows",
    )
    optim: OptimConfig = nested_config_field(
        OptimConfig,
        "AdamW and its learning-rate schedule (OptimConfig)",
        lr=2e-5,
        weight_decay=0.0,
        lr_schedule="cosine",
    )

    # --- Parameters that control memory ---------------------------------------------------------------
    memory: MemoryConfig = nested_config_field(MemoryConfig, "time traded for memory (MemoryConfig)")
    lora: bool = _f(False, "train LoRA adapters instead of every weight (needs peft: pip install envace-gym[lora])")
    lora_r: int = _f(16, "LoRA rank")
    lora_alpha: float = _f(32.0, "LoRA alpha (the update is scaled by alpha / r)")
    lora_dropout: float = _f(0.0, "LoRA dropout")
    lora_target_modules: list[str] = _f(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], "module names that get adapters"
    )

    def __post_init__(self) -> None:
        def fail(msg: str) -> None:
            raise ValueError(f"invalid SFTConfig: {msg}")

        coerce_fields(self)
        if not self.model.strip():
            fail("model must name a model ('smollm2-135m', a local folder or 'tiny-random'), got ''")
        if self.seed < 0:
            fail(f"seed must be >= 0, got {self.seed}")
        from envace_gym.suites import make_suite, registered_suites

        suites = registered_suites()
        missing = [d for d in self.data if d not in suites and not Path(d).is_file()]
        if missing:
            fail(
                f"data: no JSONL file at {missing} (give a suite name, one of {suites}, or files written by "
                "RecordTrajectories)"
            )
        for source in self.data_suites():
            try:
                suite = make_suite(source)
                suite.tasks(self.categories, self.split)
            except ValueError as err:
                fail(f"categories of data source {source!r}: {err}")

        for name in ("num_epochs", "batch_tokens", "max_batch_rows", "max_seq_len", "lora_r"):
            if getattr(self, name) < 1:
                fail(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("max_steps", "max_demos", "error_demos"):
            if getattr(self, name) < 0:
                fail(f"{name} must be >= 0, got {getattr(self, name)}")
        if min(self.act_weight, self.rehearse_weight, self.prompt_weight) < 0:
            fail("act_weight, rehearse_weight and prompt_weight must be >= 0")
        for name in ("calls_per_message", "overflow", "loss_normalization"):
            allowed = typing.get_args(_HINTS[name])
            if getattr(self, name) not in allowed:
                fail(f"{name} must be one of {list(allowed)}, got {getattr(self, name)!r}")
        roles = self.role_list()
        if not roles:
            fail("--roles is empty; give act, rehearse or act,rehearse")
        weights = {"act": self.act_weight, "rehearse": self.rehearse_weight}
        if all(weights[r] == 0 for r in roles):
            fail(f"every role in --roles {self.roles!r} has weight 0; nothing would be trained")
        if self.split not in ("train", "test", "all"):
            fail(f"split must be train, test or all, got {self.split!r}")
        if not self.data:
            fail("--data is empty; give a suite name such as 'bfcl' and/or JSONL files")
        if not 0 <= self.min_solvable_fraction <= 1:
            fail(f"min_solvable_fraction must be in [0, 1], got {self.min_solvable_fraction}")

    def check_error_demos(self) -> None:
        """Raise unless every suite of `data` proposes mistakes when ``error_demos`` > 0. Checked when training
        starts (`SFTTrainer`) rather than in ``__post_init__``: ``envace pipeline`` builds its SFT stage's
        config before setting ``data`` to its own suite, and checks that suite itself.

        Raises:
            ValueError: a suite of `data` has no ``Suite.mutations``.
        """
        from envace_gym.suites import make_suite, proposes_mistakes

        for source in self.data_suites() if self.error_demos else []:
            if not proposes_mistakes(make_suite(source)):
                raise ValueError(
                    f"invalid SFTConfig: error_demos: suite {source!r} proposes no mistakes (no Suite.mutations); "
                    "set --error-demos 0"
                )

    def data_suites(self) -> list[str]:
        """The ``data`` sources that name a registered suite (the others are JSONL files)."""
        from envace_gym.suites import registered_suites

        suites = registered_suites()
        return [d for d in self.data if d in suites and not Path(d).is_file()]

    def role_list(self) -> list[str]:
        """The loss roles as lower-case names.

        Raises:
            ValueError: an unknown role name.
        """
        names = [r.strip().lower() for r in self.roles.split(",") if r.strip()]
        bad = [r for r in names if r not in _ROLE_NAMES]
        if bad:
            raise ValueError(f"invalid SFTConfig: unknown role(s) {bad} in --roles; valid: act, rehearse")
        return list(dict.fromkeys(names))

    def to_dict(self) -> dict[str, Any]:
        """Every field, JSON-compatible."""
        return dataclasses.asdict(self)

    RESUME_IGNORES: typing.ClassVar[tuple[str, ...]] = (
        "run_dir",
        "run",
        "memory",
        "min_solvable_fraction",
        "max_steps",
        "num_epochs",
    )
    """Fields that may change between a run and its resume; any other difference refuses (see `TrainConfig`)."""


_HINTS = typing.get_type_hints(SFTConfig)


# ---------------------------------------------------------------------------------------------------------
# Batching and the loss (pure functions)
# ---------------------------------------------------------------------------------------------------------


def collate(examples: Sequence[Trajectory], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``(input_ids, attention_mask, role_mask)``, each ``(N, T) int64``.

    ``role_mask`` holds the `Role` value of each token and `agents.rollout.PAD_ROLE` (-1) on padding, as in
    `agents.rollout.RolloutBatch`.

    Raises:
        ValueError: no examples.
    """
    if not examples:
        raise ValueError("collate needs at least one example")
    t_max = max(1, max(len(e.token_ids) for e in examples))
    n = len(examples)
    input_ids = torch.full((n, t_max), int(pad_id), dtype=torch.long)  # (N, T)
    attention_mask = torch.zeros((n, t_max), dtype=torch.long)  # (N, T)
    role_mask = torch.full((n, t_max), PAD_ROLE, dtype=torch.long)  # (N, T)
    for r, e in enumerate(examples):
        ids = e.token_ids
        if ids:
            input_ids[r, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            attention_mask[r, : len(ids)] = 1
            role_mask[r, : len(ids)] = torch.tensor(e.role_mask, dtype=torch.long)
    return input_ids, attention_mask, role_mask


def role_weights(role_mask: torch.Tensor, weights: dict[Role, float]) -> torch.Tensor:
    """``(N, T) float32`` per-token loss weights: ``weights[role]`` on tokens of those roles, 0 elsewhere."""
    w = torch.zeros(role_mask.shape, dtype=torch.float32, device=role_mask.device)  # (N, T)
    for role, value in weights.items():
        w = torch.where(role_mask == int(role), torch.as_tensor(float(value), device=w.device), w)  # (N, T)
    return w


def leading_prompt_mask(role_mask: torch.Tensor) -> torch.Tensor:
    """``(N, T) bool``: the run of PROMPT tokens each row starts with (the system and first user message, up to
    the template's first assistant opener), position 0 excluded (no logit predicts it). A mistaken call that
    error demonstrations relabel PROMPT comes after a TEMPLATE opener, so it is never in this run."""
    leading = torch.cumprod((role_mask == int(Role.PROMPT)).long(), dim=1).bool()  # (N, T)
    leading[:, 0] = False
    return leading


def sft_loss(
    logprobs: torch.Tensor,
    role_mask: torch.Tensor,
    weights: dict[Role, float],
    normalization: Normalization = "token",
    counts: dict[Role, float] | None = None,
    prompt_weight: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Weighted token-level cross-entropy on the target roles (implementation detail 2).

    Args:
        logprobs: ``(N, T) float32``, ``log p(ids[t] | ids[:t])`` (`agents.training.logprobs.token_logprobs`).
        role_mask: ``(N, T) int64`` `Role` values, `PAD_ROLE` on padding.
        weights: loss weight per target role, e.g. ``{Role.ACT: 1.0, Role.REHEARSE: 1.0}``; roles not in it
            carry no loss.
        normalization: ``"token"`` or ``"role"``.
        counts: each weighted role's token count in the whole batch when these rows are one data-parallel
            shard of it (summed over the ranks), so the shards' losses and ``loss/<role>`` add up to the
            whole batch's; None: this batch's own counts.
        prompt_weight: > 0 adds the leading prompt's tokens (`leading_prompt_mask`) as targets of this weight,
            like a third role (``loss/prompt``, ``tokens/prompt`` in the stats); not with `counts`.

    Returns:
        ``(loss, stats)``: a scalar tensor (0 with a graph when there is no target token), and
        ``loss/<role>`` (mean ``-log p`` over that role's tokens) and ``tokens/<role>`` (this batch's) for
        each role in `weights`.

    Raises:
        ValueError: an unknown normalisation, a non-target role in `weights`, or mismatched shapes.
    """
    if logprobs.shape != role_mask.shape:
        raise ValueError(f"logprobs {tuple(logprobs.shape)} and role_mask {tuple(role_mask.shape)} must match")
    if normalization not in ("token", "role"):
        raise ValueError(f"normalization must be 'token' or 'role', got {normalization!r}")
    for role in weights:
        if not Role(role).trainable:
            raise ValueError(f"only ACT and REHEARSE tokens carry loss, got a weight for {Role(role).name}")
    if prompt_weight and counts is not None:
        raise ValueError("prompt_weight is not supported on data-parallel shards (counts given)")
    stats: dict[str, float] = {}
    means: dict[Any, torch.Tensor] = {}
    prompt = leading_prompt_mask(role_mask) if prompt_weight else None  # (N, T)
    if prompt is not None:
        n_prompt = float(prompt.sum())
        stats["tokens/prompt"] = n_prompt
        stats["loss/prompt"] = float(-(logprobs * prompt).sum().detach() / n_prompt) if n_prompt else 0.0
    for role in weights:
        sel = role_mask == int(role)  # (N, T)
        key = Role(role).name.lower()
        stats[f"tokens/{key}"] = float(sel.sum())
        n = float(sel.sum()) if counts is None else float(counts[role])
        if n:
            means[role] = -(logprobs * sel).sum() / n
            stats[f"loss/{key}"] = float(means[role].detach())
        else:
            stats[f"loss/{key}"] = 0.0
    if normalization == "token":
        w = role_weights(role_mask, weights)  # (N, T)
        if prompt is not None:
            w = w + prompt_weight * prompt.float()
        total = float(w.sum()) if counts is None else sum(float(weights[r]) * float(counts[r]) for r in weights)
        loss = -(w * logprobs).sum() / total if total > 0 else (logprobs * 0.0).sum()
    else:
        present = [r for r in means if weights[r] > 0]
        mix: dict[Any, float] = dict(weights)  # the roles' weights, and the prompt's (a third "role")
        if prompt is not None and float(prompt.sum()):
            means["prompt"] = -(logprobs * prompt).sum() / float(prompt.sum())
            mix["prompt"] = prompt_weight
            present.append("prompt")
        denom = sum(mix[r] for r in present)
        # a sum of tensors when `present` is not empty
        loss = (
            cast(torch.Tensor, sum(mix[r] * means[r] for r in present)) / denom if present else (logprobs * 0.0).sum()
        )
    stats["loss"] = float(loss.detach())
    return loss, stats


# ---------------------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------------------


def load_sft_data(config: SFTConfig, tokenizer: Any, progress: bool = False) -> tuple[list[Trajectory], dict[str, Any]]:
    """The training sequences of `config` (``data`` sources, length cap) and per-source `DemoStats` dicts.

    ``max_demos`` caps the joined sequences in the order of ``data`` (a suite source also stops building at it), so a
    later source can lose some or all of its sequences; each source's dict says how many in ``cut_by_max_demos``.

    Raises:
        ValueError: no sequence at all, or the errors of `agents.training.demonstrations`.
    """
    from agents.training.demonstrations import build_demonstrations, load_recorded_trajectories
    from envace_gym.rendering import ChatRenderer

    stops = ChatRenderer(tokenizer).stop_token_ids
    demos: list[Trajectory] = []
    stats: dict[str, Any] = {}
    suites = config.data_suites()
    for source in config.data:
        if source in suites:
            got, st = build_demonstrations(
                tokenizer,
                source,
                config.categories,
                config.split,
                task_ids=config.task_ids or None,
                limit=config.max_demos or None,
                max_tokens=config.max_seq_len,
                overflow=config.overflow,
                calls_per_message=config.calls_per_message,
                progress=progress,
                mutations=config.error_demos,
                seed=config.seed,
            )
        else:
            got, st = load_recorded_trajectories(
                source, stops, min_reward=config.min_reward, max_tokens=config.max_seq_len, overflow=config.overflow
            )
        start = len(demos)
        demos.extend(got)
        stats[source] = st.to_dict()
        stats[source]["cut_by_max_demos"] = max(0, len(demos) - max(start, config.max_demos)) if config.max_demos else 0
    if config.max_demos:
        demos = demos[: config.max_demos]
    if not demos:
        raise ValueError(f"no training sequences from {config.data} (stats: {json.dumps(stats)[:500]})")
    return demos, stats


# ---------------------------------------------------------------------------------------------------------
# The trainer
# ---------------------------------------------------------------------------------------------------------


def whole_fraction(stats: dict[str, Any]) -> tuple[int, int]:
    """``(whole, candidates)`` over `load_sft_data`'s per-source stats: demonstrations that fit the length cap
    whole, of those the sources produced before the cap (kept + dropped by it)."""
    whole = sum(st["kept"] - st["truncated"] for st in stats.values())
    candidates = sum(st["kept"] + st["dropped_length"] for st in stats.values())
    return whole, candidates


def require_whole_demos(config: SFTConfig, stats: dict[str, Any], log=print) -> None:
    """Print how many selected demonstrations fit ``max_seq_len`` whole; raise below ``min_solvable_fraction``.

    Raises:
        agents.training.budgets.BudgetError: the fraction is below ``config.min_solvable_fraction``.
    """
    from agents.training.budgets import BudgetError

    whole, candidates = whole_fraction(stats)
    fraction = whole / candidates if candidates else 1.0
    if log is not None:
        log(
            f"[budget] envace sft: {whole}/{candidates} ({100 * fraction:.1f}%) of the selected demonstrations fit "
            f"--max-seq-len={config.max_seq_len} whole"
        )
    if fraction < config.min_solvable_fraction:
        raise BudgetError(
            f"envace sft: only {100 * fraction:.1f}% of the {candidates} selected demonstrations fit --max-seq-len="
            f"{config.max_seq_len} whole, below --min-solvable-fraction={config.min_solvable_fraction}; a cut "
            f"demonstration never shows its task completed. Raise --max-seq-len, select shorter tasks (--task-ids), "
            f"or lower --min-solvable-fraction to start anyway."
        )


def _require_peft():
    try:
        import peft  # noqa: F401
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("--lora needs peft: pip install 'envace-gym[lora]' (or pip install 'peft>=0.12')") from err
    return peft


class SFTTrainer:
    """Supervised fine-tuning of ACT and REHEARSE tokens; see the module docstring.

    Args:
        config: a validated `SFTConfig`.
        demos: the training sequences; None loads them from ``config.data`` (`load_sft_data`).
        log: where progress lines go.
        models: the `agents.models.ModelStore` the tokenizer and starting weights come from (None: the default
            store); the trained model is a fresh copy.
        parallel: the data-parallel processes (`agents.training.distributed.DataParallel`; None: from the launcher's
            environment). With W processes, rank r trains rows r, r + W, ... of each step's batch, the loss
            divides by the whole batch's token counts and gradients are all-reduced, so every rank applies
            the step one process would; rank 0 alone writes the run folder.

    Attributes:
        model: the trained module (a peft model with ``--lora``).
        tokenizer, pad_id: the tokenizer and its padding id.
        demos: the training sequences.
        batches_per_epoch: number of batches of one epoch; ``total_steps`` the run's optimizer steps.
        step: completed optimizer steps (restored on resume).

    Raises:
        ValueError: no training sequence, or no target token in any sequence for the chosen roles.
        agents.training.budgets.BudgetError: fewer than ``min_solvable_fraction`` of the demonstrations loaded from
            ``config.data`` fit ``max_seq_len`` whole (checked before the model loads; not for `demos`).
        ImportError: ``lora=True`` without peft installed.
    """

    def __init__(
        self,
        config: SFTConfig,
        demos: Sequence[Trajectory] | None = None,
        log=print,
        models: ModelStore | None = None,
        parallel: DataParallel | None = None,
    ) -> None:
        from agents.training.checkpoint import load_newest
        from agents.training.logprobs import TokenLogprobs, enable_gradient_checkpointing
        from agents.training.run_folder import RunLock, check_resume_config, trim_jsonl

        config.check_error_demos()  # before any model loads
        self.config = config
        self.parallel = parallel = parallel or DataParallel.from_environment(config.run.device)
        if not parallel.is_main:
            log = None
        self.run_dir = Path(config.run_dir)
        models = models or default_store()
        self._lock = None
        if parallel.distributed and config.prompt_weight:
            raise ValueError(
                "prompt_weight > 0 runs in one process only (its token count is not summed over "
                "ranks); set --prompt-weight 0 or drop the launcher"
            )
        if parallel.is_main:  # rank 0 owns the run folder
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._lock = RunLock(self.run_dir).acquire()
        if config.run.resume:
            check_resume_config(
                self.run_dir, config.to_dict(), SFTConfig.RESUME_IGNORES, config.run.allow_config_change, log
            )
        prepare_process(config.run.threads, config.memory.malloc_mmap_threshold_kb, config.seed)
        if config.lora:
            _require_peft()
            if parallel.shards_weights:
                raise ValueError(
                    "--lora under an FSDP accelerate config: LoRA trains few weights, so it runs under "
                    "DDP (configs/accelerate/cpu_2proc.yaml, ddp_8gpu.yaml); drop --lora or the FSDP config"
                )
        self.weights = {
            _ROLE_NAMES[r]: (config.act_weight if r == "act" else config.rehearse_weight) for r in config.role_list()
        }
        if demos is None:
            demos, data_stats = load_sft_data(config, models.tokenizer(config.init or config.model))
            if parallel.is_main:
                (self.run_dir / "data_stats.json").write_text(json.dumps(data_stats, indent=1))
            require_whole_demos(config, data_stats, log=log)
        base = models.model(config.init or config.model, device=parallel.device, shared=False)
        tokenizer = models.tokenizer(config.init or config.model)
        self.tokenizer = tokenizer
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else tokenizer.eos_token_id)
        self.demos = list(demos)
        if not self.demos:
            raise ValueError("SFTTrainer needs at least one training sequence")
        targets = sum(1 for d in self.demos for r in d.role_mask if r in {int(k) for k in self.weights})
        if targets == 0:
            raise ValueError(f"no {config.roles} token in any of the {len(self.demos)} sequences; nothing to train")
        self.lengths = [len(d.token_ids) for d in self.demos]
        self.batches_per_epoch = len(
            bucket_batches(
                self.lengths, config.batch_tokens, config.max_batch_rows, config.seed, 0, config.group_by_length
            )
        )
        self.total_steps = config.max_steps or config.num_epochs * self.batches_per_epoch

        if config.memory.gradient_checkpointing:
            enable_gradient_checkpointing(base)
        self.model: torch.nn.Module = base
        if config.lora:
            from peft import LoraConfig, get_peft_model

            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(config.seed)
                self.model = get_peft_model(
                    base,
                    LoraConfig(
                        r=config.lora_r,
                        lora_alpha=config.lora_alpha,  # type: ignore[arg-type]  # peft says int; a float works
                        lora_dropout=config.lora_dropout,
                        target_modules=list(config.lora_target_modules),
                        bias="none",
                        task_type="CAUSAL_LM",
                    ),
                )
        # what the backward runs through: DDP-wrapped (gradients all-reduced) when there are several processes,
        # or sharded in place (FSDP)
        self._logprobs = parallel.wrap(
            TokenLogprobs(self.model), example=TokenLogprobs.example_inputs(self.pad_id, parallel.device)
        )
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            params,
            lr=config.optim.lr,
            weight_decay=config.optim.weight_decay,
            betas=(config.optim.adam_beta1, config.optim.adam_beta2),
        )
        self.scheduler = make_lr_scheduler(
            self.optimizer, config.optim.lr_schedule, config.optim.warmup_steps, self.total_steps
        )
        self.step = 0
        if config.run.resume:
            if config.lora:
                from peft import set_peft_model_state_dict
                from safetensors.torch import load_file

                ckpt, self.step = load_newest(
                    self.run_dir, {}, {"model": self.optimizer}, {"model": self.scheduler}, log=log
                )
                if ckpt is not None:
                    set_peft_model_state_dict(
                        self.model, load_file(str(ckpt / "adapter" / "adapter_model.safetensors"))
                    )
            else:
                _, self.step = load_newest(
                    self.run_dir, {"model": self.model}, {"model": self.optimizer}, {"model": self.scheduler}, log=log
                )
        if self.step:
            apply_optimizer_settings(
                {"model": self.optimizer},
                {"model": self.scheduler},
                config.optim.lr,
                config.optim.weight_decay,
                (config.optim.adam_beta1, config.optim.adam_beta2),
            )
        parallel.same_everywhere(self.step, "the step to resume from")  # ranks that resumed apart would diverge
        parallel.barrier()  # every rank has read the run folder before rank 0 rewrites parts of it
        if parallel.is_main:
            trim_jsonl(self.run_dir / "metrics.jsonl", self.step)
            (self.run_dir / "config.json").write_text(json.dumps(config.to_dict(), indent=1))

    def batch_for_step(self, step: int) -> list[int]:
        """The example indices of optimizer step `step` (0-based): epoch ``step // batches_per_epoch``."""
        epoch, index = divmod(step, self.batches_per_epoch)
        cfg = self.config
        return bucket_batches(self.lengths, cfg.batch_tokens, cfg.max_batch_rows, cfg.seed, epoch, cfg.group_by_length)[
            index
        ]

    def train(self, progress: bool = True) -> list[dict[str, Any]]:
        """Run until ``total_steps`` optimizer steps are done; returns this call's metrics (also logged)."""
        from tqdm.auto import tqdm

        history = []
        progress = progress and self.parallel.is_main
        bar = tqdm(total=self.total_steps, initial=self.step, desc="sft", disable=not progress, unit="step")
        while self.step < self.total_steps:
            m = self.train_step()
            history.append(m)
            bar.update(1)
            bar.set_postfix(
                loss=f"{m['train/loss']:.3f}",
                pad=f"{m['data/padding_fraction']:.2f}",
                tok_s=f"{m['perf/tokens_per_s']:.0f}",
            )
            if self.step % self.config.run.save_every == 0 or self.step == self.total_steps:
                self.save()
        bar.close()
        return history

    def train_step(self) -> dict[str, Any]:
        """One optimizer step on the step's batch; returns (and logs) its metrics.

        With several processes this rank trains rows ``rank, rank + W, ...`` of the batch (a rank left without
        a row runs the batch's first row with weight 0, so that every rank takes part in the all-reduce), and
        the metrics are those of the whole batch.
        """
        cfg = self.config
        par = self.parallel
        t0 = time.perf_counter()
        indices = self.batch_for_step(self.step)
        mine = indices[par.rank :: par.world_size]
        empty_shard = not mine
        rows = [self.demos[i] for i in (mine or indices[:1])]
        input_ids, attention_mask, role_mask = collate(rows, self.pad_id)  # (n, T) each
        if empty_shard:
            role_mask = torch.full_like(role_mask, PAD_ROLE)  # (1, T): no target token, no gradient
        device = par.device
        input_ids, attention_mask, role_mask = input_ids.to(device), attention_mask.to(device), role_mask.to(device)
        self.model.train()
        lr = float(self.scheduler.get_last_lr()[0])
        logprobs = self._logprobs(input_ids, attention_mask, chunk_size=cfg.memory.logprob_chunk_size)  # (n, T)
        counts = None
        if par.distributed:
            roles = list(self.weights)
            counts = dict(zip(roles, par.sum([int((role_mask == int(r)).sum()) for r in roles])))
        loss, stats = sft_loss(
            logprobs, role_mask, self.weights, cfg.loss_normalization, counts=counts, prompt_weight=cfg.prompt_weight
        )
        if par.distributed:
            keys = sorted(stats)
            stats = dict(zip(keys, par.sum([stats[k] for k in keys])))  # the shards' parts add up
        if not math.isfinite(stats["loss"]):
            raise FloatingPointError(f"non-finite SFT loss at step {self.step}: {stats}")
        self.optimizer.zero_grad(set_to_none=True)
        (loss * par.world_size).backward()  # DDP averages the ranks' gradients
        params = [p for p in self.model.parameters() if p.requires_grad]
        if cfg.optim.max_grad_norm > 0:
            grad_norm = as_float(torch.nn.utils.clip_grad_norm_(params, cfg.optim.max_grad_norm))
        else:
            grad_norm = as_float(torch.norm(torch.stack([p.grad.norm() for p in params if p.grad is not None])))
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        dt = time.perf_counter() - t0
        real = 0 if empty_shard else int(attention_mask.sum())
        role_tokens = [
            int(((role_mask == int(_ROLE_NAMES[k])) & attention_mask.bool()).sum()) for k in ("act", "rehearse")
        ]
        real, act_tokens, rehearse_tokens = (int(v) for v in par.sum([real] + role_tokens))
        n, t = len(indices), int(max(self.lengths[i] for i in indices))  # the whole batch's rows and padded length
        m: dict[str, Any] = {
            "step": self.step,
            "train/loss": stats["loss"],
            "train/grad_norm": grad_norm,
            "train/lr": lr,
        }
        for key, tokens in (("act", act_tokens), ("rehearse", rehearse_tokens)):
            m[f"train/loss/{key}"] = stats.get(f"loss/{key}", 0.0)
            m[f"data/tokens/{key}"] = tokens
        if "loss/prompt" in stats:
            m["train/loss/prompt"] = stats["loss/prompt"]
        m.update(
            {
                "data/rows": n,
                "data/seq_len": t,
                "data/padding_fraction": 1.0 - real / (n * t),
                "perf/tokens_per_s": real / dt if dt else 0.0,
                "perf/step_s": dt,
            }
        )
        from agents.training.run_folder import append_jsonl

        if par.is_main:
            append_jsonl(self.run_dir / "metrics.jsonl", [m])
        return m

    def plain_model(self) -> torch.nn.Module:
        """The model as a plain Transformers model: itself, or (LoRA) a merged copy of base + adapter."""
        if not self.config.lora:
            return self.model
        peft_model: Any = copy.deepcopy(self.model)  # a PeftModel (config.lora): merge_and_unload is not on nn.Module
        return peft_model.merge_and_unload()

    def save(self) -> Path:
        """Write a checkpoint (`agents.training.checkpoint` layout; LoRA adds ``adapter/``) and prune old ones."""
        from agents.training.checkpoint import checkpoint_dir, prune_checkpoints, save_checkpoint

        path = checkpoint_dir(self.run_dir, self.step)
        par = self.parallel
        model_state = par.model_state_dict(self.model)  # FSDP: gathered from the shards (every rank calls it)
        optimizer_state = par.optimizer_state_dict(self.model, self.optimizer)
        if par.is_main:  # every rank holds the same weights (or its shard); the others wait until they are written
            models = {"model": self.plain_model()}
            if self.config.lora:
                models["adapter"] = self.model
            path = save_checkpoint(
                self.run_dir,
                self.step,
                models,
                {"model": self.optimizer},
                {"model": self.scheduler},
                self.tokenizer,
                self.config.to_dict(),
                model_state_dicts={"model": model_state} if model_state is not None else None,
                optimizer_state_dicts={"model": optimizer_state} if optimizer_state is not None else None,
            )
            prune_checkpoints(self.run_dir, self.config.run.keep_checkpoints)
        self.parallel.barrier()
        return path


# ---------------------------------------------------------------------------------------------------------
# Measurement
# ---------------------------------------------------------------------------------------------------------


@torch.no_grad()
def demo_logprobs(
    model: torch.nn.Module, demos: Sequence[Trajectory], pad_id: int, *, chunk_size: int = 512
) -> dict[str, float]:
    """Mean logprob (nats per token) of the demos' ACT and REHEARSE tokens under `model`, one row at a time.

    Returns:
        ``{"logprob/act", "logprob/rehearse", "tokens/act", "tokens/rehearse"}``; a mean is NaN when the
        demos have no token of that role.
    """
    from agents.training.logprobs import token_logprobs

    was_training = model.training
    model.eval()
    sums = {Role.ACT: 0.0, Role.REHEARSE: 0.0}
    counts = {Role.ACT: 0, Role.REHEARSE: 0}
    for d in demos:
        ids, mask, roles = collate([d], pad_id)  # (1, T) each
        lp = token_logprobs(model, ids, mask, chunk_size=chunk_size).cpu()  # (1, T)
        for r in sums:
            sel = roles == int(r)  # (1, T)
            sums[r] += float(lp[sel].sum())
            counts[r] += int(sel.sum())
    model.train(was_training)
    out = {}
    for r in sums:
        key = r.name.lower()
        out[f"logprob/{key}"] = sums[r] / counts[r] if counts[r] else float("nan")
        out[f"tokens/{key}"] = counts[r]
    return out


def act_parse_rate(policy: Any, tasks: Sequence[Task], *, max_new_tokens: int = 128) -> dict[str, Any]:
    """Greedy first ACT turn of each task; the fraction that parses as tool calls.

    The context is the task's first user turn with its tools (the env's prompt: `ChatRenderer.prompt_ids`);
    one greedy generation per task (batch 1, so no padding). A turn "parses as tool calls" when
    `envace_gym.parsing.parse_tool_calls` returns at least one call without error; ``valid_name_rate``
    additionally asks every call name to be one of the task's tools.

    Args:
        policy: an `agents.policy.Policy`.
        tasks: the tasks (e.g. five test-split BFCL tasks).
        max_new_tokens: cap per ACT message.

    Returns:
        ``{"parse_rate", "valid_name_rate", "n", "texts"}`` (``texts``: the generated messages).
    """
    from envace_gym.parsing import ToolCallParseError, parse_tool_calls
    from envace_gym.types import Message

    parsed = valid = 0
    texts = []
    for task in tasks:
        first = [Message(role=m.role, content=m.content) for m in task.turns[0]]
        ctx = policy.renderer.prompt_ids(first, task.tools_at_turn(0))
        (action,) = policy.act([ctx], max_new_tokens=max_new_tokens, temperature=0.0)
        texts.append(str(action))
        try:
            calls = parse_tool_calls(str(action))
        except ToolCallParseError:
            calls = []
        if calls:
            parsed += 1
            names = {t.name for t in task.tools_at_turn(0)}
            valid += int(all(c.name in names for c in calls))
    n = len(tasks)
    return {
        "parse_rate": parsed / n if n else float("nan"),
        "valid_name_rate": valid / n if n else float("nan"),
        "n": n,
        "texts": texts,
    }


def measure(
    policy: Any, demos: Sequence[Trajectory], tasks: Sequence[Task], *, max_new_tokens: int = 128, chunk_size: int = 512
) -> dict[str, Any]:
    """`demo_logprobs` on `demos` and `act_parse_rate` on `tasks` for one policy (call before and after SFT)."""
    out = dict(demo_logprobs(policy.model, demos, policy.pad_id, chunk_size=chunk_size))
    out.update(act_parse_rate(policy, tasks, max_new_tokens=max_new_tokens))
    return out
