"""Is there a reward signal to learn from? K sampled trajectories per task, as one GRPO step would draw them.

GRPO learns only from groups whose K rewards differ. This script samples K trajectories for each of B tasks
with a policy (a model name or a checkpoint's ``model/`` folder), exactly as `agents.rollout.collect_rollouts`
does in training (``--rollout rehearse``: the policy rehearses the tools; ``real``: real backends), and reports
where the reward is lost:

* tasks solved (R = 1) of B·K trajectories, with a Wilson 95% interval, and groups with reward variance;
* per user turn, for suites whose verifier checks each turn (BFCL's own replay check,
  `benchmarks.bfcl.verify.verify_multi_turn`, ``details["turns"]``): the fraction of checked turns that
  pass, and of first turns;
* ACT calls that name a tool the task offers at that turn, parse errors per ACT message, truncations.

Usage (after ``make demo``, on its SFT checkpoint; ``make demo-bfcl`` writes ``runs/demo``)::

    .venv/bin/python -m benchmarks.experiments.reward_signal --suite lab-stated \\
        --model runs/lab-stated/sft/checkpoints/step_000024/model \\
        --tasks 12 --group-size 4 --max-steps-per-turn 8 --max-new-tokens 48 --rehearse-max-new-tokens 32 --seed 1
    .venv/bin/python -m benchmarks.experiments.reward_signal --model runs/demo/sft/checkpoints/step_000008/model \\
        --tasks 4 --group-size 4 --seed 0

Prints one table; ``--out FILE.json`` also writes the numbers.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from typing import Any

import numpy as np


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (Wilson, 1927); (0, 0) for n = 0."""
    if n == 0:
        return 0.0, 0.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def act_messages(trajectory: Any) -> list[tuple[int, int, Any]]:
    """``(turn, index, message)`` of each ACT message of a trajectory; a user message after an ACT message
    opens the next turn, as in the env."""
    out, turn, seen_assistant = [], 0, False
    for i, m in enumerate(trajectory.messages):
        if m.role == "user" and seen_assistant:
            turn, seen_assistant = turn + 1, False
        elif m.role == "assistant":
            seen_assistant = True
            out.append((turn, i, m))
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m", help="model name, local HF folder, or tiny-random")
    parser.add_argument(
        "--suite", default="bfcl", help="task suite registered in envace_gym.suites (bfcl, lab, tau2, ...)"
    )
    parser.add_argument(
        "--categories",
        nargs="+",
        default=None,
        help="the suite's categories (default: the suite's default categories; bfcl: multi_turn_base)",
    )
    parser.add_argument("--split", default="train", choices=["train", "test", "all"])
    parser.add_argument("--tasks", type=int, default=4, help="B: tasks (drawn with --seed from the split)")
    parser.add_argument("--group-size", type=int, default=4, help="K: trajectories per task")
    parser.add_argument("--rollout", default="rehearse", choices=["rehearse", "real", "null"])
    parser.add_argument("--max-steps-per-turn", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=128, help="cap per ACT message")
    parser.add_argument("--rehearse-max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--out", default=None, help="also write the numbers to this JSON file")
    args = parser.parse_args(argv)

    import torch

    from agents.policy import PolicyRehearser, load_policy
    from agents.rollout import collect_rollouts
    from envace_gym.envs.rehearse_vector import RehearseVectorEnv
    from envace_gym.suites import make_suite

    if args.threads:
        torch.set_num_threads(args.threads)
    suite = make_suite(args.suite)
    pool = suite.tasks(args.categories, args.split)
    rng = np.random.default_rng(args.seed)
    chosen = [pool[i] for i in rng.choice(len(pool), size=min(args.tasks, len(pool)), replace=False)]
    policy = load_policy(args.model)
    env = RehearseVectorEnv(
        num_envs=len(chosen) * args.group_size,
        suite=args.suite,
        tasks=chosen,
        rehearser=PolicyRehearser(policy),
        max_new_tokens=args.rehearse_max_new_tokens,
        temperature=args.temperature,
        max_steps_per_turn=args.max_steps_per_turn,
    )
    t0 = time.perf_counter()
    trajectories, stats = collect_rollouts(
        policy,
        env,
        [t.id for t in chosen],
        args.group_size,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        seed=args.seed,
        rollout=args.rollout,
    )
    seconds = time.perf_counter() - t0

    solved = [float(r) == 1.0 for r in stats.verifier_rewards]
    groups = np.asarray(stats.group_ids)
    rewards = np.asarray(stats.verifier_rewards)
    with_variance = int(sum(float(np.ptp(rewards[groups == g])) > 0 for g in np.unique(groups)))
    turns_checked = turns_valid = first_checked = first_valid = 0
    calls = known = acts = parse_errors = 0
    for traj in trajectories:
        result = suite.verify(traj)
        for info in result.details.get("turns", []):
            if info.get("checked"):
                turns_checked += 1
                turns_valid += bool(info["valid"])
                if info["turn"] == 0:
                    first_checked += 1
                    first_valid += bool(info["valid"])
        for turn, i, m in act_messages(traj):
            acts += 1
            names = {t.name for t in traj.task.tools_at_turn(turn)}
            for c in m.tool_calls or []:
                calls += 1
                known += c.name in names
            nxt = traj.messages[i + 1] if i + 1 < len(traj.messages) else None
            parse_errors += bool(nxt is not None and nxt.role == "tool" and nxt.tool_call_id is None)
    n = len(trajectories)
    lo, hi = wilson(sum(solved), n)
    per_task = {t.id: int(sum(s for s, g in zip(solved, groups) if g == i)) for i, t in enumerate(chosen)}
    out = {
        "model": args.model,
        "rollout": args.rollout,
        "seed": args.seed,
        "tasks": [t.id for t in chosen],
        "group_size": args.group_size,
        "trajectories": n,
        "solved": int(sum(solved)),
        "solved_ci95": [lo, hi],
        "groups_with_reward_variance": with_variance,
        "solved_per_task": per_task,
        "turns_checked": turns_checked,
        "turns_valid": turns_valid,
        "turns_valid_ci95": list(wilson(turns_valid, turns_checked)),
        "first_turns_checked": first_checked,
        "first_turns_valid": first_valid,
        "act_messages": acts,
        "tool_calls": calls,
        "calls_to_offered_tools": known,
        "parse_errors": parse_errors,
        "truncated": int(stats.truncated),
        "seconds": seconds,
    }
    print(
        f"[reward_signal] {args.model} ({args.rollout} rollouts, seed {args.seed}): {n} trajectories = "
        f"{len(chosen)} tasks x K={args.group_size} in {seconds:.0f} s"
    )
    rows = [
        ("tasks solved (R = 1)", f"{out['solved']}/{n}", f"[{lo:.3f}, {hi:.3f}]"),
        ("groups with reward variance", f"{with_variance}/{len(chosen)}", ""),
    ]
    if turns_checked:  # suites whose verifier checks each user turn (BFCL's replay)
        rows += [
            (
                "checked user turns that pass the replay",
                f"{turns_valid}/{turns_checked}",
                "[{:.3f}, {:.3f}]".format(*out["turns_valid_ci95"]),
            ),
            ("first user turns that pass", f"{first_valid}/{first_checked}", ""),
        ]
    rows += [
        ("ACT calls naming an offered tool", f"{known}/{calls}", ""),
        ("ACT messages answered with a parse error", f"{parse_errors}/{acts}", ""),
        ("truncated trajectories", f"{out['truncated']}/{n}", ""),
    ]
    for name, value, ci in rows:
        print(f"  {name:<44} {value:>10}  {ci}")
    print("  solved of K per task: " + ", ".join(f"{k} {v}/{args.group_size}" for k, v in per_task.items()))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
