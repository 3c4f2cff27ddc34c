"""RehearseEnv and its vector env with the tiny random model: both prompt modes, token bookkeeping,
seed determinism, check_env, the batched vector env, and the RealTools swap."""

from __future__ import annotations

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import envace_gym  # noqa: F401
import tests.testing_env  # noqa: F401
from envace_gym.envs.rehearse import RehearseEnv
from envace_gym.rendering import ChatRenderer
from envace_gym.types import Message, Role
from wrappers import RealTools

TINY = dict(model="tiny-random", max_new_tokens=12, temperature=1.0)
ADD3 = '<tool_call>{"name": "add", "arguments": {"value": 3}}</tool_call>'


def make(suite="scripted", **kw):
    return gym.make("EnvACE-Rehearse-v0", suite=suite, categories=None, **{**TINY, **kw})


def _play(env, actions, task_id="scripted_1", seed=0):
    obs, info = env.reset(seed=seed, options={"task_id": task_id})
    out = [obs]
    for a in actions:
        obs, r, term, trunc, info = env.step(a)
        out.append(obs)
        if term or trunc:
            break
    return out, info


def test_inline_mode_segments_partition_and_match_a_full_render():
    env = make()
    _, info = _play(env, [ADD3, "[echo(text='a'), add(value=1)]"])
    traj = env.unwrapped.trajectory
    roles = [s.role for s in traj.segments]
    assert roles.count(Role.REHEARSE) == 3 and roles.count(Role.ACT) == 2
    assert len(traj.role_mask) == len(traj.token_ids) == info["num_tokens"]
    # every rehearsal of the last step is in the trajectory exactly as generated, with its logprobs
    rehearsed = [s for s in traj.segments if s.role == Role.REHEARSE]
    assert [r.token_ids for r in info["rehearsals"]] == [s.token_ids for s in rehearsed[-2:]]
    assert all(s.logprobs is not None and len(s.logprobs) == len(s.token_ids) for s in rehearsed)
    # generated segments carry no logprobs only when the action was plain text
    assert all(s.logprobs is None for s in traj.segments if s.role == Role.ACT)
    # token in, token out: the appended pieces decode to the same text as rendering the conversation whole
    renderer = ChatRenderer(env.unwrapped.rehearser.tokenizer)
    tok = env.unwrapped.rehearser.tokenizer
    messages = [Message(m.role, m.content) for m in traj.messages]
    whole = renderer.render(messages, traj.task.tools, add_generation_prompt=True)
    assert tok.decode(traj.token_ids) == whole


def test_separate_mode_rows_and_observation_role():
    env = make(prompt_mode="separate")
    _, info = _play(env, [ADD3])
    traj = env.unwrapped.trajectory
    assert Role.REHEARSE not in {s.role for s in traj.segments}
    (reh,) = info["rehearsals"]
    assert reh.prompt_ids and len(reh.token_ids) == len(reh.logprobs) > 0
    tool_msg = traj.messages[-1]
    assert tool_msg.role == "tool" and tool_msg.content == reh.text
    obs_segments = [s for s in traj.segments if s.role == Role.OBSERVATION]
    assert obs_segments and obs_segments[-1].text == reh.text
    assert env.unwrapped.rehearsal_rows[-1] is reh
    tok = env.unwrapped.rehearser.tokenizer
    assert "You are the tool environment" in tok.decode(reh.prompt_ids)


def test_same_seed_same_rehearsal_and_different_seed_differs():
    a, b = make(), make()
    oa, _ = _play(a, [ADD3], seed=5)
    ob, _ = _play(b, [ADD3], seed=5)
    oc, _ = _play(b, [ADD3], seed=6)
    assert oa == ob
    assert oa[1] != oc[1]


@pytest.mark.parametrize("prompt_mode", ["inline", "separate"])
def test_check_env(prompt_mode):
    check_env(RehearseEnv(suite="scripted", prompt_mode=prompt_mode, **TINY).unwrapped, skip_render_check=True)


def test_reward_comes_from_replaying_act_calls_on_a_real_backend():
    env = make()
    _, info = _play(env, [ADD3, "ok", "[add(value=4)]", "done"])
    assert info["verifier"]["reward"] == 1.0  # the rehearsed totals are gibberish; the replay is real
    _, info = _play(env, [ADD3, "ok", "[add(value=5)]", "done"])
    assert info["verifier"]["reward"] == 0.0


def test_real_tools_swaps_only_the_observations():
    actions = [ADD3, "[echo(text='hi')]", "ok"]
    rehearse_obs, _ = _play(make(), actions)
    real = RealTools(make())
    real_obs, info = _play(real, actions)
    assert real_obs[1] == '<tool_response>\n{"total": 3}\n</tool_response>'
    assert real_obs[2] == '<tool_response>\n{"text": "hi"}\n</tool_response>'
    assert rehearse_obs[1] != real_obs[1]
    assert rehearse_obs[0] == real_obs[0] and rehearse_obs[3] == real_obs[3]  # user turns unchanged
    traj = real.unwrapped.trajectory
    assert Role.REHEARSE not in {s.role for s in traj.segments}
    assert info["rehearsals"] == []


