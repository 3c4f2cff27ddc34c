"""Responders (`envace_gym.responders`) and the envs' public copy API: the same actions give the same
episode whoever answers (a real backend, a recording), `fork` continues identically without touching the
original, `set_responder` applies from the next reset, and `insert_message` extends the token sequence."""

from __future__ import annotations

import gymnasium as gym
import pytest

import envace_gym  # noqa: F401
import tests.testing_env  # noqa: F401  (registers the scripted suites)
from envace_gym.envs.text import TextToolUseEnv
from envace_gym.envs.tool_use import ToolUseEnv
from envace_gym.responders import RealBackend, RecordedResponses, Rehearsal
from envace_gym.types import Role, ToolCall
from wrappers import RealTools

ADD = '<tool_call>{{"name": "add", "arguments": {{"value": {v}}}}}</tool_call>'
ACTIONS = [ADD.format(v=3), "done", ADD.format(v=4), "<tool_call>{oops</tool_call>", "done"]


def _play(env, actions, task_id="scripted_1"):
    out = [env.reset(options={"task_id": task_id})[0]]
    for a in actions:
        obs, reward, terminated, truncated, _ = env.step(a)
        out.append((obs, reward, terminated, truncated))
    return out


def _rehearse_env(**kw):
    return gym.make("EnvACE-Rehearse-v0", suite="scripted", categories=None, model="tiny-random", **kw).unwrapped


@pytest.mark.parametrize("token_level", [False, True], ids=["tool", "rehearse"])
def test_a_recording_replays_a_real_episode_exactly(token_level):
    real = (
        RealTools(_rehearse_env()).unwrapped
        if token_level
        else gym.make("EnvACE-Tool-v0", suite="scripted", categories=None).unwrapped
    )
    played = _play(real, ACTIONS)
    assert played[-1][1:] == (1.0, True, False)
    replay = (
        _rehearse_env(responder=RecordedResponses(real.trajectory))
        if token_level
        else gym.make(
            "EnvACE-Tool-v0", suite="scripted", categories=None, responder=RecordedResponses(real.trajectory)
        ).unwrapped
    )
    assert _play(replay, ACTIONS) == played
    assert [m.to_dict() for m in replay.trajectory.messages] == [m.to_dict() for m in real.trajectory.messages]
    if token_level:
        assert replay.trajectory.token_ids == real.trajectory.token_ids
    with pytest.raises(RuntimeError, match="running episode"):  # the episode is over
        replay.respond(ToolCall("add", {"value": 1}))
    recording = RecordedResponses(real.trajectory)
    recording.start(real.task)
    answers = [recording.respond(ToolCall("add", {"value": 1})) for _ in range(3)]
    assert answers[2] == "Error: no recorded response for call 3 (2 recorded)"  # past the end: text, not an exception


def test_fork_continues_identically_and_never_touches_the_original():
    env = RealTools(_rehearse_env()).unwrapped
    _play(env, ACTIONS[:2])
    before = env.backend.snapshot()
    twin = env.fork()
    assert twin.backend is not env.backend and twin.backend.snapshot() == before
    rest = ACTIONS[2:]
    twin_steps = [twin.step(a)[:4] for a in rest]
    assert env.backend.snapshot() == before and len(env.trajectory.messages) < len(twin.trajectory.messages)
    assert [env.step(a)[:4] for a in rest] == twin_steps
    assert env.trajectory.token_ids == twin.trajectory.token_ids
    assert env.backend.snapshot() == twin.backend.snapshot()


def test_a_rehearsing_fork_with_the_same_seed_rehearses_the_same_tokens():
    env = _rehearse_env(temperature=1.0)
    env.reset(seed=5, options={"task_id": "scripted_0"})
    a, b = env.fork(seed=11), env.fork(seed=11)
    a.step(ADD.format(v=2))
    b.step(ADD.format(v=2))
    rehearsed = [[s.token_ids for s in f.trajectory.segments if s.role == Role.REHEARSE] for f in (a, b)]
    assert rehearsed[0] == rehearsed[1] and rehearsed[0]
    assert not [s for s in env.trajectory.segments if s.role == Role.REHEARSE]  # the original is untouched


