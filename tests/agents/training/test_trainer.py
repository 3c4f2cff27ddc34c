"""RoleWiseGRPOTrainer and `envace train` on the tiny random model."""

from __future__ import annotations

import json
import math

import pytest
import torch

import tests.testing_env  # noqa: F401  (registers the scripted suites)
from agents.cli import main
from agents.config import TrainConfig, load_config
from agents.training.trainer import RoleWiseGRPOTrainer

FAST = dict(
    model="tiny-random",
    suite="scripted-length",
    categories=[],
    batch_tasks=2,
    group_size=2,
    max_new_tokens=6,
    rehearse_max_new_tokens=6,
    max_steps_per_turn=2,
    min_solvable_fraction=0.0,
    optim={"lr": 1e-3},
    tensorboard=False,
)


def _params(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_envace_train_cli_one_step_writes_checkpoint_and_metrics(tmp_path):
    run = tmp_path / "run"
    args = [
        "train",
        "--run-dir",
        str(run),
        "--model",
        "tiny-random",
        "--suite",
        "scripted-length",
        "--categories",
        "--num-steps",
        "1",
        "--batch-tasks",
        "2",
        "--group-size",
        "2",
        "--max-new-tokens",
        "6",
        "--rehearse-max-new-tokens",
        "6",
        "--max-steps-per-turn",
        "2",
        "--min-solvable-fraction",
        "0",
        "--tensorboard",
        "true",
    ]
    assert main(args) == 0
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 1
    metrics = json.loads(lines[0])
    assert metrics["step"] == 1 and "rollout/reward_mean/act" in metrics and "train/clip_fraction" in metrics
    ckpt = run / "checkpoints" / "step_000001"
    assert (ckpt / "model" / "model.safetensors").is_file() and (ckpt / "optimizer.pt").is_file()
    assert (run / "config.yaml").is_file() and any((run / "tb").iterdir())


def test_two_steps_move_every_trained_parameter_and_keep_loss_finite(tmp_path):
    trainer = RoleWiseGRPOTrainer(TrainConfig(run_dir=str(tmp_path), num_steps=2, **FAST))
    before = _params(trainer.policy.model)
    history = trainer.train(progress=False)
    after = _params(trainer.policy.model)
    assert all(torch.isfinite(torch.tensor(h["train/loss"])) for h in history)
    assert any(h["train/advantage_abs/act"] > 0 for h in history)
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    # every weight matrix of the 2-layer model moves (norm weights may too); nothing is frozen
    assert {k for k in before if "layers.0.self_attn.q_proj" in k or "embed_tokens" in k} <= set(changed)


def test_resume_is_exact(tmp_path):
    """2 steps, then a new trainer resumes for 1 more == 3 steps straight (weights and metrics)."""
    straight = RoleWiseGRPOTrainer(TrainConfig(run_dir=str(tmp_path / "a"), num_steps=3, **FAST))
    hist_a = straight.train(progress=False)
    first = RoleWiseGRPOTrainer(TrainConfig(run_dir=str(tmp_path / "b"), num_steps=2, **FAST))
    first.train(progress=False)
    resumed = RoleWiseGRPOTrainer(TrainConfig(run_dir=str(tmp_path / "b"), num_steps=3, **FAST))
    assert resumed.step == 2
    hist_b = resumed.train(progress=False)
    a, b = _params(straight.policy.model), _params(resumed.policy.model)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert hist_a[-1]["rollout/reward_mean"] == hist_b[-1]["rollout/reward_mean"]


def test_a_generated_token_budget_ends_the_run_and_survives_a_resume(tmp_path):
    """The run stops at the first step whose cumulative generated tokens reach the budget; a resume with a larger
    budget continues from the checkpoint's count, not from zero."""
    first = RoleWiseGRPOTrainer(TrainConfig(run_dir=str(tmp_path), num_steps=10, generated_token_budget=1, **FAST))
    (m1,) = first.train(progress=False)
    first.close()
    assert m1["step"] == 1 and m1["rollout/generated_tokens_total"] == m1["rollout/generated_tokens"] > 0
    budget = m1["rollout/generated_tokens"] + 1  # one more step reaches it
    resumed = RoleWiseGRPOTrainer(
        TrainConfig(run_dir=str(tmp_path), num_steps=10, generated_token_budget=budget, **FAST)
    )
    assert resumed.step == 1 and resumed.generated_tokens == m1["rollout/generated_tokens"]
    (m2,) = resumed.train(progress=False)
    assert (
        m2["step"] == 2
        and m2["rollout/generated_tokens_total"] == m1["rollout/generated_tokens"] + m2["rollout/generated_tokens"]
    )


@pytest.mark.parametrize(
    "overrides",
    [
        dict(algo="grpo"),
        dict(prompt_mode="separate"),
        dict(policy="per_role"),
        dict(rollout="real", suite="scripted"),
        dict(rollout="null"),
        dict(beta=0.05, entropy_coef=0.01, aggregation="seq-mean-token-sum", ppo_epochs=2, num_minibatches=2),
        dict(rehearsal_n=2, rehearsal_mode="sequential"),
    ],
    ids=["grpo", "separate", "per_role", "real", "null", "kl-entropy-minibatches", "rehearsal-aware"],
)
def test_ablations_run_one_step(tmp_path, overrides):
    trainer = RoleWiseGRPOTrainer(TrainConfig(run_dir=str(tmp_path), num_steps=1, **{**FAST, **overrides}))
    (m,) = trainer.train(progress=False)
    assert m["step"] == 1 and m["train/loss"] == m["train/loss"]
    if overrides.get("policy") == "per_role":
        assert trainer.rehearse_policy.model is not trainer.policy.model
    # only rehearsal-aware rollouts generate attempt tokens, and they are counted in the generated total
    assert (m["rollout/attempt_tokens"] > 0) == ("rehearsal_n" in overrides)
    assert m["rollout/generated_tokens"] > m["rollout/attempt_tokens"]


def test_logprob_mismatch_is_logged_and_truncated_importance_sampling_keeps_on_policy_steps(tmp_path):
    """The engine and the trainer agree on the tiny fp32 model (mismatch near 0, weights near 1), so TIS
    changes the update by float noise only; in bfloat16 the same run still trains."""
    plain = RoleWiseGRPOTrainer(TrainConfig(run_dir=str(tmp_path / "plain"), num_steps=1, **FAST))
    (m,) = plain.train(progress=False)
    assert m["train/skipped_update"] == 0.0
    assert 0.0 <= m["train/logprob_mismatch"] < 1e-3 and m["train/tis_weight_mean"] is None
    tis = RoleWiseGRPOTrainer(
        TrainConfig(run_dir=str(tmp_path / "tis"), num_steps=1, importance_sampling_cap=2.0, **FAST)
    )
    (t,) = tis.train(progress=False)
    assert 0.0 <= t["train/logprob_mismatch"] < 1e-3 and t["train/tis_weight_mean"] == pytest.approx(1.0, abs=1e-3)
    a, b = _params(plain.policy.model), _params(tis.policy.model)
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)
    start = _params(RoleWiseGRPOTrainer(TrainConfig(run_dir=str(tmp_path / "start"), num_steps=1, **FAST)).policy.model)
    assert any(not torch.allclose(start[k], b[k], atol=1e-5) for k in b)  # ...and the update itself is not noise
    # an engine whose logprobs sit 1 nat below the trainer's: every ratio is e > cap, so every weight is the cap
    from agents.rollout import build_batch, collect_rollouts

    capped = RoleWiseGRPOTrainer(
        TrainConfig(run_dir=str(tmp_path / "cap"), num_steps=1, importance_sampling_cap=2.0, **FAST)
    )
    cfg = capped.config
    trajs, stats = collect_rollouts(
        capped.policy,
        capped.env,
        capped.sample_task_ids(0),
        cfg.group_size,
        max_new_tokens=cfg.max_new_tokens,
        temperature=cfg.temperature,
        seed=0,
    )
    batch = build_batch(trajs, stats.group_ids, pad_id=capped.policy.pad_id)
    batch.old_logprobs = torch.where(batch.loss_mask, batch.old_logprobs - 1.0, batch.old_logprobs)
    update = capped.update(batch)
    assert update.tis_weight_mean == pytest.approx(2.0) and update.logprob_mismatch == pytest.approx(1.0, abs=1e-3)
    low = RoleWiseGRPOTrainer(
        TrainConfig(run_dir=str(tmp_path / "bf16"), num_steps=1, dtype="bfloat16", importance_sampling_cap=2.0, **FAST)
    )
    assert next(low.policy.model.parameters()).dtype == torch.bfloat16
    (w,) = low.train(progress=False)
    assert math.isfinite(w["train/loss"]) and w["train/logprob_mismatch"] is not None


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_micro_batches_add_up_to_the_whole_minibatch_update(tmp_path, aggregation):
    """One row per forward/backward pass (micro_batch_tokens=1) applies the gradient of the whole minibatch in
    one pass: same weights and loss statistics up to float rounding, also with the KL and entropy terms."""
    cfg = dict(FAST, aggregation=aggregation, beta=0.1, entropy_coef=0.01, skip_empty_updates=False)
    runs = {}
    for name, tokens in (("whole", 10**6), ("rows", 1)):
        trainer = RoleWiseGRPOTrainer(
            TrainConfig(run_dir=str(tmp_path / name), num_steps=1, micro_batch_tokens=tokens, **cfg)
        )
        (metrics,) = trainer.train(progress=False)
        runs[name] = (metrics, _params(trainer.policy.model))
    (whole, w), (rows, r) = runs["whole"], runs["rows"]
    assert whole["train/update_targets"] == rows["train/update_targets"] == 1.0
    for key in ("train/loss", "train/pg_loss", "train/kl", "train/entropy", "train/ratio_mean", "train/grad_norm"):
        assert rows[key] == pytest.approx(whole[key], rel=1e-4, abs=1e-6), key
    # Adam's first step is lr * g / (|g| + eps): a coordinate whose gradient is near eps turns the passes' float
    # rounding of g into a visible share of lr (measured up to 1.7e-6 at lr 1e-3), so weights are compared to
    # lr / 100; a wrong gradient moves coordinates by about lr (the first step is nearly lr * sign(g)).
    assert all(torch.allclose(w[k], r[k], atol=FAST["optim"]["lr"] / 100) for k in w)
    start = _params(RoleWiseGRPOTrainer(TrainConfig(run_dir=str(tmp_path / "start"), num_steps=1, **cfg)).policy.model)
    assert any(not torch.allclose(start[k], r[k], atol=1e-5) for k in r)  # the step itself moved the weights


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-sum"])
def test_rows_without_signal_are_left_out_of_the_update_with_the_same_result(tmp_path, aggregation):
    """Rows whose every advantage is 0 add exactly nothing to the gradient: leaving them out of the passes
    (the default) gives the weights that running every row gives, over fewer tokens."""
    from agents.rollout import build_batch, collect_rollouts

    runs = {}
    for name, skip in (("pruned", True), ("every_row", False)):
        trainer = RoleWiseGRPOTrainer(
            TrainConfig(
                run_dir=str(tmp_path / name),
                num_steps=1,
                skip_empty_updates=skip,
                **{**FAST, "aggregation": aggregation},
            )
        )
        cfg = trainer.config
        trajs, stats = collect_rollouts(
            trainer.policy,
            trainer.env,
            trainer.sample_task_ids(0),
            cfg.group_size,
            max_new_tokens=cfg.max_new_tokens,
            temperature=cfg.temperature,
            seed=0,
        )
        batch = build_batch(trajs, stats.group_ids, pad_id=trainer.policy.pad_id)
        first_group = torch.tensor([g == stats.group_ids[0] for g in stats.group_ids])  # (N,) bool
        batch.advantages[first_group] = 0.0  # as if the first group's K rewards had been equal
        assert bool((batch.advantages[~first_group] != 0).any())
        runs[name] = (trainer.update(batch), _params(trainer.policy.model))
    (pruned, p), (every, e) = runs["pruned"], runs["every_row"]
    assert not pruned.skipped_update and not every.skipped_update
    assert 0 < pruned.update_tokens < every.update_tokens
    assert pruned.loss.pg_loss == pytest.approx(every.loss.pg_loss, rel=1e-4, abs=1e-7)
    assert pruned.grad_norm == pytest.approx(every.grad_norm, rel=1e-4)  # the same gradient, not just its sign
    assert all(torch.allclose(p[k], e[k], atol=1e-6) for k in p)


