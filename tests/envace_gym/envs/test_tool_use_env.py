"""ToolUseEnv: the env contract, check_env, and hypothesis properties on trajectory invariants."""

from __future__ import annotations

import json
import math

import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import envace_gym  # noqa: F401  (registers the ids)
import tests.testing_env  # noqa: F401  (registers the "scripted" suite)
from envace_gym.envs.text import TextToolUseEnv
from envace_gym.envs.tool_use import ToolUseEnv
from envace_gym.parsing import format_tool_calls
from envace_gym.types import ToolCall

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=8,
)


def _call_strategy(names):
    args = st.dictionaries(st.sampled_from(["value", "text", "folder", "file_name", "x"]), json_values, max_size=3)
    return st.builds(ToolCall, name=st.sampled_from(names), arguments=args)


def action_strategy(names):
    """Arbitrary ACT messages: free text, well-formed calls in both styles, malformed markup, empty."""
    calls = st.lists(_call_strategy(names), min_size=1, max_size=3)
    return st.one_of(
        st.text(max_size=200),
        st.just(""),
        calls.map(lambda cs: format_tool_calls(cs, "hermes")),
        calls.map(lambda cs: format_tool_calls(cs, "python")),
        st.text(max_size=50).map(lambda t: "<tool_call>" + t),
        st.text(max_size=50).map(lambda t: "[" + t + "]"),
    )


def _run_episode(env, task_id, actions):
    obs, info = env.reset(seed=0, options={"task_id": task_id})
    steps = []
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        steps.append((obs, reward, terminated, truncated, info))
        if terminated or truncated:
            break
    return steps


def _check_invariants(env, steps):
    for i, (obs, reward, terminated, truncated, _info) in enumerate(steps):
        assert isinstance(obs, str) and env.observation_space.contains(obs)
        assert math.isfinite(reward) and 0.0 <= reward <= 1.0
        assert not (terminated and truncated)
        final = terminated or truncated
        if reward != 0.0:
            assert final, "a nonzero reward must come on the final step"
        if not final:
            assert i < len(steps)


def _check_replay(env):
    """Replaying the episode's ACT calls on a fresh backend reproduces every tool observation exactly."""
    traj = env.trajectory
    backend = env.suite.make_backend(traj.task)
    messages = traj.messages
    for j, m in enumerate(messages):
        if m.role == "assistant" and m.tool_calls:
            results = [backend.execute(c) for c in m.tool_calls]
            observed = [x.content for x in messages[j + 1 : j + 1 + len(results)]]
            assert observed == results


SUITES = {
    "scripted": (["scripted_0", "scripted_1", "scripted_2"], ["add", "echo", "nope"]),
}


@pytest.mark.parametrize("suite", ["scripted"])
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_arbitrary_actions_never_raise_and_keep_invariants(suite, data):
    task_ids, names = SUITES[suite]
    env = ToolUseEnv(suite=suite, max_steps_per_turn=4)
    task_id = data.draw(st.sampled_from(task_ids))
    actions = data.draw(st.lists(action_strategy(names), min_size=1, max_size=15))
    steps = _run_episode(env, task_id, actions)
    _check_invariants(env, steps)
    _check_replay(env)


def test_scripted_episode_reaches_reward_and_counts_parse_errors():
    env = ToolUseEnv(suite="scripted")
    obs, info = env.reset(seed=1, options={"task_id": "scripted_1"})
    assert obs == "Add 3 to the total."
    obs, r, term, trunc, info = env.step('<tool_call>{"name": "add", "arguments": {"value": 3}}</tool_call>')
    assert json.loads(obs.split("\n")[1]) == {"total": 3} and not term
    obs, r, term, trunc, info = env.step("<tool_call>{oops")
    assert info["parse_error"] and info["num_parse_errors"] == 1 and obs.startswith("<tool_response>\nError:")
    obs, r, term, trunc, info = env.step("Done.")
    assert obs == "Now add 4." and info["turn"] == 1 and r == 0.0
    env.step("[add(value=4)]")
    obs, r, term, trunc, info = env.step("Total is 7.")
    assert term and not trunc and r == 1.0 and info["verifier"]["valid"]
    with pytest.raises(RuntimeError):
        env.step("again")


def test_wrong_calls_score_zero():
    env = ToolUseEnv(suite="scripted")
    env.reset(seed=1, options={"task_id": "scripted_0"})
    env.step("[add(value=3)]")
    _, r, term, _, _ = env.step("done")
    assert term and r == 0.0


