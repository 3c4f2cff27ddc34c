"""Hybrid rollouts and the world-model loss on the tiny random model and the real lab backend.

`collect_rollouts(rollout="hybrid")` through the batched vector env: p = 0 is a rehearsed rollout, p = 1 a real one,
in between the same seed draws the same calls real and the backend executions count the catch-up; `build_batch`
marks the real outputs as REHEARSE targets in both prompt modes; the trainer's world-model term lowers their
cross-entropy, and with weight 0 the update is the plain GRPO update."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch

import envace_gym  # noqa: F401
from agents.config import TrainConfig
from agents.rollout import build_batch, collect_rollouts, group_ids_for
from agents.training.logprobs import token_logprobs
from agents.training.trainer import RoleWiseGRPOTrainer
from envace_gym.parsing import format_tool_calls
from envace_gym.suites import make_suite
from envace_gym.types import Role, ToolCall

B, K = 2, 2
SUITE = make_suite("lab")
TASKS = [t.id for t in SUITE.tasks(["relocate"], "test")[:B]]


class ScriptedLab:
    """Each env's next action is the next call of its script (its task's reference calls, then a look at every
    shelf), one call per message, then ``"Done."``; plain text, so ACT carries no logprobs."""

    def __init__(self, envs):
        self.envs = [e.unwrapped for e in envs]

    @staticmethod
    def script(task) -> list[ToolCall]:
        calls = [c for turn in SUITE.ground_truth(task) for c in turn]
        shelves = task.turns[0][0].content.split(".")[0].split()[1:]  # "Shelves A B C D. ..."
        return calls + [ToolCall("list_shelf", {"shelf": s}) for s in shelves]

    def act(self, contexts, *, max_new_tokens, temperature, seeds):
        out = []
        for context in contexts:
            env = next(e for e in self.envs if e.trajectory.token_ids == list(context))
            done = sum(m.role == "assistant" for m in env.trajectory.messages)
            script = self.script(env.task)
            out.append(format_tool_calls([script[done]], "hermes") if done < len(script) else "Done.")
        return out


def _venv(mode: str):
    return gym.make_vec(
        "EnvACE-Rehearse-v0",
        num_envs=B * K,
        vectorization_mode="vector_entry_point",
        suite="lab",
        categories=["relocate"],
        split="test",
        model="tiny-random",
        prompt_mode=mode,
        max_new_tokens=6,
        temperature=1.0,
        max_steps_per_turn=10,
    )


@pytest.fixture(scope="module")
def venvs():
    return {"inline": _venv("inline"), "separate": _venv("separate")}


def _play(venv, rollout, seed=5, **kw):
    return collect_rollouts(ScriptedLab(venv.unwrapped.envs), venv, TASKS, K, seed=seed, rollout=rollout, **kw)


def _tool_roles(traj) -> list[Role]:
    """The role of each call's output in an inline trajectory, in order (REHEARSE: rehearsed, OBSERVATION: real)."""
    return [s.role for s in traj.segments if s.role in (Role.REHEARSE, Role.OBSERVATION)]


def test_p0_is_a_rehearsed_rollout_and_p1_a_real_one(venvs):
    venv = venvs["inline"]
    rehearsed, r_stats = _play(venv, "rehearse")
    zero, z_stats = _play(venv, "hybrid", real_call_prob=0.0)
    assert [t.token_ids for t in zero] == [t.token_ids for t in rehearsed]  # the same rehearsals, seed for seed
    assert z_stats.real_tool_calls == z_stats.real_answers == r_stats.real_tool_calls == 0
    assert all(not e.real_outputs for t in zero for e in t.turn_info)
    real, real_stats = _play(venv, "real")
    one, o_stats = _play(venv, "hybrid", real_call_prob=1.0)
    assert [t.token_ids for t in one] == [t.token_ids for t in real]
    calls = sum(len(_tool_roles(t)) for t in one)
    assert calls >= B * K * 3 and all(set(_tool_roles(t)) == {Role.OBSERVATION} for t in one)
    assert o_stats.real_tool_calls == o_stats.real_answers == real_stats.real_tool_calls == calls
    assert real_stats.real_answers == calls
    assert [t.reward for t in one] == [t.reward for t in real] == [1.0] * (B * K)  # the scripts solve the tasks