def test_a_minibatch_without_signal_still_takes_its_optimizer_step(tmp_path):
    """With two minibatches, one whose rows all have A = 0 runs no pass but AdamW still steps on a zero gradient
    (decoupled weight decay moves the weights), exactly as running its rows would."""
    from agents.rollout import build_batch, collect_rollouts

    weights = {}
    for name, skip in (("pruned", True), ("every_row", False)):
        trainer = RoleWiseGRPOTrainer(
            TrainConfig(run_dir=str(tmp_path / name), num_steps=1, skip_empty_updates=skip, num_minibatches=2, **FAST)
        )
        cfg = trainer.config
        trajs, stats = collect_rollouts(
            trainer.policy,
            trainer.env,
            trainer.sample_task_ids(0),
            cfg.group_size,
            max_new_tokens=cfg.max_new_tokens,
            temperature=cfg.temperature,
            seed=0,
        )
        batch = build_batch(trajs, stats.group_ids, pad_id=trainer.policy.pad_id)
        batch.advantages[1:] = 0.0  # only row 0 carries signal: one of the two minibatches has none
        assert bool((batch.advantages[0] != 0).any())
        update = trainer.update(batch)
        assert update.update_targets == 2 and not update.skipped_update
        weights[name] = _params(trainer.policy.model)
    p, e = weights["pruned"], weights["every_row"]
    assert all(torch.allclose(p[k], e[k], atol=1e-6) for k in p)

    from agents.training.trainer import micro_batches

    lengths = [500, 120, 480, 130, 900, 125]
    batches = micro_batches(lengths, 1000)
    assert sorted(int(i) for b in batches for i in b) == list(range(6))
    for b in batches:
        rows = b.tolist()
        assert len(rows) == 1 or len(rows) * max(lengths[i] for i in rows) <= 1000
    assert {tuple(sorted(b.tolist())) for b in batches} == {(1, 3, 5), (0, 2), (4,)}