def test_set_responder_applies_from_the_next_reset_and_checks_what_it_gets():
    env = _rehearse_env()
    env.reset(options={"task_id": "scripted_0"})
    env.set_responder(RealBackend())
    assert isinstance(env.responder, Rehearsal) and isinstance(env.upcoming_responder, RealBackend)
    env.reset(options={"task_id": "scripted_0"})
    assert isinstance(env.responder, RealBackend) and env.backend is not None
    env.step(ADD.format(v=2))
    assert env.backend.total == 2
    text = TextToolUseEnv(suite="scripted")
    with pytest.raises(TypeError, match="keeps no token sequence"):
        text.set_responder(Rehearsal(env.rehearser))
    tool = gym.make("EnvACE-Tool-v0", suite="scripted", categories=None).unwrapped
    with pytest.raises(TypeError, match="start, respond and fork"):
        tool.set_responder(object())


def test_the_tool_env_and_the_rehearse_env_are_one_token_level_env():
    rehearse = _rehearse_env()
    tool = gym.make("EnvACE-Tool-v0", suite="scripted", categories=None).unwrapped
    assert type(tool) is ToolUseEnv and isinstance(rehearse, ToolUseEnv) and tool.rehearser is None
    assert isinstance(tool.responder, RealBackend) and isinstance(rehearse.responder, Rehearsal)
    tool.reset(options={"task_id": "scripted_0"})
    rehearse.set_responder(RealBackend())
    rehearse.reset(options={"task_id": "scripted_0"})
    for env in (tool, rehearse):
        env.step(ADD.format(v=2))
    # same responder, same token sequence, whichever class was made
    assert tool.trajectory.token_ids == rehearse.trajectory.token_ids
    assert [s.role for s in tool.trajectory.segments] == [s.role for s in rehearse.trajectory.segments]
    tool.set_responder(Rehearsal(rehearse.rehearser))  # the tool env rehearses from its next episode on
    tool.reset(options={"task_id": "scripted_0"})
    tool.step(ADD.format(v=2))
    assert any(s.role == Role.REHEARSE for s in tool.trajectory.segments) and tool.backend is None


def test_insert_message_extends_the_sequence_before_the_pending_act_step():
    env = _rehearse_env()
    env.reset(options={"task_id": "scripted_0"})
    ids_before, opener = env.trajectory.token_ids, env.renderer.open_ids("assistant")
    env.insert_message("user", "Remember: add exactly 2.")
    ids = env.trajectory.token_ids
    assert ids[: len(ids_before) - len(opener)] == ids_before[: len(ids_before) - len(opener)]
    assert ids[-len(opener) :] == opener and env.trajectory.messages[-1].content == "Remember: add exactly 2."
    assert env.step(ADD.format(v=2))[4]["num_tokens"] > len(ids)
    with pytest.raises(ValueError, match="user or system"):
        env.insert_message("assistant", "no")


def test_a_message_inserted_mid_turn_stays_in_its_turn():
    env = RealTools(_rehearse_env()).unwrapped
    env.reset(options={"task_id": "scripted_1"})
    env.step(ADD.format(v=3))
    env.insert_message("user", "A note before the next ACT step.")
    env.step("done")
    assert [len(turn) for turn in env.calls_per_turn()] == [2, 0]  # still turn 0, then turn 1 opened
    env.step(ADD.format(v=4))
    _, reward, terminated, _, _ = env.step("done")
    assert terminated and reward == 1.0


def test_a_vector_env_gives_each_env_its_own_responder():
    venv = gym.make_vec(
        "EnvACE-Rehearse-v0",
        num_envs=3,
        vectorization_mode="vector_entry_point",
        suite="scripted",
        categories=None,
        model="tiny-random",
        responder=RealBackend(),
    )
    envs = venv.unwrapped.envs
    venv.reset(seed=0, options={"task_ids": ["scripted_0"] * 3})
    assert len({id(e.responder) for e in envs}) == 3 and len({id(e.backend) for e in envs}) == 3
    venv.step([ADD.format(v=2), ADD.format(v=5), "done"])
    assert [e.backend.total for e in envs] == [2, 5, 0]
