"""`envace_gym.responders.Hybrid` in the token-level env on the real lab backend: seeded per-call draws, the
backend caught up with the rehearsed calls before a real answer, and the real outputs kept as world-model
targets."""

from __future__ import annotations

import json

import pytest

import envace_gym  # noqa: F401
from envace_gym.envs.tool_use import ToolUseEnv
from envace_gym.parsing import format_tool_calls
from envace_gym.rehearsal import make_rehearser
from envace_gym.responders import Hybrid, Rehearsal
from envace_gym.suites import make_suite
from envace_gym.types import Role, ToolCall


@pytest.fixture(scope="module")
def rehearser():
    return make_rehearser("policy", model="tiny-random")


@pytest.fixture(scope="module")
def suite():
    return make_suite("lab")


def _draws(responder: Hybrid, n: int) -> list[bool]:
    """Whether each of the next `n` calls is drawn real; each is then spent by a rehearsal (no backend needed)."""
    out = []
    for i in range(n):
        out.append(not responder.rehearses_next())
        assert responder.rehearses_next() is not out[-1]  # asking again does not draw again
        responder.rehearsed(ToolCall("locate", {"item": f"x{i}"}))
    return out


def test_draws_are_seeded_per_call_and_real_about_p_of_the_time(rehearser):
    n = 4000
    for p in (0.05, 0.2, 0.5):
        a, b = _draws(Hybrid(rehearser, p, seed=3), n), _draws(Hybrid(rehearser, p, seed=3), n)
        assert a == b  # the same seed draws the same calls real
        assert a != _draws(Hybrid(rehearser, p, seed=4), n)
        sd = (p * (1 - p) / n) ** 0.5
        assert abs(sum(a) / n - p) < 4 * sd, (p, sum(a) / n)
    assert not any(_draws(Hybrid(rehearser, 0.0, seed=3), n))
    assert all(_draws(Hybrid(rehearser, 1.0, seed=3), n))
    # a fork draws what the original would next
    h = Hybrid(rehearser, 0.5, seed=9)
    _draws(h, 7)
    assert _draws(h.fork(), 50) == _draws(h, 50)


def test_bad_probability_and_rehearser_are_refused(rehearser):
    for p in (-0.1, 1.5):
        with pytest.raises(ValueError, match="real_call_prob"):
            Hybrid(rehearser, p)
    with pytest.raises(TypeError, match="Rehearser"):
        Hybrid(object(), 0.5)


def _seed_with_draws(rehearser, pattern: list[bool], p: float = 0.5) -> int:
    """A seed whose first draws are `pattern` (True: real)."""
    return next(s for s in range(1000) if _draws(Hybrid(rehearser, p, seed=s), len(pattern)) == pattern)


def _act(env: ToolUseEnv, *calls: ToolCall):
    return env.step(format_tool_calls(list(calls), "hermes"))