def test_step_limit_truncates_with_zero_reward():
    env = ToolUseEnv(suite="scripted", max_steps_per_turn=3)
    env.reset(seed=0, options={"task_id": "scripted_0"})
    outs = [env.step("[echo(text='x')]") for _ in range(3)]
    assert [o[3] for o in outs] == [False, False, True]
    assert all(o[1] == 0.0 and not o[2] for o in outs)


def test_token_budget_truncates():
    env = ToolUseEnv(suite="scripted", max_episode_tokens=20)
    env.reset(seed=0, options={"task_id": "scripted_0"})
    _, _, term, trunc, info = env.step("[echo(text='" + "y" * 200 + "')]")
    assert trunc and not term and info["episode_tokens"] > 20


def test_reset_draws_tasks_from_np_random_and_rejects_unknown_ids():
    env = ToolUseEnv(suite="scripted")
    seen = {env.reset(seed=s)[1]["task_id"] for s in range(20)}
    assert len(seen) > 1
    assert env.reset(seed=3)[1]["task_id"] == env.reset(seed=3)[1]["task_id"]
    with pytest.raises(KeyError, match="nope"):
        env.reset(options={"task_id": "nope"})


def test_bad_config_fails_fast():
    with pytest.raises(ValueError, match="max_steps_per_turn"):
        ToolUseEnv(suite="scripted", max_steps_per_turn=0)
    with pytest.raises(ValueError, match="unknown suite"):
        ToolUseEnv(suite="no-such-suite")


@pytest.mark.parametrize("cls", [ToolUseEnv, TextToolUseEnv])
def test_check_env_scripted(cls):
    check_env(cls(suite="scripted"), skip_render_check=True)


BFCL_TASKS = ["multi_turn_base_0", "multi_turn_base_167", "multi_turn_long_context_5"]


@pytest.fixture(scope="module")
def bfcl_env():
    return ToolUseEnv(
        suite="bfcl", categories=["multi_turn_base", "multi_turn_long_context"], split="all", max_steps_per_turn=5
    )


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_bfcl_arbitrary_actions_keep_invariants_and_replay(bfcl_env, data):
    """Same properties on real BFCL backends, with calls drawn over each task's own tool names."""
    task_id = data.draw(st.sampled_from(BFCL_TASKS))
    names = [t.name for t in bfcl_env.task_by_id(task_id).tools] + ["not_a_tool", "_load_scenario"]
    actions = data.draw(st.lists(action_strategy(names), min_size=1, max_size=8))
    steps = _run_episode(bfcl_env, task_id, actions)
    _check_invariants(bfcl_env, steps)
    _check_replay(bfcl_env)


@pytest.mark.parametrize("style", ["hermes", "python"])
def test_bfcl_ground_truth_through_the_env_scores_one_and_a_dropped_call_zero(style):
    from benchmarks.bfcl.verify import ground_truth_tool_calls

    env = ToolUseEnv(suite="bfcl", categories=["multi_turn_base"], split="all")
    task = env.task_by_id("multi_turn_base_0")
    turns = ground_truth_tool_calls(task)
    for drop in (False, True):
        env.reset(options={"task_id": task.id})
        for t, calls in enumerate(turns):
            for j, call in enumerate(calls):
                if drop and t == 0 and j == len(calls) - 1:
                    continue
                env.step(format_tool_calls([call], style))
            obs, reward, term, trunc, info = env.step("Done.")
        assert term and reward == (0.0 if drop else 1.0), info.get("verifier")


def test_miss_func_reveals_held_out_tools_at_their_turn():
    env = ToolUseEnv(suite="bfcl", categories=["multi_turn_miss_func"], split="all")
    task = next(t for t in env.tasks if t.held_out_tools)
    (turn,) = list(task.held_out_tools)
    _, info = env.reset(options={"task_id": task.id})
    hidden = {t.name for t in task.held_out_tools[turn]}
    assert not hidden & {t["function"]["name"] for t in info["tools"]}
    for _ in range(turn):
        obs, _, _, _, info = env.step("Done.")
    assert hidden <= {t["function"]["name"] for t in info["tools"]}
    revealed = json.loads(obs.split("\n", 1)[0])
    assert {f["name"] for f in revealed} == hidden
