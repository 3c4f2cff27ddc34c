"""Tests of agents/rollout.py: rollouts on the tiny random model through the scripted suite, and batching.

The key check: logprobs recomputed by one forward pass (`agents.training.logprobs.token_logprobs`) over the batch
rows equal the logprobs recorded at generation on every loss position, in both prompt modes. A token at
the wrong offset, a wrong mask or a re-tokenised piece would break it (token in, token out; docs/design.md §3).
"""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import envace_gym  # noqa: F401
import tests.testing_env  # noqa: F401
from agents.grpo import grpo_advantages, role_wise_advantages
from agents.policy import load_policy
from agents.rollout import PAD_ROLE, RolloutBatch, build_batch, collect_rollouts, group_ids_for
from agents.training.logprobs import token_logprobs
from envace_gym.types import GeneratedText, Message, RehearsalRecord, Role, Segment, Task, Trajectory, TurnInfo

B, K = 2, 2
TASKS = ["scripted_0", "scripted_1"]
NEW = 6
ADD3 = '<tool_call>{"name": "add", "arguments": {"value": 3}}</tool_call>'
TWO_CALLS = "[echo(text='a'), add(value=1)]"
# First ACT of each env (plain text: tokenised by the env, no logprobs, so no loss); None = the model's.
FIRST = [ADD3, TWO_CALLS, None, ADD3]


class FirstStepScript:
    """The tiny model's policy, except that the first `act` call returns fixed plain-text actions where given.

    A random model almost never writes a tool call; forcing the first action to be one makes every episode
    rehearse (or call the real tool), so the REHEARSE/OBSERVATION paths are exercised.
    """

    def __init__(self, policy, first):
        self.policy, self.first, self.calls = policy, list(first), 0

    def act(self, contexts, *, max_new_tokens, temperature, seeds):
        out = self.policy.act(contexts, max_new_tokens=max_new_tokens, temperature=temperature, seeds=seeds)
        if self.calls == 0:
            out = [f if f is not None else o for f, o in zip(self.first, out)]
        self.calls += 1
        return out


class EmptyFirst:
    """The tiny model's policy, except that env 0's first action is empty (just the stop token)."""

    def __init__(self, policy):
        self.policy, self.calls = policy, 0

    def act(self, contexts, *, max_new_tokens, temperature, seeds):
        out = self.policy.act(contexts, max_new_tokens=max_new_tokens, temperature=temperature, seeds=seeds)
        if self.calls == 0:
            out[0] = GeneratedText("", [self.policy.stop_ids[0]], [-0.5])
        self.calls += 1
        return out


@pytest.fixture(scope="module")
def policy():
    return load_policy("tiny-random")


def _venv(prompt_mode):
    return gym.make_vec(
        "EnvACE-Rehearse-v0",
        num_envs=B * K,
        vectorization_mode="vector_entry_point",
        suite="scripted",
        categories=None,
        model="tiny-random",
        prompt_mode=prompt_mode,
        max_new_tokens=NEW,
        temperature=1.0,
    )


@pytest.fixture(scope="module")
def venvs():
    return {"inline": _venv("inline"), "separate": _venv("separate")}


@pytest.fixture(scope="module")
def rollouts(policy, venvs):
    """One scripted-first-step rollout per prompt mode: {mode: (trajectories, stats)}."""
    out = {}
    for mode, venv in venvs.items():
        out[mode] = collect_rollouts(
            FirstStepScript(policy, FIRST), venv, TASKS, K, max_new_tokens=NEW, temperature=1.0, seed=3
        )
    return out


def _batch(trajs, policy, mode, **kw):
    return build_batch(trajs, group_ids_for(B, K), prompt_mode=mode, pad_id=policy.pad_id, **kw)


