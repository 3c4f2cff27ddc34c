"""`envace sft` on the tiny random model: the loss, bucketing, learning, masking,
checkpoints as GRPO `--init`, exact resume, LoRA, and the measurement helpers."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest
import torch

import envace_gym  # noqa: F401
import tests.testing_env  # noqa: F401  (registers the scripted suites)
from agents.cli import main
from agents.training.demonstrations import relabel_for_sft
from agents.training.logprobs import token_logprobs
from agents.training.sft import SFTConfig, SFTTrainer, act_parse_rate, bucket_batches, collate, demo_logprobs, sft_loss
from envace_gym.types import GeneratedText, Role
from wrappers import RealTools, RecordTrajectories

ADD = '<tool_call>{{"name": "add", "arguments": {{"value": {v}}}}}</tool_call>'
WEIGHTS = {Role.ACT: 1.0, Role.REHEARSE: 1.0}


def _play(env, task_id, texts):
    """Play `texts` as demonstration actions (content ids + <|im_end|>, as `agents.training.demonstrations` does)."""
    base = env.unwrapped
    stop = base.renderer.stop_token_ids[0]
    env.reset(seed=0, options={"task_id": task_id})
    for t in texts:
        *_, term, trunc, _ = env.step(GeneratedText(t, base.renderer.content_ids(t) + [stop], None))
        if term or trunc:
            return base.trajectory
    raise AssertionError("episode did not end")


@pytest.fixture(scope="module")
def demo():
    env = RealTools(gym.make("EnvACE-Rehearse-v0", suite="scripted", categories=None, model="tiny-random"))
    traj = _play(env, "scripted_1", [ADD.format(v=3), "Done.", ADD.format(v=4), "Done."])
    assert traj.reward == 1.0
    return relabel_for_sft(traj, env.unwrapped.renderer.stop_token_ids)


def _cfg(tmp_path, **kw):
    base = dict(
        run_dir=str(tmp_path),
        model="tiny-random",
        optim={"lr": 3e-3, "lr_schedule": "constant"},
        max_steps=3,
        run={"save_every": 1},
    )
    return SFTConfig(**{**base, **kw})


def _loss(model, traj, pad_id=2, weights=WEIGHTS):
    ids, mask, roles = collate([traj], pad_id)
    with torch.no_grad():
        lp = token_logprobs(model, ids, mask)
    return sft_loss(lp, roles, weights)[0].item()


def test_sft_loss_by_hand():
    lp = torch.tensor([[0.0, -1.0, -2.0, -3.0, -4.0, 0.0]])
    roles = torch.tensor([[0, 1, 1, 2, 4, -1]])
    loss, st = sft_loss(lp, roles, {Role.ACT: 1.0, Role.REHEARSE: 3.0})
    assert loss.item() == pytest.approx((1 + 2 + 3 * 3) / 5)  # token: weighted mean over target tokens
    assert st["loss/act"] == pytest.approx(1.5) and st["loss/rehearse"] == pytest.approx(3.0) and st["tokens/act"] == 2
    loss, _ = sft_loss(lp, roles, {Role.ACT: 1.0, Role.REHEARSE: 3.0}, "role")
    assert loss.item() == pytest.approx((1.5 + 3 * 3.0) / 4)  # role: weighted mean of per-role means
    with pytest.raises(ValueError):
        sft_loss(lp, roles, {Role.PROMPT: 1.0})


def test_bucket_batches_partition_budget_and_padding():
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(10, 500, (200,), generator=g).tolist()
    batches = bucket_batches(lengths, batch_tokens=1024, max_rows=8, seed=1, epoch=0)
    assert sorted(i for b in batches for i in b) == list(range(200))
    assert all(len(b) <= 8 and (len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 1024) for b in batches)
    assert bucket_batches(lengths, 1024, 8, seed=1, epoch=0) == batches
    assert bucket_batches(lengths, 1024, 8, seed=1, epoch=1) != batches
    pad = sum(len(b) * max(lengths[i] for i in b) for b in batches) / sum(lengths) - 1
    assert pad < 0.1  # sorted buckets of similar lengths; random batches of 8 pad about 50-60%


def test_shuffled_batches_have_one_row_count_and_mix_lengths_anew_each_epoch():
    lengths = [10] * 50 + [400] * 50  # two "families" of very different lengths
    batches = bucket_batches(lengths, batch_tokens=4000, max_rows=16, seed=1, epoch=0, group_by_length=False)
    assert sorted(i for b in batches for i in b) == list(range(100))
    assert [len(b) for b in batches] == [10] * 10  # min(16, 4000 // 400) rows, every epoch the same count
    assert sum(1 for b in batches if {lengths[i] for i in b} == {10, 400}) >= 8
    again = bucket_batches(lengths, 4000, 16, seed=1, epoch=0, group_by_length=False)
    assert again == batches and bucket_batches(lengths, 4000, 16, seed=1, epoch=1, group_by_length=False) != batches
    bucketed = bucket_batches(lengths, 4000, 16, seed=1, epoch=0)
    assert sum(1 for b in bucketed if len({lengths[i] for i in b}) > 1) <= 1  # only where the sorted order turns


def test_the_trainer_draws_shuffled_batches_when_asked(tmp_path, demo):
    demos = [demo] * 10
    lengths = [len(d.token_ids) for d in demos]
    trainer = SFTTrainer(_cfg(tmp_path, group_by_length=False, max_batch_rows=4, batch_tokens=1 << 20), demos=demos)
    assert trainer.batches_per_epoch == 3  # ceil(10 / 4)
    for step in (0, 4):  # epochs 0 and 1
        expected = bucket_batches(lengths, 1 << 20, 4, seed=trainer.config.seed, epoch=step // 3, group_by_length=False)
        assert trainer.batch_for_step(step) == expected[step % 3]
    buckets = ([0, 1, 2, 3], [4, 5, 6, 7], [8, 9])  # what length bucketing cuts equal lengths into
    assert any(trainer.batch_for_step(s) not in buckets for s in range(6))


def test_few_sft_steps_raise_act_and_rehearse_logprobs(tmp_path, demo):
    trainer = SFTTrainer(_cfg(tmp_path, max_steps=6, run={"save_every": 100}), demos=[demo])
    before = demo_logprobs(trainer.model, [demo], trainer.pad_id)
    hist = trainer.train(progress=False)
    after = demo_logprobs(trainer.model, [demo], trainer.pad_id)
    assert before["tokens/act"] > 0 and before["tokens/rehearse"] > 0
    assert after["logprob/act"] > before["logprob/act"] + 0.5
    assert after["logprob/rehearse"] > before["logprob/rehearse"] + 0.5
    assert hist[-1]["train/loss"] < hist[0]["train/loss"]
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 6 and lines[0]["data/padding_fraction"] == 0.0 and lines[0]["data/tokens/act"] > 0


def test_masked_tokens_are_left_out_of_the_loss(tiny_model, demo):
    base = _loss(tiny_model, demo)
    # the last token is a template piece (no target after it): changing its id leaves the loss unchanged
    assert demo.segments[-1].role == Role.TEMPLATE
    changed = type(demo)(
        task=demo.task,
        segments=[*demo.segments[:-1], type(demo.segments[-1])(Role.TEMPLATE, [5] * len(demo.segments[-1].token_ids))],
    )
    assert _loss(tiny_model, changed) == pytest.approx(base, abs=1e-6)
    # relabelling untrained tokens among PROMPT/TEMPLATE/OBSERVATION leaves it unchanged
    swap = {Role.PROMPT: Role.OBSERVATION, Role.TEMPLATE: Role.PROMPT, Role.OBSERVATION: Role.TEMPLATE}
    relabelled = type(demo)(
        task=demo.task,
        segments=[type(s)(swap.get(s.role, s.role), s.token_ids, s.logprobs, s.text) for s in demo.segments],
    )
    assert _loss(tiny_model, relabelled) == pytest.approx(base, abs=1e-6)
    # but relabelling a target as untrained, or changing a target id, does change it (the test can fail)
    first_act = next(i for i, s in enumerate(demo.segments) if s.role == Role.ACT)
    segs = list(demo.segments)
    segs[first_act] = type(segs[first_act])(Role.OBSERVATION, segs[first_act].token_ids)
    assert _loss(tiny_model, type(demo)(task=demo.task, segments=segs)) != pytest.approx(base, abs=1e-4)
    segs = list(demo.segments)
    segs[first_act] = type(segs[first_act])(Role.ACT, [7] + segs[first_act].token_ids[1:])
    assert _loss(tiny_model, type(demo)(task=demo.task, segments=segs)) != pytest.approx(base, abs=1e-4)
    # a row padded in a batch with a longer one gets the same loss (padding is masked)
    longer = type(demo)(task=demo.task, segments=[*demo.segments, type(demo.segments[0])(Role.ACT, [9, 10, 11])])
    ids, mask, roles = collate([demo, longer], 2)
    assert roles[0].tolist() == demo.role_mask + [-1] * 3
    with torch.no_grad():
        lp = token_logprobs(tiny_model, ids, mask)
    assert sft_loss(lp[:1], roles[:1], WEIGHTS)[0].item() == pytest.approx(base, abs=1e-5)


def _record(path, n_good=1):
    env = RecordTrajectories(
        RealTools(gym.make("EnvACE-Rehearse-v0", suite="scripted", categories=None, model="tiny-random")),
        path,
        include_tokens=True,
    )
    for _ in range(n_good):
        _play(env, "scripted_1", [ADD.format(v=3), "Done.", ADD.format(v=4), "Done."])
    _play(env, "scripted_1", [ADD.format(v=1), "Done.", "Done."])  # reward 0: filtered out


def test_cli_checkpoint_is_a_grpo_init_and_resume_is_exact(tmp_path):
    from agents.config import TrainConfig
    from agents.training.trainer import RoleWiseGRPOTrainer

    data = tmp_path / "rollouts.jsonl"
    _record(data)
    args = [
        "sft",
        "--model",
        "tiny-random",
        "--data",
        str(data),
        "--min-reward",
        "1.0",
        "--optim.lr",
        "3e-3",
        "--optim.lr-schedule",
        "linear",
        "--optim.warmup-steps",
        "1",
        "--max-steps",
        "3",
        "--run.save-every",
        "2",
    ]
    assert main(args + ["--run-dir", str(tmp_path / "a")]) == 0
    stats = json.loads((tmp_path / "a" / "data_stats.json").read_text())[str(data)]
    assert stats["kept"] == 1 and stats["skipped_reward"] == 1
    ckpt = tmp_path / "a" / "checkpoints" / "step_000003"
    assert (ckpt / "model" / "model.safetensors").is_file() and (ckpt / "optimizer.pt").is_file()

    # resume: 2 steps and a checkpoint, then a new trainer continues to 3 == 3 straight
    straight = SFTTrainer(
        SFTConfig(
            run_dir=str(tmp_path / "a"),
            model="tiny-random",
            data=[str(data)],
            max_steps=3,
            optim={"lr": 3e-3, "lr_schedule": "linear", "warmup_steps": 1},
        )
    )
    assert straight.step == 3
    cfg = dict(
        run_dir=str(tmp_path / "b"),
        model="tiny-random",
        data=[str(data)],
        optim={"lr": 3e-3, "lr_schedule": "linear", "warmup_steps": 1},
        max_steps=3,
        run={"save_every": 2},
    )
    first = SFTTrainer(SFTConfig(**cfg))
    first.train_step()
    first.train_step()
    first.save()
    resumed = SFTTrainer(SFTConfig(**cfg))
    assert resumed.step == 2
    resumed.train(progress=False)
    a, c = straight.model.state_dict(), resumed.model.state_dict()
    assert all(torch.equal(a[k], c[k]) for k in a)

    grpo = RoleWiseGRPOTrainer(
        TrainConfig(
            run_dir=str(tmp_path / "grpo"),
            init=str(ckpt / "model"),
            model="tiny-random",
            suite="scripted-length",
            categories=[],
            batch_tasks=2,
            group_size=2,
            max_new_tokens=4,
            rehearse_max_new_tokens=4,
            max_steps_per_turn=2,
            min_solvable_fraction=0.0,
            num_steps=1,
            tensorboard=False,
        )
    )
    g = grpo.policy.model.state_dict()
    assert all(torch.equal(a[k], g[k]) for k in a if k in g)
    (m,) = grpo.train(progress=False)
    assert torch.isfinite(torch.tensor(m["train/loss"]))


def test_lora_trains_adapters_only_and_saves_a_merged_model(tmp_path, demo):
    pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    trainer = SFTTrainer(
        _cfg(
            tmp_path,
            lora=True,
            lora_r=4,
            optim={"lr": 1e-2, "lr_schedule": "constant"},
            max_steps=2,
            run={"save_every": 2},
        ),
        demos=[demo],
    )
    frozen = {k: v.clone() for k, v in trainer.model.state_dict().items() if "lora_" not in k}
    before = demo_logprobs(trainer.model, [demo], trainer.pad_id)
    trainer.train(progress=False)
    after = demo_logprobs(trainer.model, [demo], trainer.pad_id)
    state = trainer.model.state_dict()
    assert all(torch.equal(frozen[k], state[k]) for k in frozen)  # base weights untouched
    assert after["logprob/act"] > before["logprob/act"]
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "checkpoints" / "step_000002" / "model")
    assert demo_logprobs(merged, [demo], trainer.pad_id)["logprob/act"] == pytest.approx(after["logprob/act"], abs=1e-4)
    resumed = SFTTrainer(
        _cfg(
            tmp_path,
            lora=True,
            lora_r=4,
            optim={"lr": 1e-2, "lr_schedule": "constant"},
            max_steps=2,
            run={"save_every": 2},
        ),
        demos=[demo],
    )
    assert resumed.step == 2
    assert demo_logprobs(resumed.model, [demo], trainer.pad_id)["logprob/act"] == pytest.approx(
        after["logprob/act"], abs=1e-5
    )


def test_config_validation_and_measurement(tmp_path):
    with pytest.raises(ValueError, match="unknown role"):
        SFTConfig(roles="act,world")
    with pytest.raises(ValueError, match="weight 0"):
        SFTConfig(roles="rehearse", rehearse_weight=0.0)
    with pytest.raises(ValueError, match="batch_tokens"):
        SFTConfig(batch_tokens=0)
    with pytest.raises(ValueError, match="memory.malloc_mmap_threshold_kb"):
        SFTConfig(memory={"malloc_mmap_threshold_kb": -1})
    from agents.policy import load_policy

    policy = load_policy("tiny-random")
    tasks = tests.testing_env.TASKS
    out = act_parse_rate(policy, tasks, max_new_tokens=4)
    assert out["n"] == 3 and 0.0 <= out["parse_rate"] <= 1.0 and len(out["texts"]) == 3


def test_prompt_weight_trains_the_leading_prompt_only():
    """The leading PROMPT run is a target of weight prompt_weight; TEMPLATE, a later PROMPT span (a mistaken
    call an error demonstration relabels PROMPT) and position 0 are not."""
    from agents.training.sft import leading_prompt_mask

    P, A, R, T = int(Role.PROMPT), int(Role.ACT), int(Role.REHEARSE), int(Role.TEMPLATE)
    roles = torch.tensor([[P, P, P, T, P, P, T, A, R, -1]])  # (1, 10)
    assert leading_prompt_mask(roles).tolist() == [[False, True, True] + [False] * 7]
    logprobs = torch.tensor([[0.0, -1.0, -3.0, -9.0, -9.0, -9.0, -9.0, -2.0, -4.0, 0.0]], requires_grad=True)
    weights = {Role.ACT: 1.0, Role.REHEARSE: 1.0}
    plain, stats = sft_loss(logprobs, roles, weights)
    assert stats["loss"] == pytest.approx(3.0) and "loss/prompt" not in stats
    loss, stats = sft_loss(logprobs, roles, weights, prompt_weight=0.5)
    assert stats["loss/prompt"] == pytest.approx(2.0) and stats["tokens/prompt"] == 2
    assert loss.item() == pytest.approx((2 + 4 + 0.5 * (1 + 3)) / (2 + 0.5 * 2))
    loss.backward()
    assert logprobs.grad[0, 1] != 0 and logprobs.grad[0, 4] == 0 and logprobs.grad[0, 3] == 0
    role_loss, stats = sft_loss(logprobs, roles, weights, "role", prompt_weight=1.0)
    assert role_loss.item() == pytest.approx((2 + 4 + 2) / 3)
    with pytest.raises(ValueError, match="data-parallel"):
        sft_loss(logprobs, roles, weights, counts={Role.ACT: 1, Role.REHEARSE: 1}, prompt_weight=1.0)
    with pytest.raises(ValueError, match="prompt_weight"):
        SFTConfig(prompt_weight=-1.0)