def test_real_tools_with_bfcl_backend():
    """The same BFCL action yields a rehearsed observation in one env and BFCL's real result in the other."""
    task_id = "multi_turn_base_167"
    action = "[list_all_airports()]"
    kw = dict(suite="bfcl", categories=["multi_turn_base"], split="all", **TINY)
    rehearse = gym.make("EnvACE-Rehearse-v0", **kw)
    real = RealTools(gym.make("EnvACE-Rehearse-v0", **kw))
    o1, _ = _play(rehearse, [action], task_id=task_id)
    o2, _ = _play(real, [action], task_id=task_id)
    backend = real.unwrapped.suite.make_backend(real.unwrapped.task)
    from envace_gym.types import ToolCall

    expected = backend.execute(ToolCall("list_all_airports", {}))
    assert o2[1] == f"<tool_response>\n{expected}\n</tool_response>"
    assert o1[1] != o2[1]


def test_vector_env_batches_one_rehearsal_per_round_and_matches_single_envs():
    n = 3
    venv = gym.make_vec(
        "EnvACE-Rehearse-v0",
        num_envs=n,
        vectorization_mode="vector_entry_point",
        suite="scripted",
        categories=None,
        **TINY,
    )
    task_ids = ["scripted_0", "scripted_1", "scripted_2"]
    obs, infos = venv.reset(seed=10, options={"task_ids": task_ids})
    actions = [ADD3, "[echo(text='a'), add(value=1)]", "no call"]
    obs, rewards, term, trunc, infos = venv.step(actions)
    assert venv.unwrapped.num_rehearsal_calls == 2  # two rounds: env 1 has two calls
    for i in range(n):
        single = make()
        single.reset(seed=10 + i, options={"task_id": task_ids[i]})
        o, *_ = single.step(actions[i])
        assert o == obs[i]
        assert single.unwrapped.trajectory.token_ids == venv.unwrapped.envs[i].trajectory.token_ids


def test_no_model_is_asked_to_continue_past_max_context_tokens():
    """A call whose rehearsal could pass the limit gets an error observation and no model call (the fuzz
    benchmark found a 1 MB action followed by a call asking for a 63 GB attention)."""
    from agents.policy import load_policy, make_policy_rehearser

    calls = []
    rehearser = make_policy_rehearser(policy=load_policy("tiny-random"))
    original = rehearser.rehearse
    rehearser.rehearse = lambda requests: calls.append([len(r.context_ids) for r in requests]) or original(requests)
    env = RehearseEnv(suite="scripted", rehearser=rehearser, max_new_tokens=4)
    env.reset(options={"task_id": "scripted_2"})
    env.step("y" * 1_000_000)  # a huge answer to turn 1 (no call), then a call in turn 2
    obs, reward, terminated, truncated, info = env.step("[add(value=5)]")
    assert not calls and info["rehearsals"] == [] and "no room for a rehearsal" in obs
    assert env.trajectory.segments[-3].role == Role.OBSERVATION  # the error message, closed as a tool message
    env.reset(options={"task_id": "scripted_2"})
    env.step("[echo(text='hi')]")
    assert calls and max(calls[0]) <= env.max_context_tokens  # a normal call is rehearsed


def test_a_none_action_leaves_its_env_out_of_the_step_and_its_pending_reset_waits():
    venv = gym.make_vec(
        "EnvACE-Rehearse-v0",
        num_envs=2,
        vectorization_mode="vector_entry_point",
        suite="scripted",
        categories=None,
        **TINY,
    )
    venv.reset(seed=1, options={"task_ids": ["scripted_0", "scripted_1"]})
    _, _, term, _, _ = venv.step(["no call", ADD3])  # env 0 answers without a call: its episode ends
    assert term[0] and not term[1]
    ended = venv.unwrapped.envs[0].trajectory
    calls = venv.unwrapped.num_rehearsal_calls
    obs, rewards, term, trunc, infos = venv.step([None, None])
    assert obs == ("", "") and not rewards.any() and not term.any() and not trunc.any()
    assert venv.unwrapped.num_rehearsal_calls == calls  # nothing was stepped
    assert venv.unwrapped.envs[0].trajectory is ended  # and the finished env was not reset
    obs, *_ = venv.step(["anything", None])  # its next action: the pending NEXT_STEP autoreset
    assert venv.unwrapped.envs[0].trajectory is not ended and obs[0] and obs[1] == ""
