"""`RoleWiseGRPOTrainer`: role-wise GRPO over the rehearse envs (EnvACE, docs/design.md §1).

One training step, in the order of the algorithm box:

1. sample B task ids (seeded by (seed, step), so a resumed run samples exactly what it would have);
2. `agents.rollout.collect_rollouts`: B x K episodes through one `RehearseVectorEnv` (the shared policy
   ACTs and REHEARSEs; ``rollout="real"`` uses real backends instead, ``rollout="null"`` a constant answer,
   ``rollout="hybrid"`` the real backend for a ``real_call_prob`` share of the calls drawn per call),
   token in, token out;
3. `agents.rollout.build_batch`: rows, role masks, old logprobs and per-token advantages (role-wise or plain
   GRPO, `agents.grpo`), and with ``world_model_loss_weight > 0`` the real tool outputs as REHEARSE targets;
4. ``ppo_epochs`` x ``num_minibatches`` updates: logprobs recomputed in chunks through the LM head
   (`agents.training.logprobs.token_logprobs`), `agents.grpo.grpo_loss` (clipped ratio against the logprobs recorded
   at generation, optional k3 KL to a frozen reference, optional entropy bonus) plus ``world_model_loss_weight``
   x `agents.grpo.world_model_loss` (teacher-forced cross-entropy on the real outputs), AdamW with grad clipping;
   an optimizer step whose loss or clipped gradient is not finite is dropped and counted, and
   ``max_nonfinite_steps`` of them in a row stop the run;
5. the prefix KV caches are cleared: by an update that trains, before its passes (its activations get that
   memory), and after it (the weights changed; `RoleWiseGRPOTrainer.clear_kv_caches`);
6. metrics to ``metrics.jsonl`` and TensorBoard, a checkpoint every ``run.save_every`` steps.

Before any model loads, the trainer checks that at least ``min_solvable_fraction`` of the selected tasks can
be completed within ``max_steps_per_turn``, ``max_new_tokens`` and ``max_episode_tokens`` (`agents.training.budgets`):
episodes end only by the env's own limits, per user turn as in BFCL, never by a cap on the whole episode.

``policy="per_role"`` (ablation) keeps two models: the ACT model generates actions and is updated on ACT
tokens only, the REHEARSE model generates rehearsals and is updated on REHEARSE tokens only.

Metrics (one JSON line per step; the same keys in TensorBoard), with ρ in {act, rehearse}:

| key | definition |
|---|---|
| ``rollout/reward_mean``, ``rollout/reward_std`` | mean / std of R(τ) over the B·K trajectories (penalised) |
| ``rollout/verifier_reward_mean`` | mean of the verifier's reward (before the invalid-action penalty) |
| ``rollout/reward_mean/ρ`` | mean R(τ) over the segments of role ρ (what the role's baselines average) |
| ``rollout/groups_with_reward_variance`` | groups (of B) whose K rewards R(τ) are not all equal: the groups with a learning signal |
| ``rollout/zero_std_groups/ρ`` | fraction of groups whose role-ρ segment rewards are all equal (no signal) |
| ``rollout/tokens/ρ`` | loss tokens of role ρ in the batch |
| ``rollout/parse_error_rate`` | ACT messages answered with a parse-error observation / all ACT messages |
| ``rollout/empty_action_rate`` | trajectories with an empty ACT response / B·K |
| ``rollout/truncated_fraction`` | trajectories the env truncated (a user turn used ``max_steps_per_turn`` ACT messages and its last still called a tool, or the episode passed ``max_episode_tokens``) / B·K; their R is 0, as BFCL scores a force-quit turn |
| ``rollout/reward_capped_fraction`` | trajectories in which a budget bit (truncated, or an ACT message or a rehearsal reached its ``max_new_tokens`` without its stop token) / B·K: rewards a budget, not the policy, may have capped |
| ``rollout/real_tool_calls`` | executions on a real backend while the batch was played, the environment cost (0 for rehearsed rollouts; hybrid: the calls drawn real and the rehearsed calls executed to catch the backend up) |
| ``rollout/real_answers`` | calls whose output the policy saw came from a real backend (rollout real: every call; hybrid: those drawn real) |
| ``rollout/world_model_tokens`` | target tokens of the world-model loss in the batch (0 when ``world_model_loss_weight`` is 0) |
| ``rollout/demo_tool_calls`` | tool outputs of this step's world-model demonstrations (``world_model_demos``; 0 when off): the reference and mistaken calls the real backend answered to make the targets (a proposed mistake the backend did not reject, or a demonstration the length cap dropped, made calls that are not counted) |
| ``rollout/verifier_replay_calls`` | calls the verifier replayed on fresh real backends to score the batch (counted apart) |
| ``train/advantage_mean/ρ``, ``train/advantage_std/ρ``, ``train/advantage_abs/ρ`` | over role-ρ segments |
| ``train/loss``, ``train/pg_loss``, ``train/kl``, ``train/entropy`` | `agents.grpo.grpo_loss` terms, mean over minibatches; ``loss`` includes the weighted world-model term |
| ``train/world_model_loss`` | `agents.grpo.world_model_loss` (nats per target token, before its weight), mean over the minibatch steps that had target tokens; 0 when off or when there were none |
| ``train/clip_fraction``, ``train/approx_kl``, ``train/ratio_mean`` | masked token means, mean over the (model, minibatch) targets that had loss tokens; with one process, over the rows with a non-zero advantage (rows without one are left out of the update's passes: `RoleWiseGRPOTrainer._minibatch_step`) |
| ``train/grad_norm`` | total gradient norm before clipping, mean over those targets |
| ``train/logprob_mismatch`` | mean over loss tokens of abs(log π_trainer − log π_engine), the trainer's recompute before any optimizer step of the update against the logprobs the engine recorded (`UpdateStats`); null when no forward pass ran |
| ``train/tis_weight_mean`` | mean truncated importance weight min(π_trainer / π_engine, ``importance_sampling_cap``) over loss tokens; null when TIS is off |
| ``train/update_targets`` | (model, minibatch) optimizer steps taken and averaged in the ``train/`` means |
| ``train/skipped_update`` | 1 when no optimizer step was taken: no learning signal (all advantages 0, no KL/entropy term) or no loss token |
| ``train/skipped_nonfinite`` | optimizer steps dropped because the loss or the clipped gradient was not finite (``max_nonfinite_steps`` in a row stop the run) |
| ``train/lr`` | learning rate after the step |
| ``perf/rollout_s``, ``perf/update_s``, ``perf/step_s`` | wall seconds |
| ``perf/rollout_share``, ``perf/update_share`` | phase seconds / step seconds |
| ``perf/rollout_tokens_per_s`` | generated tokens (ACT + REHEARSE) / rollout seconds |
| ``perf/update_tokens_per_s`` | row tokens processed by the update (all epochs) / update seconds |
"""  # noqa: E501 (markdown table rows in this docstring cannot be wrapped)

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tqdm.auto import tqdm

from agents.config import TrainConfig, _dump_yaml
from agents.engines.registry import GenerationEngine
from agents.grpo import LossStats, aggregation_count, grpo_loss, world_model_loss
from agents.models import ModelStore, default_store
from agents.policy import Policy, PolicyRehearser
from agents.rollout import RolloutBatch, RolloutStats, build_batch, collect_rollouts, with_demonstrations
from agents.training.budgets import check_task_budgets
from agents.training.checkpoint import checkpoint_dir, load_newest, prune_checkpoints, save_checkpoint
from agents.training.distributed import DataParallel, as_float
from agents.training.logprobs import TokenLogprobs, enable_gradient_checkpointing, token_logprobs
from agents.training.optim import apply_optimizer_settings, bucket_batches, make_lr_scheduler, prepare_process
from agents.training.run_folder import RunLock, append_jsonl, check_resume_config, trim_jsonl
from envace_gym.envs.rehearse_vector import RehearseVectorEnv
from envace_gym.types import Role, Trajectory

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