@pytest.mark.parametrize("mode", ["inline", "separate"])
def test_recomputed_logprobs_match_recorded_ones_on_loss_positions(policy, rollouts, mode):
    trajs, _ = rollouts[mode]
    batch = _batch(trajs, policy, mode)
    with torch.no_grad():
        recomputed = token_logprobs(policy.model, batch.input_ids, batch.attention_mask, temperature=1.0)  # (N, T)
    mask = batch.loss_mask
    assert int(mask.sum()) > 0
    roles_in_loss = set(batch.role_mask[mask].tolist())
    assert roles_in_loss == {int(Role.ACT), int(Role.REHEARSE)}  # both roles are checked
    diff = (recomputed.float().cpu() - batch.old_logprobs)[mask].abs().max()
    assert float(diff) < 1e-3
    # and the check has teeth: the logprobs shifted by one position do not match
    shifted = torch.roll(batch.old_logprobs, 1, dims=1)
    assert float((recomputed.float().cpu() - shifted)[mask].abs().max()) > 1e-2


@pytest.mark.parametrize("mode", ["inline", "separate"])
def test_trajectories_and_their_turn_records_survive_json(policy, rollouts, mode):
    import json

    trajs, _ = rollouts[mode]
    again = [Trajectory.from_dict(json.loads(json.dumps(t.to_dict()))) for t in trajs]
    assert [t.turn_info for t in again] == [t.turn_info for t in trajs]
    assert all(isinstance(e, TurnInfo) and e.steps >= 1 for t in again for e in t.turn_info[:1])
    a, b = _batch(trajs, policy, mode), _batch(again, policy, mode)
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.old_logprobs, b.old_logprobs)
    assert torch.equal(a.loss_mask, b.loss_mask) and a.row_kinds == b.row_kinds


