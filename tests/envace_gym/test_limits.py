"""Per-call backend limits: time, argument bounds and numeric state (`envace_gym.limits`), on real BFCL
backends through both envs' paths and the verifier's replay."""

from __future__ import annotations

import decimal
import functools
import os
import signal
import sys
import threading
import time

import gymnasium as gym
import pytest

import envace_gym  # noqa: F401
from benchmarks.bfcl import BFCLSuite
from envace_gym.limits import CallIsolationError, CallLimitExceeded, CallLimits, run_limited
from envace_gym.types import ToolCall

HANGS = [
    "[power(base=10, exponent=100000000)]",
    "[logarithm(value=2, base=10, precision=10000000)]",
    "[square_root(number=2, precision=100000000)]",
]


LINUX = sys.platform == "linux"
IN_PROCESS = CallLimits(isolation="none")
ISOLATED = CallLimits(isolation="process") if LINUX else IN_PROCESS
linux_only = pytest.mark.skipif(not LINUX, reason="process isolation needs os.fork and RLIMIT_AS (Linux)")
HUGE_POWER = functools.partial(pow, 10, 10**8)  # one C-level operation of about 30 s


def spin():
    while True:
        pass


@pytest.mark.parametrize("isolation", ["none", pytest.param("process", marks=linux_only)])
def test_a_python_loop_is_stopped_at_the_time_limit(isolation):
    t0 = time.perf_counter()
    with pytest.raises(CallLimitExceeded, match="time limit of 0.2 s"):
        run_limited(spin, CallLimits(seconds=0.2, isolation=isolation))
    assert time.perf_counter() - t0 < 2.0


@linux_only
def test_an_isolated_call_is_stopped_inside_one_c_level_operation_and_off_the_main_thread():
    errors = []

    def worker():
        try:
            run_limited(HUGE_POWER, CallLimits(seconds=0.5, isolation="process"))
        except CallLimitExceeded as e:
            errors.append(str(e))

    t0 = time.perf_counter()
    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(10)
    assert not thread.is_alive() and errors == ["the call ran past its time limit of 0.5 s"]
    assert time.perf_counter() - t0 < 5.0


@linux_only
def test_an_isolated_call_is_stopped_at_the_memory_limit_and_the_next_call_runs():
    with pytest.raises(CallLimitExceeded, match="memory limit of 64 MiB"):
        run_limited(functools.partial(bytearray, 2**30), CallLimits(memory_mb=64, isolation="process"))
    assert run_limited(functools.partial(len, bytearray(2**20)), CallLimits(memory_mb=64, isolation="process")) == 2**20


@linux_only
def test_an_isolated_call_whose_process_dies_is_a_limit_error():
    with pytest.raises(CallLimitExceeded, match=r"process died \(signal 6\)"):
        run_limited(os.abort, ISOLATED)
    with pytest.raises(CallLimitExceeded, match=r"process died \(exit code 3\)"):
        run_limited(functools.partial(os._exit, 3), ISOLATED)


@linux_only
def test_an_isolated_call_raises_what_the_function_raised():
    with pytest.raises(ZeroDivisionError):
        run_limited(functools.partial(divmod, 1, 0), ISOLATED)
    with pytest.raises(CallIsolationError, match="does not pickle"):  # a setup error, not the model's
        run_limited(lambda: 1, ISOLATED)


@linux_only
def test_ctrl_c_during_an_isolated_call_interrupts_it_and_the_next_call_runs():
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.3)
    t0 = time.perf_counter()
    try:
        with pytest.raises(KeyboardInterrupt):
            run_limited(HUGE_POWER, CallLimits(seconds=20, isolation="process"))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert time.perf_counter() - t0 < 5.0
    assert run_limited(functools.partial(pow, 2, 10), ISOLATED) == 1024


def test_isolation_modes_are_checked():
    with pytest.raises(ValueError, match="isolation must be one of"):
        CallLimits(isolation="thread")
    assert CallLimits(isolation="process").isolated and not CallLimits(isolation="none").isolated
    assert CallLimits().isolated == (sys.platform == "linux")


def test_numeric_state_is_restored_after_each_in_process_call():
    import mpmath

    before_prec, before_dps = decimal.getcontext().prec, mpmath.mp.dps
    task = _math_task()
    backend = BFCLSuite(call_limits=IN_PROCESS).make_backend(task)
    assert "result" in backend.execute(ToolCall("square_root", {"number": 2, "precision": 50}))
    assert (decimal.getcontext().prec, mpmath.mp.dps) == (before_prec, before_dps)


@linux_only
def test_isolated_calls_leave_the_same_backend_state_as_in_process_calls():
    task = next(
        t
        for t in BFCLSuite().tasks(["multi_turn_base"], "all")
        if {"GorillaFileSystem", "TwitterAPI"} <= set(t.metadata["involved_classes"])
    )
    calls = [
        ToolCall("mkdir", {"dir_name": "made"}),
        ToolCall("cd", {"folder": "made"}),
        ToolCall("touch", {"file_name": "a.txt"}),
        ToolCall("echo", {"content": "hi", "file_name": "a.txt"}),
        ToolCall("authenticate_twitter", {"username": "u", "password": "p"}),
        ToolCall("post_tweet", {"content": "c", "tags": ["#t"], "mentions": ["@m"]}),
        ToolCall("cd", {"folder": "nowhere"}),
        ToolCall("ls", {}),
    ]
    here, isolated = (BFCLSuite(call_limits=limits).make_backend(task) for limits in (IN_PROCESS, ISOLATED))
    for call in calls:
        assert here.execute(call) == isolated.execute(call)
        assert here.snapshot() == isolated.snapshot()
    assert isolated.snapshot() != BFCLSuite().make_backend(task).snapshot()


class Counter:
    def __init__(self):
        self.count = 0

    def bump(self, allocate=0):
        self.count += 1
        return len(bytearray(allocate))


@linux_only
def test_an_isolated_call_copies_state_back_and_one_over_a_limit_changes_none():
    counter, limits = Counter(), CallLimits(memory_mb=64, isolation="process")
    assert run_limited(functools.partial(counter.bump, 10), limits, state=[counter]) == 10 and counter.count == 1
    with pytest.raises(CallLimitExceeded, match="memory limit"):
        run_limited(functools.partial(counter.bump, 2**30), limits, state=[counter])
    assert counter.count == 1


def _math_task():
    return next(t for t in BFCLSuite().tasks(["multi_turn_base"], "all") if "MathAPI" in t.metadata["involved_classes"])


@pytest.mark.parametrize("action", HANGS)
def test_bfcl_calls_that_hung_become_error_observations(action):
    task = _math_task()
    env = gym.make("EnvACE-Tool-v0", split="all")
    env.reset(options={"task_id": task.id})
    t0 = time.perf_counter()
    obs, *_ = env.step(action)
    assert time.perf_counter() - t0 < 1.0 and ("above the limit" in obs or "result limit" in obs), obs
    assert decimal.getcontext().prec == 28


def test_the_verifier_replays_under_the_same_limits():
    suite, task = BFCLSuite(), _math_task()
    calls = [[[ToolCall("square_root", {"number": 2, "precision": 100000000})]]] + [
        [[]] for _ in range(task.num_turns - 1)
    ]
    t0 = time.perf_counter()
    result = suite.verify_calls(task, calls)
    assert result.reward == 0.0 and time.perf_counter() - t0 < 5.0
    strict = BFCLSuite(call_limits=CallLimits(max_precision=10))
    backend = strict.make_backend(task)
    assert "above the limit of 10 digits" in backend.execute(ToolCall("square_root", {"number": 2, "precision": 50}))