__all__ = ["RoleWiseGRPOTrainer", "UpdateStats", "make_lr_scheduler"]


@dataclass
class UpdateStats:
    """What one `RoleWiseGRPOTrainer.update` did: mean loss statistics and the optimizer steps taken.

    Attributes:
        loss: the mean over applied (model, minibatch) steps of `agents.grpo.LossStats`; None when no
            step was applied.
        grad_norm: mean gradient norm before clipping over the applied steps (0.0 when none).
        update_tokens: non-padding tokens of the rows the applied minibatches' passes ran (rows without
            signal are left out of them, `RoleWiseGRPOTrainer._minibatch_step`).
        update_targets: how many (model, minibatch) steps were applied.
        skipped_update: True when the batch had no learning signal and no forward pass ran.
        skipped_nonfinite: steps dropped for a non-finite loss or gradient.
        logprob_mismatch: mean over loss tokens of |log π_trainer − log π_engine|: the trainer's recompute
            before any optimizer step of this update (the first minibatch of each model, or the whole batch
            when truncated importance sampling recomputes it) against the logprobs the generation engine
            recorded. The same weights give both, so it measures numerics (batch shapes, kernels, dtype,
            another engine). With one process and without truncated importance sampling, over the rows
            with a non-zero advantage (the rows the passes ran). None when no forward pass ran.
        tis_weight_mean: mean truncated importance weight ``min(π_trainer / π_engine, cap)`` over loss
            tokens (None when ``importance_sampling_cap`` is 0 or no forward pass ran).
    """

    loss: LossStats | None = None
    grad_norm: float = 0.0
    update_tokens: int = 0
    update_targets: int = 0
    skipped_update: bool = False
    skipped_nonfinite: int = 0
    logprob_mismatch: float | None = None
    tis_weight_mean: float | None = None

    def to_metrics(self) -> dict[str, float | None]:
        """The ``train/*`` metric values (loss statistics 0 and ``ratio_mean`` 1 when no step was applied)."""
        loss = (
            self.loss.to_dict()
            if self.loss is not None
            else {
                "loss": 0.0,
                "pg_loss": 0.0,
                "kl": 0.0,
                "entropy": 0.0,
                "clip_fraction": 0.0,
                "approx_kl": 0.0,
                "ratio_mean": 1.0,
                "world_model_loss": 0.0,
            }
        )
        return {
            **loss,
            "grad_norm": self.grad_norm,
            "skipped_update": float(self.skipped_update),
            "skipped_nonfinite": float(self.skipped_nonfinite),
            "update_targets": float(self.update_targets),
            "logprob_mismatch": self.logprob_mismatch,
            "tis_weight_mean": self.tis_weight_mean,
        }