@pytest.mark.parametrize("mode", ["inline", "separate"])
def test_rows_masks_and_advantages(policy, rollouts, mode):
    trajs, stats = rollouts[mode]
    batch = _batch(trajs, policy, mode)
    n_reh = sum(len(e.rehearsals) for t in trajs for e in t.turn_info)
    assert batch.row_kinds[: B * K] == ["trajectory"] * (B * K)
    if mode == "inline":
        assert batch.num_rows == B * K and n_reh == 0
        assert any(s.role == Role.REHEARSE for t in trajs for s in t.segments)
    else:
        # env 1 made two calls, envs 0 and 3 one each (the model's own later actions may add more)
        assert n_reh >= 4 and batch.num_rows == B * K + n_reh
        assert batch.row_kinds[B * K :] == ["rehearsal"] * n_reh
        assert not any(s.role == Role.REHEARSE for t in trajs for s in t.segments)
    # group ids: group-major layout, rehearsal rows inherit their trajectory's group
    assert stats.group_ids == [0, 0, 1, 1] and stats.task_ids == ["scripted_0"] * 2 + ["scripted_1"] * 2
    assert batch.group_ids.tolist() == [i // K for i in batch.traj_ids.tolist()]
    assert batch.task_ids == [trajs[i].task.id for i in batch.traj_ids.tolist()]
    # token in, token out: the rows are the recorded ids
    for r in range(batch.num_rows):
        length = int(batch.attention_mask[r].sum())
        assert batch.attention_mask[r, :length].all() and not batch.attention_mask[r, length:].any()
        ids = batch.input_ids[r, :length].tolist()
        if batch.row_kinds[r] == "trajectory":
            assert ids == trajs[r].token_ids and batch.role_mask[r, :length].tolist() == trajs[r].role_mask
    # role masks partition every row: every real token has exactly one Role, padding has PAD_ROLE
    real = batch.attention_mask.bool()
    assert set(batch.role_mask[real].tolist()) <= {int(r) for r in Role}
    assert (batch.role_mask[~real] == PAD_ROLE).all()
    # loss only on generated tokens with logprobs; forced plain-text first actions carry none
    trainable = (batch.role_mask == int(Role.ACT)) | (batch.role_mask == int(Role.REHEARSE))
    assert not (batch.loss_mask & ~trainable).any()
    forced_act = [t.segments[2] for i, t in enumerate(trajs) if FIRST[i] is not None]
    assert all(s.role == Role.ACT and s.logprobs is None for s in forced_act)
    assert not (batch.loss_mask & ~real).any()
    _check_advantage_layout(batch)


def _check_advantage_layout(batch: RolloutBatch):
    assert (batch.advantages[~batch.loss_mask] == 0).all()
    assert (batch.old_logprobs[~batch.loss_mask] == 0).all()
    assert batch.loss_mask.equal(batch.segment_ids >= 0)
    for s in range(batch.seg_advantages.shape[0]):
        tokens = batch.segment_ids == s
        assert int(tokens.sum()) == int(batch.seg_num_tokens[s])
        assert (batch.advantages[tokens] == batch.seg_advantages[s]).all()
        assert set(batch.role_mask[tokens].tolist()) == {int(batch.seg_roles[s])}
        assert int(tokens.nonzero()[:, 0].unique()) == int(batch.seg_rows[s])


def test_real_rollout_then_rehearsal_again_reproduces_the_seeded_rollout(policy, venvs, rollouts):
    # One vector step is enough: the forced first actions are tool calls (capped envs end truncated).
    first_step = dict(max_new_tokens=NEW, temperature=1.0, seed=3, max_steps=1)
    trajs, stats = collect_rollouts(
        FirstStepScript(policy, FIRST), venvs["inline"], TASKS, K, rollout="real", **first_step
    )
    assert stats.rollout == "real"
    for t in trajs:
        assert Role.REHEARSE not in {s.role for s in t.segments}
        assert all(not e.rehearsals for e in t.turn_info)
    obs = [s.text for s in trajs[0].segments if s.role == Role.OBSERVATION]
    assert obs == ['{"total": 3}']  # the real scripted backend answered the forced add(3)
    assert [s.text for s in trajs[1].segments if s.role == Role.OBSERVATION] == ['{"text": "a"}', '{"total": 1}']
    answered = [sum(m.role == "tool" and m.tool_call_id is not None for m in t.messages) for t in trajs]
    assert stats.real_tool_calls == sum(answered) >= 3  # every answered call went to a real backend
    assert stats.verifier_replay_calls == sum(a for t, a in zip(trajs, answered) if t.terminated)
    batch = _batch(trajs, policy, "inline")
    assert set(batch.role_mask[batch.loss_mask].tolist()) == {int(Role.ACT)}  # env 2's generated answer
    # the default rollout goes back to rehearsal, and the same seed replays the fixture's first step exactly
    trajs, stats = collect_rollouts(FirstStepScript(policy, FIRST), venvs["inline"], TASKS, K, **first_step)
    before, before_stats = rollouts["inline"]
    assert stats.real_tool_calls == before_stats.real_tool_calls == 0  # the REHEARSE role answered every call
    answered = [sum(m.role == "tool" and m.tool_call_id is not None for m in t.messages) for t in before]
    assert before_stats.verifier_replay_calls == sum(a for t, a in zip(before, answered) if t.terminated) > 0
    for now, full in zip(trajs, before):
        assert now.token_ids == full.token_ids[: len(now.token_ids)]
    assert sum(s.role == Role.REHEARSE for s in trajs[1].segments) == 2
    assert stats.num_act_calls == stats.num_steps == 1
    # every trajectory ended and kept its task
    assert all(t.terminated or t.truncated for t in before)
    assert [t.task.id for t in before] == stats.task_ids


def test_null_rollout_answers_every_call_with_the_same_text_and_touches_no_backend(policy, venvs):
    from envace_gym.responders import NULL_TOOL_OUTPUT, ConstantResponse

    trajs, stats = collect_rollouts(
        FirstStepScript(policy, FIRST),
        venvs["inline"],
        TASKS,
        K,
        rollout="null",
        max_new_tokens=NEW,
        temperature=1.0,
        seed=3,
    )
    assert stats.rollout == "null"
    envs = [e.unwrapped for e in venvs["inline"].unwrapped.envs]
    assert all(isinstance(e.responder, ConstantResponse) and e.responder.backend is None for e in envs)
    answers = [m.content for t in trajs for m in t.messages if m.role == "tool" and m.tool_call_id is not None]
    assert answers and set(answers) == {NULL_TOOL_OUTPUT}  # the forced calls got the constant, nothing else
    assert all(Role.REHEARSE not in {s.role for s in t.segments} for t in trajs)
    answered = [sum(m.role == "tool" and m.tool_call_id is not None for m in t.messages) for t in trajs]
    assert stats.verifier_replay_calls == sum(a for t, a in zip(trajs, answered) if t.terminated) > 0


def test_empty_action_penalty_and_step_cap(policy, venvs):
    trajs, stats = collect_rollouts(
        EmptyFirst(policy),
        venvs["inline"],
        TASKS,
        K,
        max_new_tokens=2,
        temperature=1.0,
        seed=1,
        invalid_action_penalty=0.1,
        max_steps=1,
    )
    # env 0 (single-turn scripted_0) ends on its empty answer: verifier 0, penalised to -0.1
    assert stats.empty_actions[0] == 1 and trajs[0].terminated
    assert stats.verifier_rewards[0] == 0.0 and trajs[0].reward == pytest.approx(-0.1)
    assert stats.rewards[0] == trajs[0].reward
    for i in range(1, B * K):
        if stats.empty_actions[i] == 0:
            assert trajs[i].reward == stats.verifier_rewards[i]
    act = [s for s in trajs[0].segments if s.role == Role.ACT]
    assert act[0].token_ids == [policy.stop_ids[0]] and act[0].logprobs == [-0.5]
    # the cap: one vector step, envs still running are truncated with reward 0
    assert stats.num_steps == 1 and all(t.terminated or t.truncated for t in trajs)
    assert stats.num_capped == sum(not t.terminated for t in trajs)


@pytest.mark.parametrize("mode", ["inline", "separate"])
def test_budget_hits_are_counted_per_trajectory(policy, rollouts, mode):
    """``budget_hit`` = truncated, or a generated ACT message / rehearsal that ended without its stop token
    (recomputed here from the recorded segments and rehearsal rows)."""
    trajs, stats = rollouts[mode]
    stops = set(policy.stop_ids)
    for t, cut, hit in zip(trajs, stats.cut_generations, stats.budget_hit):
        generated = [s.token_ids for s in t.segments if s.role in (Role.ACT, Role.REHEARSE) and s.logprobs is not None]
        generated += [r.token_ids for e in t.turn_info for r in e.rehearsals]
        expected_cut = sum(ids[-1] not in stops for ids in generated)
        assert cut == expected_cut
        assert hit == (t.truncated or expected_cut > 0)
    assert any(stats.cut_generations)  # NEW = 6 tokens cut most of the random model's messages


def test_a_turn_that_uses_up_its_steps_is_truncated_with_zero_reward(policy, venvs):
    """max_steps_per_turn=1: the scripted first action calls a tool, so its turn can never close."""
    venv = venvs["inline"]
    try:
        trajs, stats = collect_rollouts(
            FirstStepScript(policy, FIRST),
            venv,
            TASKS,
            K,
            max_new_tokens=NEW,
            temperature=1.0,
            seed=5,
            max_steps_per_turn=1,
        )
    finally:
        for env in venv.unwrapped.envs:
            env.max_steps_per_turn = 20  # the module-scoped envs' default
    for i, first in enumerate(FIRST):
        if first is not None:
            assert trajs[i].truncated and not trajs[i].terminated and stats.verifier_rewards[i] == 0.0
            assert stats.budget_hit[i]


def test_argument_errors(policy, venvs, rollouts):
    with pytest.raises(ValueError, match="num_envs=4"):
        collect_rollouts(policy, venvs["inline"], ["scripted_0"], 3)
    with pytest.raises(ValueError, match="group_size"):
        collect_rollouts(policy, venvs["inline"], TASKS, 0)
    with pytest.raises(ValueError, match="rollout"):
        collect_rollouts(policy, venvs["inline"], TASKS, K, rollout="fake")
    trajs, _ = rollouts["inline"]
    with pytest.raises(ValueError, match="group ids"):
        build_batch(trajs, [0], pad_id=0)
    with pytest.raises(ValueError, match="prompt_mode"):
        build_batch(trajs, group_ids_for(B, K), pad_id=0, prompt_mode="bogus")
    with pytest.raises(ValueError, match="algo"):
        build_batch(trajs, group_ids_for(B, K), pad_id=0, algo="ppo")
    with pytest.raises(ValueError, match="inline REHEARSE"):
        build_batch(trajs, group_ids_for(B, K), pad_id=0, prompt_mode="separate")
    sep, _ = rollouts["separate"]
    with pytest.raises(ValueError, match="rehearsal rows"):
        build_batch(sep, group_ids_for(B, K), pad_id=0, prompt_mode="inline")


def test_a_generated_segment_that_opens_its_row_is_refused():
    """Position 0 has no logit predicting it, so its token would train on a made-up logprob."""
    first = Trajectory(task=_TASK, segments=[Segment(Role.ACT, [5, 6], [-0.5, -0.5])], reward=1.0)
    second = Trajectory(
        task=_TASK, segments=[Segment(Role.PROMPT, [1]), Segment(Role.ACT, [5, 6], [-0.5, -0.5])], reward=0.0
    )
    with pytest.raises(ValueError, match="ACT segment of 2 tokens with 2 logprobs at position 0"):
        build_batch([first, second], [0, 0], pad_id=0)
    assert build_batch([second, second], [0, 0], pad_id=0).loss_mask.sum() == 4


# ---------------------------------------------------------------------------------------------------------
# build_batch on synthetic trajectories (no model): hypothesis invariants
# ---------------------------------------------------------------------------------------------------------

_TASK = Task(id="t", suite="scripted", turns=[[Message("user", "x")]], tools=[], verifier="none")


@st.composite
def synthetic(draw):
    """Trajectories made of random segments (roles, lengths, logprobs or None) and rehearsal rows."""
    separate = draw(st.booleans())
    roles = [Role.PROMPT, Role.ACT, Role.OBSERVATION, Role.TEMPLATE] + ([] if separate else [Role.REHEARSE])
    num_groups = draw(st.integers(1, 3))
    k = draw(st.integers(1, 3))
    trajs = []
    for _ in range(num_groups * k):
        segs = [Segment(Role.PROMPT, draw(st.lists(st.integers(0, 99), min_size=1, max_size=4)))]
        for _ in range(draw(st.integers(0, 5))):
            role = draw(st.sampled_from(roles))
            ids = draw(st.lists(st.integers(0, 99), min_size=1, max_size=4))
            lps = None
            if role.trainable and draw(st.booleans()):
                lps = [-float(draw(st.integers(1, 50))) / 10 for _ in ids]
            segs.append(Segment(role, ids, lps))
        rows = []
        if separate:
            for _ in range(draw(st.integers(0, 2))):
                ids = draw(st.lists(st.integers(0, 99), min_size=1, max_size=3))
                rows.append(
                    RehearsalRecord(
                        call={},
                        text="",
                        prompt_ids=draw(st.lists(st.integers(0, 99), min_size=1, max_size=3)),
                        token_ids=ids,
                        logprobs=[-0.25] * len(ids),
                    )
                )
        reward = float(draw(st.sampled_from([0.0, 1.0, -0.1, 0.9])))
        trajs.append(
            Trajectory(task=_TASK, segments=segs, reward=reward, turn_info=[TurnInfo(turn=0, rehearsals=rows)])
        )
    return trajs, group_ids_for(num_groups, k), "separate" if separate else "inline"


@settings(max_examples=60, deadline=None)
@given(
    data=synthetic(),
    algo=st.sampled_from(["role_grpo", "grpo"]),
    weighting=st.sampled_from(["turn", "token", "trajectory"]),
)
def test_build_batch_invariants(data, algo, weighting):
    trajs, gids, mode = data
    batch = build_batch(trajs, gids, prompt_mode=mode, algo=algo, weighting=weighting, pad_id=7)
    n_reh = sum(len(e.rehearsals) for t in trajs for e in t.turn_info)
    assert batch.num_rows == len(trajs) + n_reh
    assert batch.input_ids.dtype == batch.attention_mask.dtype == batch.role_mask.dtype == torch.int64
    assert batch.loss_mask.dtype == torch.bool and batch.old_logprobs.dtype == batch.advantages.dtype == torch.float32
    assert batch.input_ids[~batch.attention_mask.bool()].eq(7).all()
    # expected segments, listed independently of build_batch: row order, then segment order
    expected = []  # (row, role, logprobs, traj)
    for i, t in enumerate(trajs):
        expected += [(i, s.role, s.logprobs, i) for s in t.segments if s.role.trainable and s.logprobs is not None]
    row = len(trajs)
    for i, t in enumerate(trajs):
        for r in t.turn_info[0].rehearsals:
            expected.append((row, Role.REHEARSE, r.logprobs, i))
            row += 1
    assert batch.seg_rows.tolist() == [e[0] for e in expected]
    assert batch.seg_roles.tolist() == [int(e[1]) for e in expected]
    assert batch.seg_traj_ids.tolist() == [e[3] for e in expected]
    for s, (_r, _, lps, _) in enumerate(expected):
        assert batch.old_logprobs[batch.segment_ids == s].tolist() == pytest.approx(lps)
    if expected:
        rewards = torch.tensor([trajs[e[3]].reward for e in expected])
        groups = torch.tensor([gids[e[3]] for e in expected])
        traj_ids = torch.tensor([e[3] for e in expected])
        if algo == "grpo":
            want = grpo_advantages(rewards, groups, traj_ids)
        else:
            want = role_wise_advantages(
                rewards, groups, torch.tensor([int(e[1]) for e in expected]), traj_ids, batch.seg_num_tokens, weighting
            )
        assert torch.equal(batch.seg_advantages, want)
    _check_advantage_layout(batch)
    real = batch.attention_mask.bool()
    assert (batch.role_mask[real] >= 0).all() and (batch.role_mask[~real] == PAD_ROLE).all()
    # a minibatch of rows keeps its segments consistent
    if batch.num_rows > 1:
        sub = batch.select([batch.num_rows - 1, 0])
        assert sub.num_rows == 2 and sub.row_kinds == [batch.row_kinds[-1], batch.row_kinds[0]]
        _check_advantage_layout(sub)


def test_a_registered_advantage_estimator_is_used_by_name_and_by_object(policy, rollouts, monkeypatch):
    from agents.grpo import ADVANTAGE_ESTIMATORS, role_wise_advantages

    def doubled(*args, **kwargs):
        return 2 * role_wise_advantages(*args, **kwargs)

    import dataclasses

    trajs, _ = rollouts["inline"]  # copies with rewards that differ within each group (the fixture is shared)
    trajs = [dataclasses.replace(t, reward=r) for t, r in zip(trajs, [0.0, 1.0, 0.5, 0.25])]
    reference = _batch(trajs, policy, "inline")
    assert reference.seg_advantages.abs().sum() > 0
    monkeypatch.setitem(ADVANTAGE_ESTIMATORS, "doubled", doubled)
    for algo in ("doubled", doubled):
        batch = _batch(trajs, policy, "inline", algo=algo)
        assert torch.equal(batch.seg_advantages, 2 * reference.seg_advantages)
        assert torch.equal(batch.advantages, 2 * reference.advantages)
    from agents.config import TrainConfig

    assert TrainConfig(model="tiny-random", suite="scripted", algo="doubled").algo == "doubled"


class CallAtAttemptStart:
    """The tiny model's policy, except that a rehearsal attempt's first ACT step (whose context is exactly an
    env's reset context: the committed step sees the memory after it) plays the plain-text call ADD3, so every
    attempt rehearses a tool output."""

    def __init__(self, policy, starts):
        self.policy, self.starts = policy, starts

    def __getattr__(self, name):
        return getattr(self.policy, name)

    def act(self, contexts, *, max_new_tokens, temperature, seeds):
        out = self.policy.act(contexts, max_new_tokens=max_new_tokens, temperature=temperature, seeds=seeds)
        return [ADD3 if tuple(c) in self.starts else o for c, o in zip(contexts, out)]


@pytest.mark.parametrize("mode", ["inline", "separate"])
def test_rehearsal_aware_rollouts_train_each_attempt_with_the_committed_reward(policy, venvs, mode):
    from wrappers.test_time_rehearsal import MEMORY_HEADER

    venv = venvs[mode]
    venv.reset(seed=0, options={"task_ids": [t for t in TASKS for _ in range(K)]})
    starts = {tuple(e.unwrapped.trajectory.token_ids) for e in venv.unwrapped.envs}
    act_cap = NEW + 3  # the envs' own cap, NEW, is the rehearsals'
    trajs, stats = collect_rollouts(
        CallAtAttemptStart(policy, starts),
        venv,
        TASKS,
        K,
        max_new_tokens=act_cap,
        temperature=1.0,
        seed=5,
        rehearsal_n=2,
    )
    for t in trajs:
        # every user turn reached (scripted_1 has two) was rehearsed twice before its committed steps
        assert [len(e.attempts) for e in t.turn_info] == [2] * len(t.turn_info)
        memory = [s.text for s in t.segments if s.role == Role.PROMPT and s.text.startswith(MEMORY_HEADER[:20])]
        assert len(memory) == len(t.turn_info) and memory[0].startswith(MEMORY_HEADER.format(n=2))
        assert memory[0].count('{"name": "add", "arguments": {"value": 3}} -> ') == 2  # the attempts' calls
        for a in t.turn_info[0].attempts:
            ids = [i for s in a.segments for i in s.token_ids]
            assert tuple(ids[: len(next(iter(starts)))]) in starts  # forked from the reset context
            context = next(k for k, s in enumerate(a.segments) if s.role == Role.ACT)
            assert all(s.logprobs is None for s in a.segments[:context])  # context never trained twice
            rehearsed = [s for s in a.segments if s.role == Role.REHEARSE] + a.rehearsals
            assert rehearsed and all(r.logprobs is not None for r in rehearsed)  # the attempt's call was rehearsed
        # in every turn, an attempt trains only what it generated after its fork point: its first trainable token
        # lies past its common prefix with the committed trajectory (whose earlier ACT turns have logprobs)
        for a in (a for e in t.turn_info for a in e.attempts):
            ids = [i for s in a.segments for i in s.token_ids]
            shared = next((k for k, (x, y) in enumerate(zip(ids, t.token_ids)) if x != y), len(ids))
            first_trained = sum(
                len(s.token_ids) for s in a.segments[: next(k for k, s in enumerate(a.segments) if s.logprobs)]
            )
            assert first_trained >= shared
    attempts = [[a for e in t.turn_info for a in e.attempts] for t in trajs]
    acts = [
        len(s.token_ids) for tried in attempts for a in tried for s in a.segments if s.role == Role.ACT and s.logprobs
    ]
    rehearsed = [len(s.token_ids) for tried in attempts for a in tried for s in a.segments if s.role == Role.REHEARSE]
    rehearsed += [len(r.token_ids) for tried in attempts for a in tried for r in a.rehearsals]
    assert max(acts) == act_cap and max(rehearsed) <= NEW  # each role kept its own cap
    assert stats.attempt_tokens == [sum(a.generated_tokens for a in tried) for tried in attempts]
    assert all(g > a > 0 for g, a in zip(stats.generated_tokens, stats.attempt_tokens))

    batch = _batch(trajs, policy, mode)
    attempt_rows = [r for r, k in enumerate(batch.row_kinds) if k == "attempt"]
    assert len(attempt_rows) == sum(len(tried) for tried in attempts)
    with torch.no_grad():
        recomputed = token_logprobs(policy.model, batch.input_ids, batch.attention_mask, temperature=1.0)  # (N, T)
    mask = batch.loss_mask[attempt_rows] if mode == "inline" else batch.loss_mask
    got = recomputed.float().cpu()[attempt_rows] if mode == "inline" else recomputed.float().cpu()
    want = batch.old_logprobs[attempt_rows] if mode == "inline" else batch.old_logprobs
    assert int(mask.sum()) > 0 and float((got - want)[mask].abs().max()) < 1e-3
    # an attempt's segments carry its committed trajectory's reward, group and role-wise advantage
    seg_rows = batch.seg_rows.tolist()
    for s, row in enumerate(seg_rows):
        traj = int(batch.traj_ids[row])
        assert float(batch.seg_rewards[s]) == pytest.approx(trajs[traj].reward)
        role = batch.seg_roles[s]
        same = [u for u, r in enumerate(seg_rows) if int(batch.traj_ids[r]) == traj and batch.seg_roles[u] == role]
        assert torch.allclose(batch.seg_advantages[same], batch.seg_advantages[s])


def test_rehearsal_aware_rollouts_read_the_memory_layout_they_are_given(policy, venvs):
    """``rehearsal_memory="outcomes"`` drops the trace's reply lines from the same attempts, and
    ``rehearsal_restate_request`` repeats the turn's request after the memory (the layouts a policy trained by
    `benchmarks.experiments.lab_ttr` reads)."""
    from wrappers.test_time_rehearsal import MEMORY_HEADER

    venv = venvs["inline"]

    def memories(**layout):
        venv.reset(seed=0, options={"task_ids": [t for t in TASKS for _ in range(K)]})
        starts = {tuple(e.unwrapped.trajectory.token_ids) for e in venv.unwrapped.envs}
        trajs, _ = collect_rollouts(
            CallAtAttemptStart(policy, starts), venv, TASKS, K, max_new_tokens=NEW, seed=5, rehearsal_n=2, **layout
        )
        out = []
        for t in trajs:
            at = next(k for k, s in enumerate(t.segments) if s.text.startswith(MEMORY_HEADER[:20]))
            after = "".join(s.text for s in t.segments[at + 1 :] if s.role == Role.PROMPT)
            out.append((t.segments[at].text.splitlines(), after, t.task))
        return out

    trace = memories()
    outcomes = memories(rehearsal_memory="outcomes", rehearsal_restate_request=True)
    replies = 0
    for (full, after_trace, task), (short, after_outcomes, _) in zip(trace, outcomes):
        assert short == [line for line in full if ": reply: " not in line]  # the same attempts, no reply lines
        replies += len(full) - len(short)
        request = task.turns[0][-1].content
        assert request not in after_trace.split(MEMORY_HEADER[:20])[0] and request in after_outcomes
    assert replies > 0  # some attempt closed with a reply: the two layouts differ


def test_a_finished_trajectory_is_not_stepped_again(policy, venvs):
    """A finished env gets the action None (left out of the vector env's step: no autoreset, no throwaway
    episode) until every trajectory has ended."""
    venv = venvs["inline"].unwrapped
    sent = []
    real_step = venv.step
    venv.step = lambda actions: sent.append(list(actions)) or real_step(actions)
    try:
        trajs, _ = collect_rollouts(
            FirstStepScript(policy, FIRST), venvs["inline"], TASKS, K, max_new_tokens=NEW, temperature=1.0, seed=3
        )
    finally:
        del venv.step
    assert len(sent) > 1 and any(a is None for actions in sent for a in actions)  # they ended at different steps
    for i, traj in enumerate(trajs):
        column = [actions[i] for actions in sent]
        played = [a for a in column if a is not None]
        assert column == played + [None] * (len(column) - len(played))  # None from its end on, never again a step
        assert venv.envs[i].trajectory is traj  # and it was not reset
