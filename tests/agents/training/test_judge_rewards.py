"""Role-wise GRPO with LLM-judge rewards (``TrainConfig.reward``): the judge's checklist score replaces the
verifier's, the envs' verifier stays off, and a judge that always says yes or always says no gives R = 1 or R = 0."""

from __future__ import annotations

import pytest

import tests.testing_env  # noqa: F401  (registers the scripted suite, which derives no checklists)
from agents.config import TrainConfig
from agents.training.trainer import RoleWiseGRPOTrainer
from tests.judge_models import fixed_reply_policy

FAST = dict(
    model="tiny-random",
    suite="lab-stated",
    categories=["relocate"],
    batch_tasks=2,
    group_size=2,
    max_new_tokens=6,
    rehearse_max_new_tokens=6,
    max_steps_per_turn=2,
    min_solvable_fraction=0.0,
    tensorboard=False,
    num_steps=1,
)


@pytest.fixture(scope="module")
def judges(tmp_path_factory, smol_tokenizer):
    """Model folders of two fixed-reply judges: one answers every item met, one answers none."""
    out = {}
    for name, reply in (("yes", '{"answer": true}'), ("no", "No.")):
        folder = tmp_path_factory.mktemp(f"judge_{name}")
        policy = fixed_reply_policy(smol_tokenizer, reply)
        policy.model.save_pretrained(folder)
        smol_tokenizer.save_pretrained(folder)
        out[name] = str(folder)
    return out


@pytest.mark.parametrize("verdict, reward", [("yes", 1.0), ("no", 0.0)])
def test_the_judges_checklist_score_is_the_reward_and_no_backend_replays(tmp_path, judges, verdict, reward):
    config = TrainConfig(run_dir=str(tmp_path), reward="judge_imagined", judge_model=judges[verdict], **FAST)
    trainer = RoleWiseGRPOTrainer(config)
    assert all(not e.unwrapped.verify for e in trainer.env.unwrapped.envs)  # termination touches no real backend
    (m,) = trainer.train(progress=False)
    trainer.close()
    assert m["rollout/verifier_reward_mean"] == reward  # every lab checklist item judged met, or none
    assert m["rollout/judge_items"] > 0 and m["rollout/judge_unparseable"] == 0
    assert m["rollout/verifier_replay_calls"] == 0


def test_judge_rewards_need_a_checklist_source(tmp_path, judges):
    with pytest.raises(ValueError, match="needs checklists"):
        RoleWiseGRPOTrainer(
            TrainConfig(
                run_dir=str(tmp_path), reward="judge", judge_model=judges["yes"], **{**FAST, "suite": "scripted"}
            )
        )
    with pytest.raises(ValueError, match="judge_unparseable_score"):
        TrainConfig(run_dir=str(tmp_path), reward="judge", judge_unparseable_score=2.0, **FAST)
