"""`agents.training.trl_adapter`: envace-gym episodes as TRL `GRPOTrainer` rollouts (real TRL 1.16, tiny model)."""

from __future__ import annotations

import os

import pytest
import torch

import tests.testing_env  # noqa: F401  (registers the scripted suites)
from agents.models import default_store
from agents.training.trl_adapter import TASK_KEY, EnvACERollout, envace_dataset, envace_reward

ADD = '<tool_call>{{"name": "add", "arguments": {{"value": {v}}}}}</tool_call>'


class ScriptedEngine:
    """Stands in for TRL's trainer where the test needs fixed ACT messages: ``processing_class`` and
    ``_generate_single_turn`` (content ids + <|im_end|>, no logprobs, as TRL's Transformers path returns)."""

    def __init__(self, scripts):
        self.processing_class = default_store().tokenizer("tiny-random")
        self.scripts = {i: list(s) for i, s in enumerate(scripts)}
        self.rows_seen = []

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations):
        tok = self.processing_class
        stop = tok.convert_tokens_to_ids("<|im_end|>")
        # the rows still playing, in order: the scripts that have messages left
        live = [i for i in sorted(self.scripts) if self.scripts[i]]
        assert len(live) == len(prompt_ids)
        self.rows_seen.append(len(prompt_ids))
        return [tok.encode(self.scripts[i].pop(0), add_special_tokens=False) + [stop] for i in live], None


def test_episodes_become_prompt_completion_and_a_mask_of_act_tokens():
    rollout = EnvACERollout(suite="scripted", categories=None, max_new_tokens=64, max_steps_per_turn=3)
    good = [ADD.format(v=3), "Done.", ADD.format(v=4), "Done."]  # the task's answer: reward 1
    wrong = [ADD.format(v=1), "Done.", "Done."]  # reward 0
    prompts = [[{"role": "user", "content": "", TASK_KEY: "scripted_1"}]] * 2
    out = rollout(prompts, ScriptedEngine([good, wrong]))
    assert out["envace_reward"] == [1.0, 0.0]
    assert "Now add 4." in default_store().tokenizer("tiny-random").decode(
        out["completion_ids"][0]
    )  # the 2nd user turn
    assert envace_reward(prompts, [None, None], **{k: v for k, v in out.items() if k == "envace_reward"}) == [1.0, 0.0]
    tok = default_store().tokenizer("tiny-random")
    for ids, mask, script in zip(out["completion_ids"], out["env_mask"], (good, wrong)):
        assert len(ids) == len(mask)
        trained = tok.decode([t for t, m in zip(ids, mask) if m])
        assert trained == "".join(s + "<|im_end|>" for s in script)  # exactly the ACT messages carry loss
        untrained = tok.decode([t for t, m in zip(ids, mask) if not m])
        assert '<|im_start|>tool\n{"total": ' in untrained  # the real tool's output is in the completion, masked
    assert out["logprobs"] is None  # the Transformers engine records none: TRL recomputes them
    # the prompt ends where the first ACT message starts: the rendered system, tools and first user turn
    assert tok.decode(out["prompt_ids"][0]).rstrip().endswith("<|im_start|>assistant")
    with pytest.raises(KeyError, match="envace_dataset"):
        rollout([[{"role": "user", "content": "x"}]], ScriptedEngine([good]))


def test_one_trl_grpo_step_trains_on_envace_episodes(tmp_path):
    """TRL's GRPOTrainer with the adapter: its engine plays the episodes, our verifier's reward is what it
    logs, and the step moves the weights (the length reward gives the groups reward variance)."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from trl import GRPOConfig, GRPOTrainer

    store = default_store()
    model = store.model("tiny-random", shared=False)
    tokenizer = store.tokenizer("tiny-random")
    tokenizer.padding_side = "left"
    dataset = envace_dataset("scripted-length", None)
    assert set(dataset[0]) == {"prompt", "task_id"} and dataset[0]["prompt"][0][TASK_KEY] == dataset[0]["task_id"]
    rollout = EnvACERollout(suite="scripted-length", categories=None, max_new_tokens=8, max_steps_per_turn=2)
    args = GRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        report_to="none",
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=8,
        max_steps=1,
        logging_steps=1,
        learning_rate=1e-3,
        save_strategy="no",
        seed=0,
    )
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=envace_reward,
        args=args,
        train_dataset=dataset,
        rollout_func=rollout,
        processing_class=tokenizer,
    )
    trainer.train()
    logged = trainer.state.log_history[0]
    assert rollout.last_stats["episodes"] == 4
    assert logged["rewards/envace_reward/mean"] == pytest.approx(rollout.last_stats["reward_mean"], abs=1e-6)
    assert logged["reward_std"] > 0  # a learning signal, so the update below is real
    after = model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    # TRL counted only the ACT tokens as completion length (env_mask), never the tool outputs or user turns
    assert logged["completions/mean_length"] == pytest.approx(rollout.last_stats["act_tokens"] / 4)
