"""Fuzz both envs with random and adversarial actions: exceptions, hangs, executed model text, peak memory.

For each BFCL category and each env (``EnvACE-Tool-v0`` on real backends; ``EnvACE-Rehearse-v0`` with the
tiny random model rehearsing, so the token bookkeeping runs too), ``--steps`` actions are played, drawn with a
seeded generator from these kinds:

* ``text``: random printable text; ``unicode``: random code points, lone surrogates included;
* ``huge``: a 1 MB string; ``empty``: ``""`` and whitespace;
* ``valid_call``: a Hermes or Python-style call of one of the task's own tools with random JSON arguments;
* ``bad_call``: malformed markup (unclosed tags, bad JSON, a close tag inside a string, arrays, deep nesting,
  ``parameters`` for ``arguments``, Python calls with names, attributes and lambdas);
* ``hazard``: the BFCL calls that used to hang a step (``power(10, 10**8)``, huge ``precision``).

Every step runs under a wall-clock limit (``--step-seconds``, via ``SIGALRM``); a step over it is counted as a
timeout and its env is reset. An audit hook (``sys.addaudithook``) counts ``exec``/``compile`` events whose
source holds the marker string every action carries: any model text executed would show up there.

``--isolation`` picks where backend calls run (`envace_gym.limits.CallLimits`): ``process`` (the Linux default,
each call in a child of the call server) or ``none`` (in this process). The audit hook sees only this
process, so ``process`` audits the env, parser and verifier code, and ``none`` audits the backends as well.

Usage::

    .venv/bin/python -m benchmarks.perf.fuzz_envs                      # 10,000 actions per category and env
    .venv/bin/python -m benchmarks.perf.fuzz_envs --steps 500 --categories multi_turn_base

Prints one row per (env, category): steps, episodes, exceptions, timeouts, executed-model-text events,
median and max step milliseconds, then the process's peak RSS.
"""

from __future__ import annotations

import argparse
import json
import resource
import signal
import sys
import time
import traceback
from typing import Any

import numpy as np

MARK = "ENVACEFUZZMARK"
KINDS = ("text", "unicode", "huge", "empty", "valid_call", "bad_call", "hazard")
HAZARDS = (
    "[power(base=10, exponent=100000000)]",
    "[logarithm(value=2, base=10, precision=10000000)]",
    "[square_root(number=2, precision=100000000)]",
    '<tool_call>{"name": "power", "arguments": {"base": 7, "exponent": 123456789}}</tool_call>',
)


class StepTimeout(Exception):
    """A step ran past ``--step-seconds``."""


def _random_json(rng: np.random.Generator, depth: int = 0) -> Any:
    kind = rng.integers(0, 7 if depth < 3 else 4)
    if kind == 0:
        return int(rng.integers(-(10**6), 10**6))
    if kind == 1:
        return float(rng.normal() * 10.0 ** int(rng.integers(-3, 6)))
    if kind == 2:
        return "".join(chr(int(c)) for c in rng.integers(32, 0x2FFF, size=rng.integers(0, 12))) + MARK
    if kind == 3:
        return bool(rng.integers(0, 2)) if rng.integers(0, 2) else None
    if kind == 4:
        return [_random_json(rng, depth + 1) for _ in range(rng.integers(0, 4))]
    return {f"k{i}": _random_json(rng, depth + 1) for i in range(rng.integers(0, 4))}


def _valid_call(rng: np.random.Generator, tools: list[Any]) -> str:
    from envace_gym.parsing import format_tool_calls
    from envace_gym.types import ToolCall

    tool = tools[int(rng.integers(len(tools)))]
    props = list((tool.parameters or {}).get("properties", {}))
    args = {p: _random_json(rng) for p in props if rng.random() < 0.8}
    style = "hermes" if rng.random() < 0.6 else "python"
    try:
        return format_tool_calls([ToolCall(tool.name, args)], style) + f" {MARK}"
    except ValueError:  # a dotted name the python style cannot write
        return format_tool_calls([ToolCall(tool.name, args)], "hermes") + f" {MARK}"


def _bad_call(rng: np.random.Generator) -> str:
    cases = [
        '<tool_call>{"name": "ls", "arguments": {"a": 1}',
        '<tool_call>{"name": "echo", "arguments": {"content": "x </tool_call> y"}}</tool_call>',
        '<tool_call>[{"name": "ls"}, {"name": "pwd", "parameters": {}}]</tool_call>',
        "<tool_call>" + "[" * 5000 + "]" * 5000 + "</tool_call>",
        '{"name": "ls"}</tool_call>',
        "[ls(a=__import__('os').system('echo " + MARK + "'))]",
        "[ls(a=lambda: 1)]",
        "[os.system('true')]",
        "[f(*args)]",
        "[f(x=1) for f in g]",
        "```python\n[cd(folder='..')]\n```",
        "<think>[ls()]",
        "</think>[ls()]",
        "[" + ", ".join("ls()" for _ in range(500)) + "]",
        '<tool_call>{"name": "", "arguments": {}}</tool_call>',
        "<tool_call>null</tool_call>",
        '<tool_call>{"name": "ls", "arguments": "{not json"}</tool_call>',
    ]
    return cases[int(rng.integers(len(cases)))] + f" {MARK}"