def test_hybrid_draws_are_reproducible_and_executions_include_the_catch_up(venvs):
    venv = venvs["inline"]
    before = venv.unwrapped.num_rehearsal_calls
    trajs, stats = _play(venv, "hybrid", real_call_prob=0.5)
    rounds = venv.unwrapped.num_rehearsal_calls - before
    again, again_stats = _play(venv, "hybrid", real_call_prob=0.5)
    assert [t.token_ids for t in again] == [t.token_ids for t in trajs] and again_stats == stats
    other, _ = _play(venv, "hybrid", real_call_prob=0.5, seed=6)
    assert [_tool_roles(t) for t in other] != [_tool_roles(t) for t in trajs]
    roles = [_tool_roles(t) for t in trajs]
    real = [[r == Role.OBSERVATION for r in rs] for rs in roles]
    rehearsed = sum(not x for rs in real for x in rs)
    assert 0 < stats.real_answers == sum(map(sum, real)) < sum(map(len, real))
    # a trajectory's backend executed every call up to its last real one (the rehearsed ones before it included)
    assert stats.real_tool_calls == sum(max((i + 1 for i, x in enumerate(rs) if x), default=0) for rs in real)
    assert stats.real_tool_calls > stats.real_answers
    assert 0 < rounds < rehearsed  # the rehearsed calls of the envs were still batched per round
    records = [r for t in trajs for e in t.turn_info for r in e.real_outputs]
    assert len(records) == stats.real_answers


def test_build_batch_marks_the_real_outputs_as_rehearse_targets(venvs):
    for mode, venv in venvs.items():
        trajs, stats = _play(venv, "hybrid", real_call_prob=0.5)
        plain = build_batch(trajs, group_ids_for(B, K), prompt_mode=mode, pad_id=0)
        batch = build_batch(trajs, group_ids_for(B, K), prompt_mode=mode, pad_id=0, world_model=True)
        assert not plain.world_model_mask.any() and "world_model" not in plain.row_kinds
        records = [r for t in trajs for e in t.turn_info for r in e.real_outputs]
        assert len(records) == stats.real_answers > 0
        assert int(batch.world_model_mask.sum()) == sum(len(r.token_ids) for r in records)
        assert not (batch.world_model_mask & batch.loss_mask).any()  # no advantage: not in the GRPO loss
        n = plain.num_rows
        assert torch.equal(batch.loss_mask[:n], plain.loss_mask) and torch.equal(batch.advantages[:n], plain.advantages)
        if mode == "inline":
            assert batch.num_rows == n == B * K
            assert set(batch.role_mask[batch.world_model_mask].tolist()) <= {int(Role.OBSERVATION), int(Role.TEMPLATE)}
        else:
            rehearser = venv.unwrapped.rehearser
            rows = [i for i, k in enumerate(batch.row_kinds) if k == "world_model"]
            assert rows == list(range(n, batch.num_rows)) and len(rows) == len(records)
            end = venv.unwrapped.envs[0].unwrapped.renderer.generation_end_ids("assistant")
            for row, record in zip(rows, records):
                ids = batch.input_ids[row][batch.attention_mask[row].bool()].tolist()
                assert ids == record.prompt_ids + record.token_ids and record.token_ids[-len(end) :] == end
                assert batch.world_model_mask[row].nonzero().flatten().tolist() == list(
                    range(len(record.prompt_ids), len(ids))
                )
                assert record.prompt_ids[-3:] == rehearser.policy.renderer.generation_prompt_ids[-3:]
        # the targets are the tool messages the real backend wrote
        texts = [m.content for t in trajs for m in t.messages if m.role == "tool"]
        assert all(r.text in texts for r in records)


def _trainer(tmp_path, name, **kw):
    settings = dict(
        model="tiny-random",
        suite="lab",
        categories=["relocate"],
        split="test",
        task_ids=TASKS,
        batch_tasks=B,
        group_size=K,
        max_new_tokens=6,
        rehearse_max_new_tokens=6,
        max_steps_per_turn=10,
        min_solvable_fraction=0.0,
        optim={"lr": 1e-3},
        tensorboard=False,
        rollout="hybrid",
        real_call_prob=0.5,
    )
    return RoleWiseGRPOTrainer(TrainConfig(run_dir=str(tmp_path / name), **{**settings, **kw}), log=None)


