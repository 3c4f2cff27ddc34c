"""Per-call backend limits: time, argument bounds and numeric state (`envace_gym.limits`), on real BFCL
backends through both envs' paths and the verifier's replay."""

from __future__ import annotations

import decimal
import time

import gymnasium as gym
import pytest

import envace_gym  # noqa: F401
from envace_gym.limits import CallLimitExceeded, CallLimits, run_limited
from envace_gym.types import ToolCall

HANGS = [
    "[power(base=10, exponent=100000000)]",
    "[logarithm(value=2, base=10, precision=10000000)]",
    "[square_root(number=2, precision=100000000)]",
]


def test_a_python_loop_is_stopped_at_the_time_limit():
    def spin():
        while True:
            pass

    t0 = time.perf_counter()
    with pytest.raises(CallLimitExceeded, match="time limit of 0.2 s"):
        run_limited(spin, CallLimits(seconds=0.2))
    assert time.perf_counter() - t0 < 2.0


def test_numeric_state_is_restored_after_each_call():
    import mpmath

    before_prec, before_dps = decimal.getcontext().prec, mpmath.mp.dps

    def change():
        decimal.getcontext().prec = 7
        mpmath.mp.dps = 3
        return 1

    assert run_limited(change) == 1
    assert (decimal.getcontext().prec, mpmath.mp.dps) == (before_prec, before_dps)


def _math_task():
    from benchmarks.bfcl import BFCLSuite

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
    from benchmarks.bfcl import BFCLSuite

    suite, task = BFCLSuite(), _math_task()
    calls = [[[ToolCall("square_root", {"number": 2, "precision": 100000000})]]] + [[[]] for _ in range(task.num_turns - 1)]
    t0 = time.perf_counter()
    result = suite.verify(task, calls)
    assert result.reward == 0.0 and time.perf_counter() - t0 < 5.0
    strict = BFCLSuite(call_limits=CallLimits(max_precision=10))
    backend = strict.make_backend(task)
    assert "above the limit of 10 digits" in backend.execute(ToolCall("square_root", {"number": 2, "precision": 50}))