class RoleWiseGRPOTrainer:
    """Role-wise GRPO on the rehearse envs; see the module docstring for the step and the metrics.

    Args:
        config: a validated `TrainConfig` (its checks run before any model loads).
        log: where progress lines go (``print`` by default; None: nowhere).
        engine: the `agents.engines.registry.GenerationEngine` of the ACT policy (and of REHEARSE when the roles share
            the model); None builds ``config.engine`` (default ``"hf"``) over the loaded model.
        models: the `agents.models.ModelStore` the tokenizer and the starting weights come from (None: the
            default store); the trained model is always a fresh copy, never the store's shared one.
        parallel: the data-parallel processes of the run (`agents.training.distributed.DataParallel`; None: read from
            the launcher's environment, one process without a launcher). With W processes each plays
            ``batch_tasks / W`` whole groups, gradients are all-reduced so every rank applies the gradient of
            the whole batch, metrics are computed over all ranks, and only rank 0 writes the run folder. With
            ``num_minibatches == 1`` (one optimizer step per epoch, the paper's setting) the update is the
            one a single process makes on the same batch; with more, each rank shuffles its own rows into the
            minibatches, so they are not the single process's minibatches.

    Attributes:
        policy: the ACT policy (for ``policy="shared"`` also the rehearser's policy).
        rehearse_policy: the REHEARSE policy (the same object unless ``policy="per_role"``).
        step: completed training steps (restored on resume).
        run_dir: where checkpoints, ``metrics.jsonl``, ``config.yaml`` and ``tb/`` go.

    Raises:
        ValueError: the suite, categories and split give fewer tasks than ``batch_tasks``, ``task_ids`` names
            a task they do not hold, or ``batch_tasks`` does not split evenly over the processes (or leaves a
            process fewer trajectories than ``num_minibatches``).
        agents.training.budgets.BudgetError: fewer than ``min_solvable_fraction`` of the selected tasks can be completed
            within ``max_steps_per_turn``, ``max_new_tokens`` and ``max_episode_tokens`` (checked before the
            model loads).
    """

    def __init__(
        self,
        config: TrainConfig,
        log=print,
        engine: GenerationEngine | None = None,
        models: ModelStore | None = None,
        parallel: DataParallel | None = None,
    ) -> None:
        from envace_gym.suites import make_suite

        self.config = config
        self.parallel = parallel = parallel or DataParallel.from_environment(config.run.device)
        if not parallel.is_main:
            log = None
        if parallel.shards_weights and config.shard_optimizer:
            raise ValueError(
                "--shard-optimizer (ZeRO stage 1) under an FSDP accelerate config: FSDP already shards "
                "AdamW's state over the ranks; pass --shard-optimizer false"
            )
        # vLLM needs whole weights: under FSDP "auto" is the HF engine
        self._engine_name = "hf" if parallel.shards_weights and config.engine == "auto" else config.engine
        if parallel.shards_weights and config.engine == "vllm":
            raise ValueError(
                "--engine vllm under an FSDP accelerate config: vLLM loads whole weights after every "
                "update, which sharded weights do not give it; use the hf engine or a DDP config"
            )
        self._group_shard = parallel.shard(config.batch_tasks, "tasks per step (--batch-tasks)")
        local_trajectories = config.trajectories_per_step // parallel.world_size
        if local_trajectories < config.num_minibatches:
            raise ValueError(
                f"each of {parallel.world_size} processes plays {local_trajectories} trajectories, fewer than "
                f"num_minibatches={config.num_minibatches}; lower --num-minibatches or raise --batch-tasks"
            )
        self.run_dir = Path(config.run_dir)
        models = models or default_store()
        self._store = models
        source = config.init or config.model
        tokenizer = models.tokenizer(source)
        suite = make_suite(config.suite)
        tasks = suite.tasks(config.categories, config.split)
        all_ids = [t.id for t in tasks]
        if config.task_ids:
            missing = sorted(set(config.task_ids) - set(all_ids))
            if missing:
                raise ValueError(
                    f"task_ids not in {config.suite}/{config.categories or 'default categories'}/{config.split}: "
                    f"{missing[:5]}"
                )
            keep = set(config.task_ids)
            tasks = [t for t in tasks if t.id in keep]
            all_ids = list(config.task_ids)
        if len(all_ids) < config.batch_tasks:
            raise ValueError(
                f"only {len(all_ids)} tasks available but batch_tasks={config.batch_tasks}; lower --batch-tasks"
            )
        self.budget_report = check_task_budgets(
            tasks,
            config.suite,
            tokenizer,
            max_steps_per_turn=config.max_steps_per_turn,
            max_new_tokens=config.max_new_tokens,
            max_episode_tokens=config.max_episode_tokens,
            min_fraction=config.min_solvable_fraction,
            command="envace train",
            log=log,
        )
        self.task_pool = all_ids
        if config.world_model_demos:
            _check_demonstration_suite(suite, config)
        self._lock = None
        if parallel.is_main:  # rank 0 owns the run folder
            self.run_dir.mkdir(parents=True, exist_ok=True)  # only once the inputs are known to be good
            self._lock = RunLock(self.run_dir).acquire()
        if config.run.resume:
            check_resume_config(
                self.run_dir, config.to_dict(), TrainConfig.RESUME_IGNORES, config.run.allow_config_change, log
            )
        prepare_process(config.run.threads, config.memory.malloc_mmap_threshold_kb, config.seed)
        model = models.model(source, dtype=getattr(torch, config.dtype), device=parallel.device, shared=False)
        self.tokenizer = tokenizer
        self.policy = self._policy(model, tokenizer, engine)
        self.rehearse_policy = self.policy
        if config.policy == "per_role":
            self.rehearse_policy = self._policy(copy.deepcopy(model), tokenizer, None)
        self.models: dict[str, torch.nn.Module] = {"model": self.policy.model}
        if self.rehearse_policy is not self.policy:
            self.models["rehearse_model"] = self.rehearse_policy.model
        if config.memory.gradient_checkpointing:
            for m in self.models.values():
                enable_gradient_checkpointing(m)
        self.ref_model = None
        if config.beta > 0:  # copied before FSDP would shard the policy in place
            self.ref_model = copy.deepcopy(self.policy.model).eval()
            for p in self.ref_model.parameters():
                p.requires_grad_(False)
        # what the backward runs through: DDP-wrapped (gradients all-reduced) when there are several processes,
        # or sharded in place (FSDP)
        example = TokenLogprobs.example_inputs(self.policy.pad_id, parallel.device)
        self._logprob_modules = {k: parallel.wrap(TokenLogprobs(m), example=example) for k, m in self.models.items()}
        self.optimizers = {
            k: parallel.adamw(
                m.parameters(),
                shard=config.shard_optimizer,
                lr=config.optim.lr,
                weight_decay=config.optim.weight_decay,
                betas=(config.optim.adam_beta1, config.optim.adam_beta2),
            )
            for k, m in self.models.items()
        }
        self.schedulers = {
            k: make_lr_scheduler(o, config.optim.lr_schedule, config.optim.warmup_steps, config.num_steps)
            for k, o in self.optimizers.items()
        }
        self.env = RehearseVectorEnv(
            num_envs=config.trajectories_per_step // parallel.world_size,
            suite=config.suite,
            categories=config.categories,
            split=config.split,
            rehearser=PolicyRehearser(self.rehearse_policy, prompt_mode=config.prompt_mode),
            prompt_mode=config.prompt_mode,
            max_new_tokens=config.rehearse_max_new_tokens,
            temperature=config.temperature,
            max_steps_per_turn=config.max_steps_per_turn,
            max_episode_tokens=config.max_episode_tokens,
        )
        self.judge, self._checklist = self._reward_judge(tasks, models)
        self.step = 0
        self.nonfinite_in_a_row = {name: 0 for name in self.models}
        self.generated_tokens = 0  # ACT and REHEARSE tokens the rollouts generated so far (generated_token_budget)
        self._mismatch_sum, self._mismatch_tokens = 0.0, 0  # filled by each update
        self._unmeasured: set[str] = set()
        self._writer: SummaryWriter | None = None
        if config.run.resume:
            ckpt, self.step = load_newest(self.run_dir, self.models, self.optimizers, self.schedulers, log=log)
            if ckpt is not None:
                from agents.training.checkpoint import trainer_state

                state = trainer_state(ckpt)
                self.nonfinite_in_a_row.update(state.get("nonfinite_in_a_row", {}))
                self.generated_tokens = int(state.get("generated_tokens", 0))
                self._apply_optimizer_config()
                self.clear_kv_caches()  # an engine holding its own copy of the weights (vLLM) reloads them
        parallel.same_everywhere(self.step, "the step to resume from")  # ranks that resumed apart would diverge
        parallel.barrier()  # every rank has read the run folder before rank 0 rewrites parts of it
        if parallel.is_main:
            # steps logged after the checkpoint (a run killed before its next save) are redone, not kept twice
            trim_jsonl(self.run_dir / "metrics.jsonl", self.step)
            _dump_yaml(config, self.run_dir / "config.yaml")

    def _apply_optimizer_config(self) -> None:
        cfg = self.config
        apply_optimizer_settings(
            self.optimizers,
            self.schedulers,
            cfg.optim.lr,
            cfg.optim.weight_decay,
            (cfg.optim.adam_beta1, cfg.optim.adam_beta2),
        )

    # ------------------------------------------------------------------ the loop
    def train(self, progress: bool = True) -> list[dict[str, Any]]:
        """Run until ``config.num_steps`` steps are done (resuming counts the finished ones), or until the rollouts
        have generated ``config.generated_token_budget`` tokens when it is set; returns the metrics."""
        from agents.users import simulated_user

        with simulated_user(self.config, self.policy, self._store):  # suites with a simulated user (τ²)
            return self._train(progress)

    def _train(self, progress: bool) -> list[dict[str, Any]]:
        history = []
        progress = progress and self.parallel.is_main
        bar = tqdm(total=self.config.num_steps, initial=self.step, desc="train", disable=not progress, unit="step")
        budget = self.config.generated_token_budget
        while self.step < self.config.num_steps and not (budget and self.generated_tokens >= budget):
            metrics = self.train_step()
            history.append(metrics)
            bar.update(1)
            bar.set_postfix(reward=f"{metrics['rollout/reward_mean']:.3f}", loss=f"{metrics['train/loss']:.4f}")
            if progress:
                bar.write(
                    f"[train] step {metrics['step']}: reward {metrics['rollout/reward_mean']:.3f} "
                    f"(act {metrics['rollout/reward_mean/act']:.3f}, rehearse "
                    f"{metrics['rollout/reward_mean/rehearse']:.3f}), "
                    f"tokens act {metrics['rollout/tokens/act']} rehearse {metrics['rollout/tokens/rehearse']}, "
                    f"loss {metrics['train/loss']:.4f}, rollout {metrics['perf/rollout_s']:.0f} s + update "
                    f"{metrics['perf/update_s']:.0f} s"
                )
            done = self.step == self.config.num_steps or bool(budget and self.generated_tokens >= budget)
            if self.step % self.config.run.save_every == 0 or done:
                self.save()
        bar.close()
        if self._writer is not None:
            self._writer.flush()
        return history

    def close(self) -> None:
        """Flush the TensorBoard writer and release the run folder's lock (also done when garbage-collected)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._lock is not None:
            self._lock.release()

    def sample_task_ids(self, step: int) -> list[str]:
        """B distinct task ids for `step`, drawn from a generator seeded by (seed, step)."""
        rng = np.random.default_rng([self.config.seed, step])
        idx = rng.choice(len(self.task_pool), size=self.config.batch_tasks, replace=False)
        return [self.task_pool[i] for i in idx]

    def world_model_demonstrations(self, step: int) -> list[Trajectory]:
        """This rank's world-model demonstrations for `step` (``world_model_demos``; [] when 0).

        ``world_model_demos`` distinct tasks of the pool are drawn from a generator seeded by (seed, step, 2) (the
        rollouts' tasks use (seed, step)); rank r takes every world_size-th of them. Each is played along its
        reference solution on the real backend with ``world_model_demo_errors`` error demonstrations
        (`agents.training.demonstrations.build_demonstrations`, mutations seeded by (seed, step)), as the SFT warm
        start's data is built, and capped at ``max_episode_tokens`` (default 4096). A demonstration the cap left
        without any tool output (no REHEARSE token) is dropped: it has nothing for the world model. Called on
        every rank (the emptiness check is collective).

        Raises:
            ValueError: no rank has a demonstration for this step (every drawn task was skipped or cut before its
                first tool output; the message gives this rank's builder counts).
        """
        from agents.training.demonstrations import build_demonstrations

        cfg = self.config
        if not cfg.world_model_demos:
            return []
        rng = np.random.default_rng([cfg.seed, step, 2])
        idx = rng.choice(len(self.task_pool), size=min(cfg.world_model_demos, len(self.task_pool)), replace=False)
        ids = [self.task_pool[i] for i in idx][self.parallel.rank :: self.parallel.world_size]
        demos: list[Trajectory] = []
        stats: dict[str, Any] = {}
        if ids:
            built, demo_stats = build_demonstrations(
                self.tokenizer,
                cfg.suite,
                cfg.categories,
                cfg.split,
                task_ids=ids,
                max_tokens=cfg.max_episode_tokens or 4096,
                mutations=cfg.world_model_demo_errors,
                seed=cfg.seed * 1_000_003 + step,
            )
            demos = [d for d in built if d.tokens_per_role()[Role.REHEARSE.name]]
            stats = {**demo_stats.to_dict(), "without_tool_output": len(built) - len(demos)}
        if not self.parallel.any(bool(demos)):
            raise ValueError(
                f"world_model_demos: no demonstration with a tool output from the {cfg.world_model_demos} tasks drawn "
                f"at step {step} ({cfg.suite}; this rank's counts: {stats}); raise max_episode_tokens if the cap cut "
                "them, or set world_model_demos 0"
            )
        return demos

    def train_step(self) -> dict[str, Any]:
        """One rollout batch and its update; returns the step's metrics (also logged)."""
        cfg = self.config
        t0 = time.perf_counter()
        for m in self.models.values():
            m.eval()
        first, stop = self._group_shard
        task_ids = self.sample_task_ids(self.step)[first:stop]  # this rank's groups
        with self.parallel.gathered(self._logprob_modules.values()):  # whole weights to generate with (FSDP)
            trajectories, rstats = collect_rollouts(
                self.policy,
                self.env,
                task_ids,
                cfg.group_size,
                max_new_tokens=cfg.max_new_tokens,
                temperature=cfg.temperature,
                seed=int(np.random.default_rng([cfg.seed, self.step, 1]).integers(2**31 - 1)),
                rollout=cfg.rollout,
                invalid_action_penalty=cfg.invalid_action_penalty,
                first_env=first * cfg.group_size,
                num_global_envs=cfg.trajectories_per_step,
                rehearsal_n=cfg.rehearsal_n,
                rehearsal_mode=cfg.rehearsal_mode,
                rehearsal_memory=cfg.rehearsal_memory,
                rehearsal_restate_request=cfg.rehearsal_restate_request,
                rehearsal_memory_tokens=cfg.rehearsal_memory_tokens,
                real_call_prob=cfg.real_call_prob,
            )
        judge_metrics = self._judge_rewards(trajectories, rstats) if self.judge is not None else {}
        batch = build_batch(
            trajectories,
            rstats.group_ids,
            weighting=cfg.weighting,
            algo=cfg.algo,
            scale_by_std=cfg.scale_by_std,
            prompt_mode=cfg.prompt_mode,
            pad_id=self.policy.pad_id,
            world_model=cfg.world_model_loss_weight > 0,
        )
        demos = self.world_model_demonstrations(self.step)
        batch = with_demonstrations(batch, demos, self.policy.pad_id)
        self.parallel.barrier()  # the update waits for the slowest rank's rollouts: count that as rollout time
        t1 = time.perf_counter()
        for policy in dict.fromkeys((self.policy, self.rehearse_policy)):
            sleep = getattr(policy.engine, "sleep", None)  # a colocated engine (vLLM) frees its memory for the update
            if sleep is not None:
                sleep()
        train_stats = self.update(batch)
        if train_stats.update_targets:
            self.clear_kv_caches()
        t2 = time.perf_counter()
        with warnings.catch_warnings():
            # per_role: a model whose role had no loss token this batch skipped its optimizer step on purpose
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step\\(\\)` before")
            for s in self.schedulers.values():
                s.step()
        self.step += 1
        view = _StepView.of(trajectories, rstats, batch, first)
        if self.parallel.distributed:
            view = _StepView.concat(self.parallel.gather(view))
        metrics = self._metrics(view, train_stats, t1 - t0, t2 - t1)
        demo_calls = sum(seg.role == Role.REHEARSE for d in demos for seg in d.segments)  # one output per call
        metrics["rollout/demo_tool_calls"] = int(self.parallel.sum([demo_calls])[0]) if cfg.world_model_demos else 0
        metrics.update(judge_metrics)
        self.generated_tokens += metrics["rollout/generated_tokens"]  # every rank: the gathered view's total
        metrics["rollout/generated_tokens_total"] = self.generated_tokens
        if self.parallel.is_main:
            self._log(metrics)
        return metrics

    def _reward_judge(self, tasks: Sequence[Any], models: ModelStore) -> tuple[Any, Any]:
        """The judge and the task -> checklist lookup of ``reward: judge | judge_imagined`` (None, None for
        ``replay``); the envs' own verifier is turned off, so termination touches no real backend.

        Raises:
            ValueError: no checklist source (no ``checklists`` file and a suite without ``checklist(task)``), or a
                task of the pool without a checklist in the file.
        """
        cfg = self.config
        if cfg.reward == "replay":
            return None, None
        from agents.judges import LocalJudge, OpenAIJudge
        from envace_gym.judging import load_checklists
        from envace_gym.suites import make_suite

        if cfg.checklists:
            table = load_checklists(cfg.checklists)
            missing = [t.id for t in tasks if t.id not in table]
            if missing:
                raise ValueError(
                    f"checklists {cfg.checklists} has no checklist for {len(missing)} task(s), e.g. {missing[:3]}"
                )
            checklist = lambda task: table[task.id]  # noqa: E731
        else:
            suite: Any = make_suite(cfg.suite)  # checklist(task) is an optional method of a suite
            if not callable(getattr(suite, "checklist", None)):
                raise ValueError(
                    f"reward={cfg.reward} needs checklists: suite {cfg.suite!r} derives none (no checklist(task)); "
                    "give --checklists FILE.jsonl"
                )
            checklist = suite.checklist
        judge: Any
        if cfg.judge_url:
            judge = OpenAIJudge(cfg.judge_model, cfg.judge_url)
        else:
            judge = LocalJudge(cfg.judge_model, models=models, reply_prefix=cfg.judge_reply_prefix)
        for env in self.env.unwrapped.envs:
            base: Any = env.unwrapped  # a ToolUseEnv
            base.verify = False
        return judge, checklist

    def _judge_rewards(self, trajectories: Sequence[Trajectory], rstats: RolloutStats) -> dict[str, float]:
        """Replace each trajectory's R by the judge's checklist score (``reward: judge`` replays its calls on a
        fresh real backend first; ``judge_imagined`` judges it as rehearsed), the invalid-action penalty applied
        as `agents.rollout.collect_rollouts` does; returns the step's judge metrics."""
        from envace_gym.judging import score_with_judge
        from envace_gym.suites import make_suite

        cfg = self.config
        suite = make_suite(cfg.suite) if cfg.reward == "judge" else None
        before = self.judge.stats.unparseable
        judged = 0
        for i, traj in enumerate(trajectories):
            backend = suite.make_backend(traj.task) if suite is not None else None
            r, info = score_with_judge(
                traj,
                self._checklist(traj.task),
                self.judge,
                backend=backend,
                unparseable_score=cfg.judge_unparseable_score,
            )
            judged += int(info["judged"])
            rstats.verifier_rewards[i] = float(r)
            traj.reward = float(r) - (cfg.invalid_action_penalty if rstats.empty_actions[i] else 0.0)
            rstats.rewards[i] = traj.reward
        if cfg.reward == "judge_imagined":
            rstats.verifier_replay_calls = 0  # nothing was replayed: the judge read the rehearsed episode
        return {"rollout/judge_items": judged, "rollout/judge_unparseable": self.judge.stats.unparseable - before}

    def _policy(self, model: torch.nn.Module, tokenizer: Any, engine: GenerationEngine | None) -> Policy:
        """A `Policy` over `model` sampling with `engine`, or with ``config.engine`` built over `model`."""
        return Policy(model, tokenizer, engine=engine if engine is not None else self._engine_name)

    def clear_kv_caches(self) -> None:
        """Tell every engine that its model's weights changed (`GenerationEngine.weights_updated`; the HF
        engine drops its prefix-KV entries, which would otherwise record logprobs of old weights)."""
        for policy in dict.fromkeys((self.policy, self.rehearse_policy)):
            policy.engine.weights_updated()

    def update(self, batch: RolloutBatch) -> UpdateStats:
        """``ppo_epochs`` x ``num_minibatches`` optimizer steps on `batch`; returns their `UpdateStats`.

        Statistics are averaged over the (model, minibatch) targets that had loss tokens; a target without
        any (``policy="per_role"``: a minibatch with no REHEARSE token for the REHEARSE model) takes no
        optimizer step and is left out of the means. ``update_targets`` counts the targets averaged.

        With ``world_model_loss_weight`` λ > 0 each step's loss is the GRPO loss plus λ x `agents.grpo.world_model_loss`
        over the minibatch's world-model target tokens (``batch.world_model_mask``), trained into the model that
        plays REHEARSE (under ``policy="per_role"`` the REHEARSE model only); target tokens are a learning signal.

        When the batch carries no learning signal (every advantage is 0, e.g. all rewards of every group
        equal, no world-model target, and ``beta == entropy_coef == 0``), the forward and backward passes are
        skipped (unless ``skip_empty_updates`` is False): the loss would be exactly 0 with zero gradients.
        ``skipped_update`` is then True; AdamW's weight decay
        is not applied on such a step (DAPO-style dynamic sampling drops such groups altogether).

        An update that trains first clears the policies' prefix KV caches: their entries are about to be
        stale, and the passes get their memory.

        A target whose loss or clipped gradient norm is not finite is not applied (`_minibatch_step`):
        ``skipped_nonfinite`` counts them; ``max_nonfinite_steps`` such steps in a row raise.

        Raises:
            FloatingPointError: ``max_nonfinite_steps`` optimizer steps in a row had a non-finite loss or
                gradient (the message says what to change).
        """
        cfg = self.config
        signal = bool((batch.advantages[batch.loss_mask] != 0).any()) or bool(self._targets(batch).any())
        if (
            cfg.skip_empty_updates and cfg.beta == 0 and cfg.entropy_coef == 0 and not self.parallel.any(signal)
        ):  # all ranks
            return UpdateStats(skipped_update=True)
        for policy in dict.fromkeys((self.policy, self.rehearse_policy)):
            if policy.kv_cache is not None:  # the weights are about to change: its entries are stale anyway,
                policy.kv_cache.clear()  # and this update's activations get their memory
        for m in self.models.values():
            m.train()
        n = batch.num_rows
        order_rng = torch.Generator().manual_seed(cfg.seed * 1_000_003 + self.step)
        applied: list[tuple[LossStats, float]] = []
        world_model: list[float] = []  # the world-model loss of each applied step that had target tokens
        with_loss_tokens: list[LossStats] = []  # the applied steps that had policy-loss tokens
        nonfinite = 0
        tokens = 0
        targets: list[tuple[str, torch.nn.Module, Role | None]] = [("model", self.policy.model, None)]
        if "rehearse_model" in self.models:
            targets = [
                ("model", self.policy.model, Role.ACT),
                ("rehearse_model", self.rehearse_policy.model, Role.REHEARSE),
            ]
        self._mismatch_sum, self._mismatch_tokens = 0.0, 0  # Σ |log π_trainer − log π_engine| over loss tokens
        self._run_tokens = 0  # set by each _minibatch_step: the tokens its passes ran
        self._run_targets = 0  # and the world-model target tokens of its whole minibatch
        self._unmeasured = {name for name, _, _ in targets}
        tis_weights, tis_sum, tis_tokens = None, 0.0, 0.0
        if cfg.importance_sampling_cap > 0:
            trainer_old = self._recompute_logprobs(batch, targets)  # (N, T), before any optimizer step
            mask = batch.loss_mask
            self._add_mismatch(trainer_old, batch.old_logprobs, mask)
            self._unmeasured.clear()
            ratio = torch.exp(
                torch.where(mask, trainer_old - batch.old_logprobs, torch.zeros_like(trainer_old))
            )  # (N, T)
            tis_weights = ratio.clamp(max=cfg.importance_sampling_cap)  # (N, T), 1 off the loss tokens
            tis_sum, tis_tokens = self.parallel.sum([float(tis_weights[mask].sum()), int(mask.sum())])
            # the clipped ratio is the trainer's own (π_θ / π_θ_old as the trainer computes them); the weight
            # corrects for the engine having sampled from a slightly different π_old
            batch = dataclasses.replace(batch, old_logprobs=trainer_old)
        total = cfg.ppo_epochs * cfg.num_minibatches * len(targets)
        bar = tqdm(total=total, desc="update", leave=False, disable=total <= 1 or not self.parallel.is_main)
        for _ in range(cfg.ppo_epochs):
            perm = torch.randperm(n, generator=order_rng)
            for mb_rows in torch.tensor_split(perm, cfg.num_minibatches):
                mb = batch.select(mb_rows)
                mb_weights = tis_weights[mb_rows] if tis_weights is not None else None
                for name, model, role in targets:
                    step = self._minibatch_step(name, model, mb, role, mb_weights)
                    bar.update(1)
                    if step is None:  # no loss token for this model in this minibatch
                        continue
                    step_stats, grad_norm = step
                    if grad_norm is None:  # not applied: non-finite loss or gradient
                        nonfinite += 1
                        continue
                    tokens += self._run_tokens
                    applied.append((step_stats, grad_norm))
                    if self._run_tokens:  # a step of world-model targets alone has no policy-loss statistics
                        with_loss_tokens.append(step_stats)
                    if self._run_targets:
                        world_model.append(step_stats.world_model_loss)
        bar.close()
        tokens_sum, diff, measured = self.parallel.sum([tokens, self._mismatch_sum, self._mismatch_tokens])
        tokens = int(tokens_sum)
        mismatch = diff / measured if measured else None
        tis_mean = tis_sum / tis_tokens if tis_tokens else None
        if not applied:
            return UpdateStats(
                skipped_update=True, skipped_nonfinite=nonfinite, logprob_mismatch=mismatch, tis_weight_mean=tis_mean
            )
        # the loss over every applied step; the policy-loss statistics (token means over loss tokens) over the
        # steps that had loss tokens, so a step of world-model targets alone does not pull them toward 0
        policy_steps = with_loss_tokens or [s for s, _ in applied]
        means = {
            k: sum(getattr(s, k) for s in policy_steps) / len(policy_steps) for k in LossStats.__dataclass_fields__
        }
        means["loss"] = sum(s.loss for s, _ in applied) / len(applied)
        means["world_model_loss"] = sum(world_model) / len(world_model) if world_model else 0.0
        return UpdateStats(
            loss=LossStats(**means),
            grad_norm=sum(g for _, g in applied) / len(applied),
            update_tokens=tokens,
            update_targets=len(applied),
            skipped_nonfinite=nonfinite,
            logprob_mismatch=mismatch,
            tis_weight_mean=tis_mean,
        )

    def _targets(self, batch: RolloutBatch) -> torch.Tensor:
        """``(N, T) bool``: the world-model target tokens this update trains (none when the weight is 0)."""
        if self.config.world_model_loss_weight > 0 and batch.world_model_mask is not None:
            return batch.world_model_mask
        return torch.zeros_like(batch.loss_mask)

    @torch.no_grad()
    def _recompute_logprobs(self, batch: RolloutBatch, targets: list) -> torch.Tensor:
        """The batch's logprobs under the current weights, ``(N, T)`` float32 on the CPU: each role's tokens
        from the model that trains them, one micro-batch of rows at a time."""
        cfg = self.config
        device = self.parallel.device
        temperature = cfg.temperature if cfg.temperature > 0 else 1.0
        out = torch.zeros_like(batch.old_logprobs)  # (N, T)
        micro = micro_batches(batch.attention_mask.sum(-1).tolist(), cfg.micro_batch_tokens)
        for _ in range(self.parallel.forwards_needed(len(micro)) - len(micro)):  # FSDP: join the other ranks' passes
            for name, _, _ in targets:
                _idle_pass(self._logprob_modules[name], batch.input_ids, device)
        for rows in micro:
            width = int(batch.attention_mask[rows].sum(-1).max())
            ids, attn = (
                batch.input_ids[rows, :width].to(device),
                batch.attention_mask[rows, :width].to(device),
            )  # (m, t)
            for name, _, role in targets:
                lp = (
                    self._logprob_modules[name](
                        ids, attn, temperature=temperature, chunk_size=cfg.memory.logprob_chunk_size
                    )
                    .float()
                    .cpu()
                )  # (m, t)
                part = out[rows, :width]  # (m, t)
                if role is None:
                    part = lp
                else:
                    part = torch.where(batch.role_mask[rows, :width] == int(role), lp, part)
                out[rows, :width] = part
        return out

    def _add_mismatch(self, trainer: torch.Tensor, engine: torch.Tensor, mask: torch.Tensor) -> None:
        """Add |trainer − engine| over the ``(n, T)`` loss tokens `mask` to this update's mismatch sums."""
        diff = (trainer.detach().float().cpu() - engine.float().cpu()).abs()[mask.cpu()]
        self._mismatch_sum += float(diff.sum())
        self._mismatch_tokens += int(diff.numel())

    def _minibatch_step(
        self,
        name: str,
        model: torch.nn.Module,
        mb: RolloutBatch,
        role: Role | None,
        tis_weights: torch.Tensor | None = None,
    ) -> tuple[LossStats, float | None] | None:
        """One optimizer step of `model` on the loss tokens of `mb` (of `role` only, when given).

        Returns None when there is no such token (nothing is computed). Otherwise ``(stats, grad_norm)``:
        the `LossStats` and the gradient norm before clipping, or None for the norm when the loss or the
        clipped gradient norm is not finite, in which case the gradients are dropped and
        ``optimizer.step()`` is not called. ``tis_weights`` ``(n, T)``: truncated importance weights on the
        clipped surrogate (`agents.grpo.grpo_loss`).

        With one process, ``skip_empty_updates``, ``beta == 0`` and ``entropy_coef == 0``, rows whose loss
        tokens all have a zero advantage are left out of the passes: their loss and gradient are exactly 0
        (the loss still divides by the whole minibatch's count, and the optimizer still steps, on zero
        gradients when no row is left). The token means (clip fraction, approximate KL, ratio) and the
        logprob mismatch are then over the rows that ran. The rows run in length-packed
        micro-batches of at most ``micro_batch_tokens`` padded tokens (`micro_batches`); each micro-batch's
        loss divides by the count of the whole minibatch, so their gradients accumulate into the minibatch's
        before the one optimizer step.

        With several processes `mb` is this rank's share of the minibatch: the loss divides by the count of
        the whole minibatch (summed over ranks) and is scaled by the world size before ``backward``, whose
        DDP all-reduce (on the last micro-batch only; the others run under ``no_sync``) averages it, so every
        rank applies the whole minibatch's gradient. Under FSDP every micro-batch's backward reduce-scatters
        into the sharded gradients instead, and a rank with fewer micro-batches than another runs passes
        without loss (`_idle_pass`) until every rank has run as many, since each pass all-gathers. The decisions (any
        loss token, finite loss) are taken over all ranks, and the returned statistics are those of the whole minibatch.
        """
        cfg = self.config
        par = self.parallel
        device = par.device
        mask = mb.loss_mask  # (n, T) bool
        if role is not None:
            mask = mask & (mb.role_mask == int(role))  # (n, T)
        # the world-model targets train the model that plays REHEARSE
        targets = self._targets(mb) if role in (None, Role.REHEARSE) else torch.zeros_like(mask)  # (n, T) bool
        if not par.any(bool(mask.any()) or bool(targets.any())):
            return None
        local_tokens = int(mask.sum())
        count, global_tokens, target_count = par.sum(
            [aggregation_count(mask, cfg.aggregation), local_tokens, int(targets.sum())]
        )
        self._run_targets = int(target_count)
        temperature = cfg.temperature if cfg.temperature > 0 else 1.0
        forward = self._logprob_modules[name]
        opt = self.optimizers[name]
        opt.zero_grad(set_to_none=True)
        sums = dict.fromkeys(("loss", "pg_loss", "kl", "entropy", "world_model_loss"), 0.0)
        token_means = dict.fromkeys(("clip_fraction", "approx_kl", "ratio_mean"), 0.0)
        loss_finite = True
        if par.distributed:  # ranks all run theirs (DDP syncs on the last pass; FSDP pads with idle passes)
            keep = torch.ones(mask.shape[0], dtype=torch.bool)
        elif cfg.skip_empty_updates and cfg.beta == 0 and cfg.entropy_coef == 0:
            # A row whose loss tokens all have A = 0 adds exactly 0 to the loss and to the gradient (the clipped
            # surrogate is A x ratio, and there is no KL or entropy term), so only rows with signal run: in a
            # batch where few groups have reward variance that is most of the update's work.
            keep = (mask & (mb.advantages != 0)).any(-1) | targets.any(-1)  # (n,) bool
        else:
            keep = mask.any(-1) | targets.any(-1)  # (n,) bool: a row without loss tokens adds nothing
        kept = keep.nonzero().flatten()  # (k,) int64 row indices into mb
        micro = [kept[rows] for rows in micro_batches(mb.attention_mask[kept].sum(-1).tolist(), cfg.micro_batch_tokens)]
        run_tokens = int(mask[kept].sum())  # loss tokens of the rows that run (all of them with several processes)
        self._run_tokens = int(mb.attention_mask[kept].sum())  # what the passes process (perf/update_tokens_per_s)
        passes = par.forwards_needed(len(micro))
        for i in range(passes):
            # DDP all-reduces on the last pass's backward only, so every rank syncs once (FSDP syncs every pass)
            sync = par.no_sync(forward) if i < passes - 1 else contextlib.nullcontext()
            if i >= len(micro):  # FSDP: a pass without loss, so that this rank joins the others' collectives
                with sync:
                    (_idle_pass(forward, mb.input_ids, device).sum() * 0).backward()
                continue
            rows = micro[i]
            width = int(mb.attention_mask[rows].sum(-1).max())
            ids = mb.input_ids[rows, :width].to(device)  # (m, t)
            attn = mb.attention_mask[rows, :width].to(device)  # (m, t)
            m_mask = mask[rows, :width].to(device)  # (m, t)
            m_targets = targets[rows, :width].to(device)  # (m, t)
            old = mb.old_logprobs[rows, :width].to(device)  # (m, t)
            with sync:
                if cfg.entropy_coef > 0:
                    logprobs, entropy = forward(
                        ids,
                        attn,
                        temperature=temperature,
                        chunk_size=cfg.memory.logprob_chunk_size,
                        return_entropy=True,
                    )  # (m, t) x2
                else:
                    logprobs = forward(
                        ids, attn, temperature=temperature, chunk_size=cfg.memory.logprob_chunk_size
                    )  # (m, t)
                    entropy = None
                if name in self._unmeasured:  # this model's first forward of the update: no optimizer step yet
                    self._add_mismatch(logprobs, old, m_mask)
                ref = None
                if self.ref_model is not None:
                    with torch.no_grad():
                        ref = token_logprobs(
                            self.ref_model, ids, attn, temperature=temperature, chunk_size=cfg.memory.logprob_chunk_size
                        )  # (m, t)
                weights = tis_weights[rows, :width].to(device) if tis_weights is not None else None
                loss, stats = grpo_loss(
                    logprobs,
                    old,
                    mb.advantages[rows, :width].to(device),
                    m_mask,
                    ref_logprobs=ref,
                    entropy=entropy,
                    clip_eps_low=cfg.clip_eps_low,
                    clip_eps_high=cfg.clip_eps_high,
                    beta=cfg.beta,
                    entropy_coef=cfg.entropy_coef,
                    aggregation=cfg.aggregation,
                    count=count,
                    token_weights=weights,
                )
                if target_count:
                    wm = world_model_loss(logprobs, m_targets, count=target_count)  # (), this pass's share
                    loss = loss + cfg.world_model_loss_weight * wm
                    stats = dataclasses.replace(stats, loss=float(loss.detach()), world_model_loss=float(wm.detach()))
                # a non-finite loss still runs its backward (every rank must join the all-reduce); the step is then
                # dropped on every rank through par.all(loss_finite) below
                loss_finite = loss_finite and math.isfinite(float(loss.detach()))
                (loss * par.world_size).backward()
            share = int(m_mask.sum()) / max(run_tokens, 1)
            for k in sums:
                sums[k] += getattr(stats, k)
            for k in token_means:
                token_means[k] += getattr(stats, k) * share
        if micro:  # measured on this model's first pass, before its first optimizer step
            self._unmeasured.discard(name)
        stats = LossStats(**sums, **token_means)
        if par.distributed:
            stats = _whole_minibatch_stats(stats, local_tokens, global_tokens, par)
        if not micro:  # every row was left out: the gradient is exactly 0, and AdamW still steps on it (weight
            for p in model.parameters():  # decay and momentum move the weights), as when the passes ran
                if p.requires_grad:
                    p.grad = torch.zeros_like(p)
        grad_norm = float("nan")
        finite = par.all(loss_finite)
        if finite:
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            if cfg.optim.max_grad_norm > 0:
                grad_norm = as_float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.max_grad_norm))
            else:
                grad_norm = as_float(
                    torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
                )
            # the total norm is finite exactly when every gradient is (a NaN/inf entry makes it NaN/inf), and
            # clipping scales by a finite factor, so this one number checks the gradients about to be applied
            finite = math.isfinite(grad_norm)
        if finite:
            opt.step()
            self.nonfinite_in_a_row[name] = 0
        else:
            opt.zero_grad(set_to_none=True)
            self.nonfinite_in_a_row[name] += 1
            if self.nonfinite_in_a_row[name] >= cfg.max_nonfinite_steps:
                raise FloatingPointError(
                    f"{self.nonfinite_in_a_row[name]} optimizer steps in a row had a non-finite loss or gradient (last "
                    f"at training step {self.step}, {name}); lower --optim.lr, keep --optim.max-grad-norm > 0, or "
                    f"check the model in {self.config.init or self.config.model}; --max-nonfinite-steps sets how many "
                    "are tolerated"
                )
        return stats, (grad_norm if finite else None)

    # ------------------------------------------------------------------ checkpoints and metrics
    def save(self) -> Path:
        """Write a checkpoint of the current step (see `agents.training.checkpoint`) and prune old ones; returns its
        folder. With several processes rank 0 writes it and the others wait until it is written: under DDP
        every rank holds the same weights and optimizer state; under FSDP every rank first takes part in
        gathering the whole tensors onto rank 0."""
        path = checkpoint_dir(self.run_dir, self.step)
        par = self.parallel
        par.consolidate(list(self.optimizers.values()))
        model_states = {k: par.model_state_dict(m) for k, m in self.models.items()}  # FSDP: gathered from the shards
        optimizer_states = {k: par.optimizer_state_dict(self.models[k], o) for k, o in self.optimizers.items()}
        if par.is_main:
            path = save_checkpoint(
                self.run_dir,
                self.step,
                self.models,
                self.optimizers,
                self.schedulers,
                self.tokenizer,
                self.config.to_dict(),
                extra={"nonfinite_in_a_row": dict(self.nonfinite_in_a_row), "generated_tokens": self.generated_tokens},
                model_state_dicts=model_states,
                optimizer_state_dicts=optimizer_states,
            )
            prune_checkpoints(self.run_dir, self.config.run.keep_checkpoints)
        self.parallel.barrier()
        return path

    def _metrics(self, view: _StepView, train_stats: UpdateStats, rollout_s: float, update_s: float) -> dict[str, Any]:
        rstats = view.rstats
        rewards = np.asarray(rstats.rewards, dtype=np.float64)
        m: dict[str, Any] = {
            "step": self.step,
            "rollout/reward_mean": float(rewards.mean()),
            "rollout/reward_std": float(rewards.std()),
            "rollout/verifier_reward_mean": float(np.mean(rstats.verifier_rewards)),
            "rollout/empty_action_rate": float(np.mean([e > 0 for e in rstats.empty_actions])),
            "rollout/truncated_fraction": float(np.mean(view.truncated)),
            "rollout/reward_capped_fraction": float(np.mean(rstats.budget_hit)),
            "rollout/parse_error_rate": view.parse_errors / view.act_messages if view.act_messages else 0.0,
            "rollout/groups_with_reward_variance": _groups_with_variance(rewards, rstats.group_ids),
            "rollout/real_tool_calls": rstats.real_tool_calls,
            "rollout/real_answers": rstats.real_answers,
            "rollout/world_model_tokens": view.world_model_tokens,
            "rollout/verifier_replay_calls": rstats.verifier_replay_calls,
            "rollout/generated_tokens": int(sum(rstats.generated_tokens)),
            "rollout/attempt_tokens": int(sum(rstats.attempt_tokens)),
        }
        generated = 0
        for role in (Role.ACT, Role.REHEARSE):
            key = role.name.lower()
            sel = view.seg_roles == int(role)
            seg_r = view.seg_rewards[sel]
            seg_a = view.seg_advantages[sel]
            seg_g = view.seg_group_ids[sel]
            m[f"rollout/reward_mean/{key}"] = float(seg_r.mean()) if len(seg_r) else 0.0
            zero = [float(seg_r[seg_g == g].std()) < 1e-8 for g in np.unique(seg_g)]
            m[f"rollout/zero_std_groups/{key}"] = float(np.mean(zero)) if zero else 1.0
            tok = view.role_tokens[key]
            m[f"rollout/tokens/{key}"] = tok
            generated += tok
            m[f"train/advantage_mean/{key}"] = float(seg_a.mean()) if len(seg_a) else 0.0
            m[f"train/advantage_std/{key}"] = float(seg_a.std()) if len(seg_a) else 0.0
            m[f"train/advantage_abs/{key}"] = float(np.abs(seg_a).mean()) if len(seg_a) else 0.0
        m.update({f"train/{k}": v for k, v in train_stats.to_metrics().items()})
        m["train/lr"] = float(self.schedulers["model"].get_last_lr()[0])
        step_s = rollout_s + update_s
        m["perf/rollout_s"] = rollout_s
        m["perf/update_s"] = update_s
        m["perf/step_s"] = step_s
        m["perf/rollout_share"] = rollout_s / step_s if step_s else 0.0
        m["perf/update_share"] = update_s / step_s if step_s else 0.0
        m["perf/rollout_tokens_per_s"] = generated / rollout_s if rollout_s else 0.0
        m["perf/update_tokens_per_s"] = train_stats.update_tokens / update_s if update_s else 0.0
        return m

    def _log(self, metrics: dict[str, Any]) -> None:
        append_jsonl(self.run_dir / "metrics.jsonl", [metrics])
        if self.config.tensorboard:
            if self._writer is None:
                from torch.utils.tensorboard import SummaryWriter

                self._writer = SummaryWriter(str(self.run_dir / "tb"))
            for k, v in metrics.items():
                if k != "step" and isinstance(v, (int, float)):
                    self._writer.add_scalar(k, v, metrics["step"])


def _check_demonstration_suite(suite: Any, config: TrainConfig) -> None:
    """Fail before the model loads when ``world_model_demos`` cannot get its demonstrations from `suite`.

    Raises:
        ValueError: the suite gives no reference solutions (``ground_truth``), or ``world_model_demo_errors`` > 0
            and it proposes no mistakes (``mutations``, `envace_gym.suites.proposes_mistakes`).
    """
    from envace_gym.suites import proposes_mistakes

    if not callable(getattr(suite, "ground_truth", None)):
        raise ValueError(
            f"world_model_demos plays reference solutions, and suite {config.suite!r} gives none (Suite.ground_truth): "
            "set world_model_demos 0"
        )
    if config.world_model_demo_errors and not proposes_mistakes(suite):
        raise ValueError(
            f"world_model_demo_errors={config.world_model_demo_errors} needs a suite that proposes mistakes "
            f"(Suite.mutations), and {config.suite!r} does not: set --world-model-demo-errors 0"
        )


@dataclass
class _StepView:
    """What a step's metrics are computed from: small enough to gather from every rank.

    Segment arrays are ``(S,)`` over the batch's ACT/REHEARSE segments (group ids global); ``truncated`` is
    per trajectory; ``role_tokens`` maps ``"act"``/``"rehearse"`` to loss tokens; ``world_model_tokens`` counts
    the batch's world-model target tokens.
    """

    rstats: RolloutStats
    truncated: list[bool]
    act_messages: int
    parse_errors: int
    seg_roles: np.ndarray
    seg_rewards: np.ndarray
    seg_advantages: np.ndarray
    seg_group_ids: np.ndarray
    role_tokens: dict[str, int]
    world_model_tokens: int = 0

    @classmethod
    def of(
        cls, trajectories: list[Trajectory], rstats: RolloutStats, batch: RolloutBatch, group_offset: int
    ) -> _StepView:
        acts, errors = _parse_error_counts(trajectories)
        return cls(
            rstats=rstats,
            truncated=[bool(t.truncated) for t in trajectories],
            act_messages=acts,
            parse_errors=errors,
            seg_roles=batch.seg_roles.cpu().numpy(),
            seg_rewards=batch.seg_rewards.double().cpu().numpy(),
            seg_advantages=batch.seg_advantages.double().cpu().numpy(),
            seg_group_ids=batch.seg_group_ids.cpu().numpy() + group_offset,
            role_tokens={
                role.name.lower(): int(((batch.role_mask == int(role)) & batch.loss_mask).sum())
                for role in (Role.ACT, Role.REHEARSE)
            },
            world_model_tokens=int(batch.world_model_mask.sum()) if batch.world_model_mask is not None else 0,
        )

    @classmethod
    def concat(cls, views: list[_StepView]) -> _StepView:
        """The views of all ranks (in rank order) as one."""
        return cls(
            rstats=RolloutStats.concat([v.rstats for v in views]),
            truncated=[t for v in views for t in v.truncated],
            act_messages=sum(v.act_messages for v in views),
            parse_errors=sum(v.parse_errors for v in views),
            **{
                k: np.concatenate([getattr(v, k) for v in views])
                for k in ("seg_roles", "seg_rewards", "seg_advantages", "seg_group_ids")
            },
            role_tokens={k: sum(v.role_tokens[k] for v in views) for k in views[0].role_tokens},
            world_model_tokens=sum(v.world_model_tokens for v in views),
        )


def micro_batches(lengths: list[int], max_tokens: int) -> list[torch.Tensor]:
    """Rows packed for the update's forward/backward passes: index tensors ``(m,) int64`` into `lengths`
    (each row's real tokens), rows of similar length together, at most `max_tokens` padded tokens (rows x
    longest row) each, a longer row alone; every row appears once (`agents.training.optim.bucket_batches`)."""
    return [
        torch.tensor(rows, dtype=torch.long)
        for rows in bucket_batches(lengths, max_tokens, max(len(lengths), 1), seed=0, epoch=0)
    ]


def _idle_pass(forward: torch.nn.Module, input_ids: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A forward of `forward` (a `TokenLogprobs`) over the first two ids of the first row, which runs every
    layer (one id alone predicts nothing and would skip the model): the pass a rank with fewer micro-batches
    makes so that it joins every FSDP all-gather of the others. Returns its ``(1, 2)`` logprobs."""
    ids = input_ids[:1, :2].to(device)  # (1, 2)
    return forward(ids, torch.ones_like(ids))


def _whole_minibatch_stats(
    stats: LossStats, local_tokens: int, global_tokens: float, parallel: DataParallel
) -> LossStats:
    """`LossStats` of the whole minibatch from this rank's: the loss terms are already divided by the whole
    minibatch's count, so they add up; the token means are re-weighted by each rank's loss tokens."""
    sums = ("loss", "pg_loss", "kl", "entropy", "world_model_loss")
    means = ("clip_fraction", "approx_kl", "ratio_mean")
    values = parallel.sum([getattr(stats, k) for k in sums] + [getattr(stats, k) * local_tokens for k in means])
    total = max(global_tokens, 1.0)
    return LossStats(
        **dict(zip(sums, values[: len(sums)])), **{k: v / total for k, v in zip(means, values[len(sums) :])}
    )


def _groups_with_variance(rewards: np.ndarray, group_ids: list[int]) -> int:
    """Groups whose K trajectory rewards are not all equal (the groups that carry a learning signal)."""
    ids = np.asarray(group_ids)
    return int(sum(float(np.ptp(rewards[ids == g])) > 0 for g in np.unique(ids)))


def _parse_error_counts(trajectories: list[Trajectory]) -> tuple[int, int]:
    """(ACT messages, those answered with a parse-error observation: a tool message with no call id)."""
    acts = errors = 0
    for t in trajectories:
        msgs = t.messages
        for i, m in enumerate(msgs):
            if m.role != "assistant":
                continue
            acts += 1
            nxt = msgs[i + 1] if i + 1 < len(msgs) else None
            if nxt is not None and nxt.role == "tool" and nxt.tool_call_id is None and nxt.content.startswith("Error:"):
                errors += 1
    return acts, errors