def test_a_real_answer_first_catches_the_backend_up_with_the_rehearsed_calls(rehearser, suite):
    task = next(t for t in suite.tasks(["relocate"], "test"))
    backend = suite.make_backend(task)  # the task's initial state
    layout = json.loads(backend.execute(ToolCall("inventory", {})))["shelves"]
    source = next(s for s, items in layout.items() if items)
    item = layout[source][0]
    target = next(
        s for s in layout if s != source and json.loads(backend.execute(ToolCall("list_shelf", {"shelf": s})))["free"]
    )
    seed = _seed_with_draws(rehearser, [False, True, True])  # the move rehearsed, both list_shelf calls real
    env = ToolUseEnv(
        suite="lab",
        split="test",
        model="tiny-random",
        max_new_tokens=4,
        responder=Hybrid(rehearser, 0.5, seed=seed),
        max_steps_per_turn=8,
    )
    env.reset(seed=0, options={"task_id": task.id})
    hybrid = env.responder
    assert isinstance(hybrid, Hybrid) and env.needs_rehearsal()  # the pending draw: rehearse
    _, _, _, _, info = _act(env, ToolCall("move", {"item": item, "shelf": target}))
    assert len(info["rehearsals"]) == 1 and hybrid.real.backend is None  # no backend touched yet
    assert not env.needs_rehearsal()  # the next call is drawn real
    obs, _, _, _, info = _act(env, ToolCall("list_shelf", {"shelf": target}))
    shown = json.loads(env.trajectory.messages[-1].content)
    assert item in shown["items"]  # the rehearsed move was executed first
    assert hybrid.backend_calls == 2 and hybrid.real_answers == 1 and not info["rehearsals"]
    _act(env, ToolCall("list_shelf", {"shelf": source}))
    assert item not in json.loads(env.trajectory.messages[-1].content)["items"]
    assert hybrid.backend_calls == 3 and hybrid.real_answers == 2  # nothing left to catch up
    assert env.backend is None  # the verifier replays the calls, as for a rehearsed episode
    # the real outputs are kept as targets: the trajectory's own ids at their position, ending with the stop token
    ids = env.trajectory.token_ids
    assert [r.text for r in env.real_outputs] == [m.content for m in env.trajectory.messages if m.role == "tool"][1:]
    stop = env.renderer.generation_end_ids("tool")
    for record in env.real_outputs:
        assert record.prompt_ids is None and record.token_ids[-len(stop) :] == stop
        assert ids[record.start : record.start + len(record.token_ids)] == record.token_ids
        assert record.token_ids[: -len(stop)] == env.renderer.content_ids(record.text)
    roles = env.trajectory.role_mask
    assert {roles[r.start] for r in env.real_outputs} == {int(Role.OBSERVATION)}
    # a new episode starts with no backend and counts from 0
    env.reset(seed=0, options={"task_id": task.id})
    assert hybrid.backend_calls == hybrid.real_answers == 0 and env.real_outputs == []


def test_a_fork_given_a_hybrid_catches_up_on_the_calls_made_before_it(rehearser, suite):
    task = next(t for t in suite.tasks(["relocate"], "test"))
    env = ToolUseEnv(suite="lab", split="test", model="tiny-random", max_steps_per_turn=8)  # the real backend
    env.reset(options={"task_id": task.id})
    layout = json.loads(env.responder.respond(ToolCall("inventory", {})))["shelves"]
    source = next(s for s, items in layout.items() if items)
    item = layout[source][0]
    _act(env, ToolCall("pack", {"item": item}))
    fork = env.fork(responder=Hybrid(rehearser, 1.0, seed=0))
    _act(fork, ToolCall("locate", {"item": item}))
    assert "box" in json.loads(fork.trajectory.messages[-1].content)  # the pack made before the fork was replayed
    assert fork.responder.backend_calls == 2


def test_fidelity_refuses_an_env_that_answers_some_calls_from_the_backend(rehearser):
    from wrappers.fidelity import RehearsalFidelity

    env = ToolUseEnv(suite="lab", model="tiny-random", responder=Hybrid(rehearser, 0.5, seed=0))
    with pytest.raises(TypeError, match="Hybrid"):
        RehearsalFidelity(env)
    RehearsalFidelity(ToolUseEnv(suite="lab", model="tiny-random", responder=Rehearsal(rehearser)))


def test_a_backend_that_does_not_start_becomes_an_error_observation(rehearser, suite):
    def dead_server(task):
        raise ConnectionError("server exited")

    task = suite.tasks(["relocate"], "test")[0]
    hybrid = Hybrid(rehearser, 1.0, seed=0, factory=dead_server)
    hybrid.start(task)
    out = hybrid.respond(ToolCall("list_shelf", {"shelf": "A"}))
    assert out.startswith("Error during execution: the backend did not start") and "server exited" in out
    # the next real call tries again, with a working backend
    hybrid.real.factory = suite.make_backend
    assert json.loads(hybrid.respond(ToolCall("list_shelf", {"shelf": "A"})))["shelf"] == "A"
