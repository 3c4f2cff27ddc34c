"""A served world model's episode transcript: the lab warm start behind ``envace serve-tools``, called by an MCP client.

    python -m benchmarks.experiments.served_world_model                      # the lab_ablations warm start
    python -m benchmarks.experiments.served_world_model --model FOLDER --task ship_test3 fill_test1

Starts ``envace serve-tools --suite lab --split test`` as a stdio MCP server (one subprocess), connects with
`benchmarks.mcp.MCPBackend` (control tools hidden), conditions the session on each given lab test task in turn
(``envace_start_task``) and plays that task's reference calls, one per call. For each call it prints the call, the
served (rehearsed) answer, the real backend's answer to the same call at the same point, and whether they match
exactly; then the fidelity over every call (`wrappers.fidelity.fidelity_summary`). Unless ``--no-in-process``, it
also plays the same calls through an in-process rehearsing env (`wrappers.RehearsalFidelity` over
`envace_gym.envs.rehearse.RehearseEnv`, greedy) and reports whether every served answer, and so the fidelity,
equals the in-process one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
WARM = ROOT / "runs" / "lab_ablations" / "warm_start" / "sft"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--warm", default=str(WARM), help="an SFT run folder; its newest checkpoint's model is served")
    ap.add_argument("--model", default=None, help="a model name or folder to serve instead of --warm's")
    ap.add_argument(
        "--task", nargs="+", default=["full_job_test0"], help="the lab test tasks whose reference calls are played"
    )
    ap.add_argument("--max-new-tokens", type=int, default=64, help="cap on each answer's tokens")
    ap.add_argument("--no-in-process", action="store_true", help="skip the in-process rehearsal comparison")
    return ap.parse_args(argv)


def serve_command(model: str, max_new_tokens: int) -> list[str]:
    """The ``envace serve-tools`` command line (this interpreter, one torch thread)."""
    return [
        sys.executable,
        "-m",
        "agents.cli",
        "serve-tools",
        "--model",
        model,
        "--suite",
        "lab",
        "--split",
        "test",
        "--max-new-tokens",
        str(max_new_tokens),
        "--threads",
        "1",
    ]


def _calls(suite: Any, task: Any) -> list:
    return [c for turn in suite.ground_truth(task) for c in turn]


def in_process_answers(model: str, tasks: list, max_new_tokens: int) -> list[dict[str, Any]]:
    """The in-process greedy rehearsals of each task's reference calls (each call one ACT message, as the server
    plays them), as `wrappers.RehearsalFidelity` records them."""
    from agents.policy import PolicyRehearser, load_policy
    from envace_gym.envs.rehearse import RehearseEnv
    from envace_gym.parsing import format_tool_calls
    from envace_gym.suites import make_suite
    from wrappers import RehearsalFidelity

    suite = make_suite("lab")
    rehearser = PolicyRehearser(load_policy(model))
    records: list[dict[str, Any]] = []
    for task in tasks:
        env = RehearsalFidelity(
            RehearseEnv(rehearser=rehearser, suite="lab", tasks=[task], temperature=0.0, max_new_tokens=max_new_tokens)
        )
        env.reset(seed=0, options={"task_id": task.id})
        for call in _calls(suite, task):
            env.step(format_tool_calls([call], "hermes"))
        records += env.episode_calls
    return records


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from agents.pipeline import latest_model
    from agents.tool_serving import CONTROL_TOOLS, START_TASK
    from benchmarks.mcp import MCPBackend
    from envace_gym.suites import make_suite
    from wrappers.fidelity import fidelity_metrics, fidelity_summary

    args = parse_args(argv)
    model = args.model or latest_model(args.warm)
    suite = make_suite("lab")
    by_id = {t.id: t for t in suite.tasks(None, "test")}
    unknown = [i for i in args.task if i not in by_id]
    if unknown:
        raise SystemExit(f"--task {unknown} are not lab test tasks (e.g. relocate_test0, ship_test3)")
    tasks = [by_id[i] for i in args.task]
    passed = ("ENVACE_CACHE", "HF_HUB_OFFLINE", "TOKENIZERS_PARALLELISM", "OMP_NUM_THREADS")
    env = {"PYTHONPATH": str(ROOT), **{k: os.environ[k] for k in passed if k in os.environ}}
    command = serve_command(model, args.max_new_tokens)
    print("$ " + " ".join(command))
    backend = MCPBackend(command, env=env, hidden_tools=CONTROL_TOOLS, start_timeout_s=300, call_timeout_s=300)
    records: list[dict[str, Any]] = []
    try:
        print(f"tools: {[t.name for t in backend.tools()]}")
        for task in tasks:
            print(f"\n{START_TASK}(task_id={task.id!r}) -> {backend.control(START_TASK, {'task_id': task.id})}")
            for m in task.turns[0]:
                print(f"[{m.role}] {m.content}")
            real = suite.make_backend(task)
            for i, call in enumerate(_calls(suite, task), 1):
                served, truth = backend.execute(call), real.execute(call)
                records.append(
                    {"task_id": task.id, "rehearsed": served, "real": truth, **fidelity_metrics(served, truth)}
                )
                print(f"call {i}: {call.name}({json.dumps(call.arguments)})")
                print(f"  served: {served}")
                print(f"  real:   {truth}")
                print(f"  exact match: {bool(records[-1]['exact_match'])}")
    finally:
        backend.close()
    summary = fidelity_summary(records)
    print(
        f"\nfidelity over {summary['num_calls']} calls of {len(tasks)} tasks: exact {summary['exact_match']:.2f}, "
        f"JSON structure {summary['json_structure_match']:.2f}, token F1 {summary['token_f1']:.3f}"
    )
    out: dict[str, Any] = {"model": model, "tasks": args.task, "records": records, "fidelity": summary}
    if not args.no_in_process:
        mine = in_process_answers(model, tasks, args.max_new_tokens)
        same = [r["rehearsed"] for r in mine] == [r["rehearsed"] for r in records]
        equal_fidelity = fidelity_summary(mine) == summary
        print(f"served answers equal the in-process rehearsal's: {same}; the same fidelity: {equal_fidelity}")
        out["equal_in_process"] = same and equal_fidelity
    return out


if __name__ == "__main__":
    main()
