"""``envace serve-tools``: the REHEARSE role of a tiny lab model served as a real stdio MCP server (started by each
test as a subprocess through `benchmarks.mcp.MCPBackend`). Its tool list is the lab suite's, or the one a real
server lists (``--like``); its answers to lab test tasks' reference calls are the in-process rehearsal's, text for
text (greedy), hence the same fidelity against the real backend; nothing a call names is executed."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
import torch

from agents.cli import main
from agents.policy import PolicyRehearser, load_policy
from agents.tool_serving import CONTROL_TOOLS, RESET, START_TASK
from benchmarks.lab.lab_tiny import LabTinySizes, build_lab_tiny
from benchmarks.mcp import MCPBackend
from envace_gym.envs.rehearse import RehearseEnv
from envace_gym.parsing import format_tool_calls
from envace_gym.suites import make_suite
from envace_gym.types import ToolCall
from wrappers import RehearsalFidelity
from wrappers.fidelity import fidelity_metrics, fidelity_summary

ROOT = Path(__file__).resolve().parents[3]
TEST_SERVER = [sys.executable, str(ROOT / "tests" / "fixtures" / "mcp_test_server.py")]
MAX_NEW_TOKENS = 6


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A 2-layer `lab-tiny` built from a config and saved as a model folder. Its weights are scaled up 4x: a fresh
    initialisation's logits are so flat that greedy decoding writes the same text after any history, and this
    test must see answers that depend on the history."""
    model, tokenizer = build_lab_tiny(
        LabTinySizes(hidden_size=64, num_hidden_layers=2, intermediate_size=128, mimetic_init=False), seed=1
    )
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4.0)
    folder = tmp_path_factory.mktemp("served") / "model"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _serve(model_dir, *options: str) -> MCPBackend:
    """A client session of ``envace serve-tools --model model_dir *options`` (the backend starts the process)."""
    env = {"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    if os.environ.get("ENVACE_CACHE"):
        env["ENVACE_CACHE"] = os.environ["ENVACE_CACHE"]
    command = [sys.executable, "-m", "agents.cli", "serve-tools", "--model", str(model_dir), "--threads", "1"]
    return MCPBackend(
        command + ["--max-new-tokens", str(MAX_NEW_TOKENS), *options],
        env=env,
        hidden_tools=CONTROL_TOOLS,
        start_timeout_s=120,
        call_timeout_s=60,
    )


def _calls(suite, task) -> list[ToolCall]:
    return [c for turn in suite.ground_truth(task) for c in turn]


def test_served_answers_are_the_in_process_rehearsals_and_score_the_same_fidelity(model_dir):
    suite = make_suite("lab")
    tasks = [t for t in suite.tasks(None, "test") if t.id.endswith("_test0")]  # one test task per family
    backend = _serve(model_dir, "--suite", "lab", "--split", "test")
    try:
        assert [t.to_openai() for t in backend.tools()] == [t.to_openai() for t in tasks[0].tools]
        served, in_process = [], []
        rehearser = PolicyRehearser(load_policy(str(model_dir)))
        for task in tasks:
            assert backend.control(START_TASK, {"task_id": task.id}) == f"fresh history; task: {task.id}"
            real = suite.make_backend(task)
            for call in _calls(suite, task):
                answer, truth = backend.execute(call), real.execute(call)
                served.append({"rehearsed": answer, "real": truth, **fidelity_metrics(answer, truth)})
            env = RehearsalFidelity(
                RehearseEnv(
                    rehearser=rehearser, suite="lab", tasks=[task], temperature=0.0, max_new_tokens=MAX_NEW_TOKENS
                )
            )
            env.reset(seed=0, options={"task_id": task.id})
            for call in _calls(suite, task):
                env.step(format_tool_calls([call], "hermes"))
            in_process += env.episode_calls
        assert [r["rehearsed"] for r in served] == [r["rehearsed"] for r in in_process]
        assert [r["real"] for r in served] == [r["real"] for r in in_process]
        assert fidelity_summary(served) == fidelity_summary(in_process)
        assert len(served) >= 8 and len({r["rehearsed"] for r in served}) > 1  # the answers follow the history

        # a fresh history with the same task gives the first answers again; another task's history other ones
        first = _calls(suite, tasks[-1])[0]
        assert backend.control(RESET) == f"fresh history; task: {tasks[-1].id}"
        assert backend.execute(first) == served[len(served) - len(_calls(suite, tasks[-1]))]["rehearsed"]
        assert backend.restarts == 0
    finally:
        backend.close()


def test_task_context_free_text_no_task_and_bad_control_arguments(model_dir):
    backend = _serve(model_dir, "--suite", "lab", "--split", "test")
    call = ToolCall("list_shelf", {"shelf": "B"})
    try:
        answers = {}
        for label, arguments in {
            "none": {},
            "text": {"prompt": "Move the clock to shelf B.", "system": "Shelves A B. clock A."},
            "other": {"prompt": "Ship the drill to the north dock.", "system": "Shelves A B. drill B."},
        }.items():
            assert backend.control(START_TASK, arguments).startswith("fresh history")
            answers[label] = backend.execute(call)
        assert len(set(answers.values())) == 3  # each opening conditions the answer
        assert backend.control(START_TASK, {"task_id": "relocate_0"}).startswith(
            "Error: unknown task_id 'relocate_0'; the 600 tasks"
        )  # a train task, not served with --split test
        assert "either task_id or prompt" in backend.control(START_TASK, {"task_id": "ship_test0", "prompt": "hi"})
        assert "takes task_id, prompt and system" in backend.control(START_TASK, {"tsak_id": "ship_test0"})
        assert backend.execute(ToolCall(START_TASK, {})) == f"Error: Tool '{START_TASK}' not found."  # hidden
        digest, calls = backend.snapshot(), backend.calls
        assert backend.control(RESET) == "fresh history; task: free_text"  # the client's own call: not in the rollout
        assert (backend.snapshot(), backend.calls) == (digest, calls)
    finally:
        backend.close()


def test_like_copies_a_real_servers_tools_and_executes_none_of_them(model_dir):
    real = MCPBackend(TEST_SERVER, call_timeout_s=10)
    try:
        expected = [t.to_openai() for t in real.tools()]
    finally:
        real.close()
    backend = _serve(model_dir, "--like", " ".join(TEST_SERVER))
    try:
        assert [t.to_openai() for t in backend.tools()] == expected
        t0 = time.perf_counter()
        napped = backend.execute(ToolCall("nap", {"seconds": 120}))  # the real tool would sleep 2 minutes
        died = backend.execute(ToolCall("die", {}))  # and this one would end the server
        assert time.perf_counter() - t0 < 50 and not napped.startswith("Error: the tool server")
        assert not died.startswith("Error: the tool server") and backend.restarts == 0
        assert backend.control(START_TASK, {"task_id": "sum"}).startswith("Error: unknown task_id 'sum'; no suite task")
        assert backend.control(START_TASK, {"prompt": "What is 2 + 3?"}) == "fresh history; task: free_text"
        assert isinstance(backend.execute(ToolCall("add", {"a": 2, "b": 3})), str) and backend.restarts == 0
    finally:
        backend.close()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--suite", "no-such-suite"], "unknown suite 'no-such-suite'"),
        (["--suite", "lab", "--categories", "juggle"], "unknown lab categories"),
        (["--suite", "lab", "--temperature", "-1"], "--temperature"),
        (["--suite", "lab", "--max-new-tokens", "0"], "--max-new-tokens"),
        (["--like", ""], "--like needs the command line"),
        (["--like", f"{sys.executable} -c 'import sys; sys.exit(1)'"], "--like: MCP server"),
    ],
)
def test_bad_options_fail_before_the_model_loads(no_model_loads, capsys, argv, message):
    assert main(["serve-tools", "--model", "tiny-random", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("envace serve-tools: error:") and message in err