def _params(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _target_nll(model, batch) -> float:
    with torch.no_grad():
        lp = token_logprobs(model, batch.input_ids, batch.attention_mask, temperature=1.0)  # (N, T)
    return float(-lp[batch.world_model_mask].mean())


def test_the_world_model_term_lowers_the_targets_cross_entropy_and_weight_zero_is_plain_grpo(tmp_path):
    off = _trainer(tmp_path, "off")
    trajs, stats = collect_rollouts(
        ScriptedLab(off.env.envs), off.env, TASKS, K, seed=0, rollout="hybrid", real_call_prob=0.5
    )
    batch = build_batch(trajs, stats.group_ids, pad_id=off.policy.pad_id, world_model=True)
    plain = build_batch(trajs, stats.group_ids, pad_id=off.policy.pad_id)
    assert int(batch.world_model_mask.sum()) > 0
    # give the rehearsed tokens a signal, so that the GRPO term is not zero
    signal = (batch.role_mask == int(Role.REHEARSE)) & batch.loss_mask
    assert signal.any()
    for b in (batch, plain):
        b.advantages = torch.where(signal, torch.tensor(0.5), torch.zeros_like(b.advantages))
    start = _target_nll(off.policy.model, batch)

    a = off.update(batch)  # weight 0: the targets are ignored
    plain_trainer = _trainer(tmp_path, "plain")
    p = plain_trainer.update(plain)
    assert a.loss.loss == pytest.approx(p.loss.loss, abs=1e-7) and a.loss.world_model_loss == 0.0
    assert a.loss.loss == pytest.approx(a.loss.pg_loss) and a.update_tokens == p.update_tokens
    w_off, w_plain = _params(off.policy.model), _params(plain_trainer.policy.model)
    assert all(torch.equal(w_off[k], w_plain[k]) for k in w_off)

    on = _trainer(tmp_path, "on", world_model_loss_weight=1.0)
    u = on.update(batch)
    assert u.loss.world_model_loss == pytest.approx(start, rel=1e-4)  # measured before the step, at temperature 1
    assert u.loss.loss == pytest.approx(u.loss.pg_loss + u.loss.world_model_loss, rel=1e-5)
    assert u.loss.pg_loss == pytest.approx(a.loss.pg_loss, rel=1e-5)
    after = _target_nll(on.policy.model, batch)
    assert after < start and after < _target_nll(off.policy.model, batch)  # the step moved toward the targets
    # the targets alone are a learning signal: with every advantage 0 the step is still taken
    zero = build_batch(trajs, stats.group_ids, pad_id=off.policy.pad_id, world_model=True)
    zero.advantages = torch.zeros_like(zero.advantages)
    before = _target_nll(on.policy.model, zero)
    z = on.update(zero)
    assert not z.skipped_update and z.loss.pg_loss == 0.0 and _target_nll(on.policy.model, zero) < before
    assert off.update(zero).skipped_update  # no target is trained with the weight at 0


def test_one_training_step_logs_real_calls_answers_and_the_world_model_loss(tmp_path):
    trainer = _trainer(tmp_path, "run", world_model_loss_weight=1.0, real_call_prob=1.0, num_steps=1)
    # the scripted ACT makes tool calls (a random tiny model would not): what is tested is the metrics' plumbing
    trainer.policy.act = ScriptedLab(trainer.env.envs).act  # type: ignore[method-assign]
    (m,) = trainer.train(progress=False)
    assert m["rollout/real_tool_calls"] == m["rollout/real_answers"] > 0  # p = 1: every call real, no catch-up
    assert m["rollout/world_model_tokens"] > 0 and m["train/world_model_loss"] > 0.0


def test_the_fields_combine_as_documented(tmp_path):
    from agents.config import load_config

    assert TrainConfig(rollout="real", world_model_loss_weight=0.5).real_call_prob is None
    assert TrainConfig(rollout="hybrid", real_call_prob=0.2, policy="per_role").policy == "per_role"
    path = tmp_path / "hybrid.yaml"
    path.write_text("rollout: hybrid\nreal_call_prob: '0.05'\nworld_model_loss_weight: 1\n")
    config = load_config(path)
    assert config.real_call_prob == 0.05 and config.world_model_loss_weight == 1.0
    with pytest.raises(ValueError, match="rollout=hybrid needs real_call_prob"):
        load_config(path, real_call_prob="none")