def draw_action(rng: np.random.Generator, tools: list[Any]) -> tuple[str, str]:
    """One action and its kind (see the module docstring)."""
    kind = KINDS[int(rng.choice(len(KINDS), p=[0.2, 0.15, 0.02, 0.08, 0.3, 0.2, 0.05]))]
    if kind == "text":
        text = "".join(chr(int(c)) for c in rng.integers(32, 127, size=rng.integers(0, 200)))
    elif kind == "unicode":
        text = "".join(chr(int(c)) for c in rng.integers(0, 0x10FFFF, size=rng.integers(1, 60)))
    elif kind == "huge":
        text = "x" * 1_000_000
    elif kind == "empty":
        text = ["", " ", "\n\t"][int(rng.integers(3))]
    elif kind == "valid_call":
        text = _valid_call(rng, tools)
    elif kind == "bad_call":
        text = _bad_call(rng)
    else:
        text = HAZARDS[int(rng.integers(len(HAZARDS)))]
    return (text if MARK in text else text + MARK), kind


def _alarm(signum: int, frame: Any) -> None:
    raise StepTimeout


def fuzz(
    env_id: str, category: str, steps: int, seed: int, step_seconds: float, executed: list[int], suite: str = "bfcl"
) -> dict[str, Any]:
    """Play `steps` fuzzed actions in one env of the registered `suite`; returns the row's counts."""
    import gymnasium as gym

    kwargs: dict[str, Any] = {"suite": suite, "categories": [category], "split": "all"}
    if env_id == "EnvACE-Rehearse-v0":
        kwargs.update(model="tiny-random", max_new_tokens=8)
    env = gym.make(env_id, disable_env_checker=True, **kwargs)
    rng = np.random.default_rng([seed, hash(category) % 2**31])
    env.reset(seed=seed)
    row = {"env": env_id, "category": category, "steps": 0, "episodes": 1, "exceptions": 0, "timeouts": 0}
    times: list[float] = []
    first_error = None
    executed_before = executed[0]
    previous = signal.signal(signal.SIGALRM, _alarm)
    try:
        for _ in range(steps):
            action, _kind = draw_action(rng, env.unwrapped.task.tools_at_turn(0))
            t0 = time.perf_counter()
            signal.setitimer(signal.ITIMER_REAL, step_seconds)
            try:
                _, _, terminated, truncated, _ = env.step(action)
            except StepTimeout:
                row["timeouts"] += 1
                terminated = True
            except Exception:  # noqa: BLE001 - counting them is the point
                row["exceptions"] += 1
                first_error = first_error or traceback.format_exc(limit=3)
                terminated = True
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            times.append(time.perf_counter() - t0)
            row["steps"] += 1
            if terminated or truncated:
                env.reset()
                row["episodes"] += 1
    finally:
        signal.signal(signal.SIGALRM, previous)
    row["executed_model_text"] = executed[0] - executed_before
    row["median_ms"] = 1000 * float(np.median(times))
    row["max_ms"] = 1000 * float(np.max(times))
    row["first_error"] = first_error
    return row


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10_000, help="actions per (env, category)")
    parser.add_argument(
        "--categories",
        nargs="+",
        default=[
            "multi_turn_base",
            "multi_turn_miss_func",
            "multi_turn_miss_param",
            "multi_turn_long_context",
            "simple_python",
        ],
    )
    parser.add_argument("--envs", nargs="+", default=["EnvACE-Tool-v0", "EnvACE-Rehearse-v0"])
    parser.add_argument("--step-seconds", type=float, default=10.0, help="wall-clock limit per step")
    parser.add_argument(
        "--isolation", choices=["process", "none"], default="process", help="where backend calls run (module docstring)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="also write the rows to this JSON file")
    args = parser.parse_args(argv)

    import envace_gym  # noqa: F401  (registers the env ids)
    from benchmarks.bfcl import BFCLSuite
    from envace_gym.limits import CallLimits
    from envace_gym.suites import register_suite

    suite = f"bfcl-isolation-{args.isolation}"
    register_suite(suite, lambda: BFCLSuite(call_limits=CallLimits(isolation=args.isolation)))
    print(f"backend calls: isolation={args.isolation}", flush=True)

    executed = [0]

    def audit(event: str, event_args: tuple) -> None:
        if event in ("exec", "compile") and event_args:
            source = event_args[0]
            if isinstance(source, (str, bytes)) and MARK in (
                source if isinstance(source, str) else source.decode("utf-8", "replace")
            ):
                executed[0] += 1

    sys.addaudithook(audit)
    header = (
        f"{'env':<20} {'category':<26} {'steps':>7} {'episodes':>8} {'exceptions':>10} {'timeouts':>8} "
        f"{'executed':>8} {'median ms':>9} {'max ms':>8}"
    )
    print(header, flush=True)
    rows = []
    for e in args.envs:
        for c in args.categories:  # each row as soon as it is done: a long run shows its progress
            r = fuzz(e, c, args.steps, args.seed, args.step_seconds, executed, suite)
            rows.append(r)
            print(
                f"{r['env']:<20} {r['category']:<26} {r['steps']:>7} {r['episodes']:>8} {r['exceptions']:>10} "
                f"{r['timeouts']:>8} {r['executed_model_text']:>8} {r['median_ms']:>9.2f} {r['max_ms']:>8.0f}",
                flush=True,
            )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {peak:.0f} MB (seed {args.seed}, step limit {args.step_seconds:g} s)")
    for r in rows:
        if r["first_error"]:
            print(f"first exception in {r['env']} / {r['category']}:\n{r['first_error']}")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"rows": rows, "peak_rss_mb": peak}, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