def test_a_batch_without_signal_skips_its_update_unless_told_not_to(tmp_path):
    """The random model earns no reward on the plain scripted suite: every advantage is 0."""
    cfg = {**FAST, "suite": "scripted"}
    (skipped,) = RoleWiseGRPOTrainer(TrainConfig(run_dir=str(tmp_path / "a"), num_steps=1, **cfg)).train(progress=False)
    assert skipped["train/skipped_update"] == 1.0 and skipped["perf/update_tokens_per_s"] == 0.0
    run = RoleWiseGRPOTrainer(TrainConfig(run_dir=str(tmp_path / "b"), num_steps=1, skip_empty_updates=False, **cfg))
    before = _params(run.policy.model)
    (ran,) = run.train(progress=False)
    assert ran["train/skipped_update"] == 0.0 and ran["train/update_targets"] == 1.0 and ran["train/loss"] == 0.0
    after = _params(run.policy.model)
    # a zero gradient, but AdamW's decoupled weight decay still moves the weights: the step was taken
    assert any(not torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(group_size=1), "group-size 2"),
        (dict(num_minibatches=3), "whole minibatches"),
        (dict(algo="ppo"), "algo must be one of"),
        (dict(policy="per_role", rollout="real"), "per_role"),
        (dict(policy="per_role", rollout="null"), "never rehearses"),
        (dict(temperature=-1.0), "temperature"),
        (dict(memory={"malloc_mmap_threshold_kb": -1}), "memory.malloc_mmap_threshold_kb"),
        (dict(memory={"malloc_mmap_threshold_kb": 40000}), "memory.malloc_mmap_threshold_kb"),
        (dict(importance_sampling_cap=0.5), "importance_sampling_cap"),
        (dict(dtype="float16"), "dtype must be one of"),
        (dict(rollout="hybrid"), "rollout=hybrid needs real_call_prob"),
        (dict(rollout="hybrid", real_call_prob=1.5), r"real_call_prob in \[0, 1\] \(--real-call-prob\)"),
        (dict(real_call_prob=0.2), "set --rollout hybrid or leave real_call_prob unset"),
        (dict(rollout="real", real_call_prob=1.0), "rollout=real takes none"),
        (dict(world_model_loss_weight=-1.0), "world_model_loss_weight must be >= 0"),
        (dict(world_model_loss_weight=1.0), "rollout=rehearse makes none"),
        (dict(rollout="null", world_model_loss_weight=1.0), "rollout=null makes none"),
        (dict(rollout="hybrid", real_call_prob=0.0, world_model_loss_weight=1.0), "real_call_prob=0 makes none"),
        (dict(policy="per_role", rollout="real", world_model_loss_weight=1.0), "never rehearses"),
        (dict(policy="per_role", rollout="hybrid", real_call_prob=1.0), "at real_call_prob=1 never rehearses"),
    ],
)
def test_bad_configs_fail_fast_with_a_message(bad, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(**{**FAST, **bad})


def test_yaml_config_with_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("optim: {lr: 0.001}\ngroup_size: 4\n")
    config = load_config(path, group_size=2)
    assert (
        config.optim.lr == 0.001
        and config.optim.weight_decay == 0.01
        and config.group_size == 2
        and config.trajectories_per_step == config.batch_tasks * 2
    )
    path.write_text("learning_rate: 1\n")
    with pytest.raises(ValueError, match="unknown TrainConfig field"):
        load_config(path)


def test_a_batch_without_signal_skips_the_update_and_leaves_weights_unchanged(tmp_path):
    """scripted suite + random model: every reward is 0, so every advantage is 0 and nothing is learned."""
    trainer = RoleWiseGRPOTrainer(TrainConfig(run_dir=str(tmp_path), num_steps=1, **{**FAST, "suite": "scripted"}))
    before = _params(trainer.policy.model)
    (m,) = trainer.train(progress=False)
    assert m["train/skipped_update"] == 1.0 and m["rollout/reward_std"] == 0.0
    after = _params(trainer.policy.model)
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_truncation_and_budget_metrics_are_logged(tmp_path):
    trainer = RoleWiseGRPOTrainer(TrainConfig(run_dir=str(tmp_path), num_steps=1, **FAST))
    (m,) = trainer.train(progress=False)
    assert 0 <= m["rollout/truncated_fraction"] <= m["rollout/reward_capped_fraction"] <= 1
    assert m["rollout/reward_capped_fraction"] > 0  # 6-token ACT messages: the random model is cut
    assert 0 <= m["rollout/groups_with_reward_variance"] <= FAST["batch_tasks"]


def test_per_role_statistics_average_only_models_with_loss_tokens(tmp_path):
    """No tool call is made, so the REHEARSE model has no token: its empty target must not halve the ratio."""
    trainer = RoleWiseGRPOTrainer(
        TrainConfig(
            run_dir=str(tmp_path), num_steps=1, **{**FAST, "suite": "scripted", "policy": "per_role", "beta": 0.05}
        )
    )
    (m,) = trainer.train(progress=False)
    assert m["rollout/tokens/rehearse"] == 0 and m["rollout/tokens/act"] > 0
    assert m["train/update_targets"] == 1 and m["train/skipped_update"] == 0
    assert m["train/ratio_mean"] == pytest.approx(1.0, abs=1e-4)


def test_prefix_kv_is_cleared_after_a_fused_adamw_step(tmp_path):
    """Fused AdamW updates the weights without bumping ``Tensor._version``: the cached prompt KV of the old
    weights must still not be reused, so the next rollout's logprobs equal a full recompute."""
    from agents.training.logprobs import token_logprobs

    trainer = RoleWiseGRPOTrainer(
        TrainConfig(run_dir=str(tmp_path), num_steps=1, **{**FAST, "beta": 0.05, "optim": {"lr": 5e-2}})
    )
    model = trainer.policy.model
    trainer.optimizers["model"] = torch.optim.AdamW(model.parameters(), lr=5e-2, fused=True)
    trainer.schedulers["model"] = torch.optim.lr_scheduler.LambdaLR(trainer.optimizers["model"], lambda s: 1.0)
    versions = [p._version for p in model.parameters()]
    before = _params(model)
    entries_during_update = []
    step = trainer._minibatch_step
    trainer._minibatch_step = lambda *a, **k: (
        entries_during_update.append(len(trainer.policy.kv_cache)),
        step(*a, **k),
    )[1]
    trainer.train_step()
    assert entries_during_update == [0]  # the rollouts' KV is dropped before an update's passes (its memory)
    assert [p._version for p in model.parameters()] == versions  # the fingerprint alone would miss this update
    assert any(not torch.equal(before[k], v) for k, v in _params(model).items())
    assert len(trainer.policy.kv_cache) == 0
    prompt = trainer.env.envs[0].trajectory.token_ids[:40]
    (g,) = trainer.policy.generate([prompt], max_new_tokens=4, temperature=1.0, seeds=[0])
    ids = torch.tensor([prompt + g.token_ids])
    with torch.no_grad():
        recomputed = token_logprobs(model.eval(), ids, torch.ones_like(ids))[0, len(prompt) :]
    assert torch.allclose(recomputed, torch.tensor(g.logprobs), atol=1e-4)


def test_non_finite_gradients_are_skipped_then_stop_the_run(tmp_path):
    trainer = RoleWiseGRPOTrainer(
        TrainConfig(run_dir=str(tmp_path), num_steps=3, **{**FAST, "beta": 0.05, "max_nonfinite_steps": 2})
    )
    embed = trainer.policy.model.get_input_embeddings().weight
    embed.register_hook(lambda g: g * float("nan"))
    before = _params(trainer.policy.model)
    m = trainer.train_step()
    assert m["train/skipped_nonfinite"] == 1 and m["train/update_targets"] == 0
    after = _params(trainer.policy.model)
    assert all(torch.equal(before[k], after[k]) for k in before)  # nothing was applied
    trainer.save()
    resumed = RoleWiseGRPOTrainer(
        TrainConfig(run_dir=str(tmp_path), num_steps=3, **{**FAST, "beta": 0.05, "max_nonfinite_steps": 2})
    )
    assert resumed.step == 1 and resumed.nonfinite_in_a_row == {"model": 1}  # the count survives a resume
    with pytest.raises(FloatingPointError, match="2 optimizer steps in a row.*--max-nonfinite-steps"):
        trainer.train_step()
