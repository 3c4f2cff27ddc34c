"""The world-model anchor (``world_model_demos``): real demonstrations' tool outputs as world-model targets beside
rehearsed rollouts, on the tiny random model and the real lab backend.

`with_demonstrations` appends one row per demonstration whose targets are exactly its REHEARSE tokens (the real
outputs, error outputs included) and leaves the rollout rows and the GRPO loss alone; the trainer draws the same
demonstrations for the same (seed, step), its step lowers their cross-entropy with no real call in the rollouts,
and the config refuses settings in which the demonstrations would train nothing."""

from __future__ import annotations

import pytest
import torch

import envace_gym  # noqa: F401
from agents.config import TrainConfig
from agents.models import default_store
from agents.rollout import PAD_ROLE, build_batch, with_demonstrations
from agents.training.demonstrations import build_demonstrations
from agents.training.logprobs import token_logprobs
from agents.training.trainer import RoleWiseGRPOTrainer
from envace_gym.suites import make_suite
from envace_gym.types import Role, Segment, Trajectory

SUITE = make_suite("lab")
TASKS = [t.id for t in SUITE.tasks(["relocate"], "train")[:12]]


@pytest.fixture(scope="module")
def demos():
    tokenizer = default_store().tokenizer("tiny-random")
    got, stats = build_demonstrations(tokenizer, "lab", ["relocate"], "train", task_ids=TASKS[:3], mutations=1, seed=3)
    assert stats.error_demos > 0  # the batch below holds error outputs as targets
    return got


def _trainer(tmp_path, name, **kw):
    settings = dict(
        model="tiny-random",
        suite="lab",
        categories=["relocate"],
        split="train",
        task_ids=TASKS,
        batch_tasks=2,
        group_size=2,
        max_new_tokens=6,
        rehearse_max_new_tokens=6,
        max_steps_per_turn=4,
        min_solvable_fraction=0.0,
        optim={"lr": 1e-3},
        tensorboard=False,
        world_model_demos=3,
        world_model_loss_weight=1.0,
    )
    return RoleWiseGRPOTrainer(TrainConfig(run_dir=str(tmp_path / name), **{**settings, **kw}), log=None)


def _rollout_batch(trainer):
    from agents.rollout import collect_rollouts

    trajs, stats = collect_rollouts(trainer.policy, trainer.env, TASKS[:2], 2, max_new_tokens=6, seed=0)
    return build_batch(trajs, stats.group_ids, pad_id=trainer.policy.pad_id, world_model=True)


def test_demonstration_rows_hold_exactly_the_real_outputs_as_targets(tmp_path, demos):
    trainer = _trainer(tmp_path, "rows")
    plain = _rollout_batch(trainer)
    batch = with_demonstrations(plain, demos, trainer.policy.pad_id)
    n = plain.num_rows
    assert batch.num_rows == n + len(demos) and batch.row_kinds[n:] == ["demonstration"] * len(demos)
    width = plain.seq_len
    for name in ("input_ids", "attention_mask", "role_mask", "loss_mask", "advantages", "old_logprobs"):
        assert torch.equal(getattr(batch, name)[:n, :width], getattr(plain, name)), name
    assert not batch.world_model_mask[:n].any()  # rehearsed outputs are never world-model targets
    assert not batch.loss_mask[n:].any() and not batch.advantages[n:].any() and not batch.old_logprobs[n:].any()
    assert (batch.segment_ids[n:] == -1).all()
    pad = batch.attention_mask == 0  # (N, T): the widened columns of rollout rows and the tails of demo rows
    assert pad[:, width:].any() or batch.seq_len == width
    assert (batch.role_mask[pad] == PAD_ROLE).all() and (batch.input_ids[pad] == trainer.policy.pad_id).all()
    assert not (batch.world_model_mask & pad).any()
    assert batch.seg_rows.tolist() == plain.seg_rows.tolist()  # no new segment: the GRPO loss is unchanged
    errors = 0
    for j, demo in enumerate(demos):
        row = n + j
        ids = batch.input_ids[row][batch.attention_mask[row].bool()].tolist()
        assert ids == demo.token_ids
        targets = batch.input_ids[row][batch.world_model_mask[row]].tolist()
        assert targets == [i for s in demo.segments if s.role == Role.REHEARSE for i in s.token_ids]
        text = trainer.tokenizer.decode(targets)
        errors += "error" in text.lower()
    assert errors > 0  # the error demonstrations' real error outputs are targets too
    # a batch keeps its rows' order when selected, so a minibatch of demonstration rows alone carries targets only
    mb = batch.select(list(range(n, batch.num_rows)))
    assert mb.world_model_mask.any() and not mb.loss_mask.any()


def test_with_demonstrations_refuses_rollouts_and_unlabelled_trajectories(tmp_path, demos):
    trainer = _trainer(tmp_path, "refuse")
    plain = _rollout_batch(trainer)
    assert with_demonstrations(plain, [], trainer.policy.pad_id) is plain
    demo = demos[0]
    generated = Trajectory(
        task=demo.task,
        segments=[Segment(Role.PROMPT, [1, 2]), Segment(Role.ACT, [3], [-0.5]), Segment(Role.REHEARSE, [4])],
    )
    with pytest.raises(ValueError, match="recorded logprobs"):
        with_demonstrations(plain, [generated], trainer.policy.pad_id)
    untrained = Trajectory(task=demo.task, segments=[Segment(Role.PROMPT, [1, 2]), Segment(Role.OBSERVATION, [4])])
    with pytest.raises(ValueError, match="no REHEARSE token"):
        with_demonstrations(plain, [untrained], trainer.policy.pad_id)


def test_a_rehearsed_step_with_demonstrations_trains_the_world_model_without_real_rollout_calls(tmp_path):
    trainer = _trainer(tmp_path, "step", num_steps=1)
    demos = trainer.world_model_demonstrations(0)
    assert [d.token_ids for d in demos] == [d.token_ids for d in trainer.world_model_demonstrations(0)]  # seeded
    assert {d.task.id for d in demos} != {d.task.id for d in trainer.world_model_demonstrations(1)}
    rows = with_demonstrations(_rollout_batch(trainer), demos, trainer.policy.pad_id)

    def nll() -> float:
        with torch.no_grad():
            lp = token_logprobs(trainer.policy.model, rows.input_ids, rows.attention_mask, temperature=1.0)
        return float(-lp[rows.world_model_mask].mean())

    before = nll()
    (m,) = trainer.train(progress=False)
    assert m["rollout/real_tool_calls"] == 0  # the rollouts are rehearsed
    outputs = sum(s.role == Role.REHEARSE for d in demos for s in d.segments)
    assert m["rollout/demo_tool_calls"] == outputs > 0
    assert m["rollout/world_model_tokens"] >= int(rows.world_model_mask.sum()) > 0
    assert m["train/world_model_loss"] == pytest.approx(before, rel=1e-3)  # measured before the step
    assert nll() < before


def test_the_config_refuses_demonstrations_that_would_train_nothing():
    assert TrainConfig(world_model_demos=4, world_model_loss_weight=1.0).rollout == "rehearse"
    with pytest.raises(ValueError, match="world_model_loss_weight 0"):
        TrainConfig(world_model_demos=4)
    with pytest.raises(ValueError, match="set prompt_mode inline"):
        TrainConfig(world_model_demos=4, world_model_loss_weight=1.0, prompt_mode="separate")
    with pytest.raises(ValueError, match="must be >= 0"):
        TrainConfig(world_model_demos=-1, world_model_loss_weight=1.0)
    with pytest.raises(ValueError, match="--world-model-demos > 0"):
        TrainConfig(world_model_loss_weight=1.0)


def test_a_suite_that_cannot_give_the_demonstrations_is_refused_before_the_model_loads():
    from agents.training.trainer import _check_demonstration_suite

    config = TrainConfig(suite="bfcl", world_model_demos=4, world_model_loss_weight=1.0)
    with pytest.raises(ValueError, match="set --world-model-demo-errors 0"):  # BFCL proposes no mistakes
        _check_demonstration_suite(make_suite("bfcl"), config)
    no_errors = TrainConfig(suite="bfcl", world_model_demos=4, world_model_loss_weight=1.0, world_model_demo_errors=0)
    _check_demonstration_suite(make_suite("bfcl"), no_errors)  # reference solutions alone: accepted

    class NoReference:
        name = "none"

    with pytest.raises(ValueError, match="gives none"):
        _check_demonstration_suite(NoReference(), config)
