"""Judge against verifier on the same lab trajectories: the agreement (confusion matrix) of a checklist judge
(`envace_gym.judging.score_with_judge` with `benchmarks.lab.suite.LabSuite.checklist`, the checklist derived from
the reference solution) and the lab's verifier (`LabSuite.verify`: replay, final state, no failed call).

Episodes are played on the real backend by ``--policy``:

* ``reference`` (default): the scripted policy that plays the task's reference solution, with probability
  ``--mistake-rate`` after one mistaken call drawn from `LabSuite.mutations` (a move onto a full shelf that breaks
  the item, an unknown item, a wrong box label, the last move or ship repeated), as
  `agents.training.demonstrations.error_demonstration` plays it; this gives both classes (a correct episode and a
  failed one) in known proportions;
* a model name or folder (``lab-tiny``, ``smollm2-lab``, a trained checkpoint's ``model/``): the model acts
  greedily (`agents.policy.Policy.act` in `envace_gym.envs.tool_use.ToolUseEnv`).

Each episode is scored by the verifier (R in {0, 1}) and by the judge (R in [0, 1], a pass when R >= ``--threshold``,
default 1.0: every item met, the verifier's own all-or-nothing). The judge is a `agents.judges.LocalJudge` of
``--judge`` (default ``smollm2-135m``, greedy), or an `agents.judges.OpenAIJudge` of ``--judge-url`` (vLLM, SGLang,
``envace serve``), shown the conversation without its system message unless ``--judge-system`` (the checklist items
name calls, errors and answers, which the conversation shows; the lab's rules and layout would double every prompt).
A local judge's reply is made to start with ``--judge-prefix`` (default ``{"answer":``, so a small model only
writes ``true`` or ``false``; without it SmolLM2-135M answers in prose and every verdict is unparseable). Small
judges are weak: the table reports what they do, unparseable verdicts included (scored as
``--unparseable-score`` and counted).

    .venv/bin/python -m benchmarks.experiments.judge_agreement                      # 12 episodes, ~2-4 min on 2 cores
    .venv/bin/python -m benchmarks.experiments.judge_agreement --judge tiny-random --episodes 4   # smoke run

Printed: the confusion matrix (verifier rows, judge columns), agreement, Cohen's kappa, the judge's mean R per
verifier class, unparseable verdicts and the judge's prompt and cache counts. ``--out DIR`` writes
``DIR/results.json`` (what is printed; ``python -m benchmarks.results DIR`` renders it into the results page) and
``DIR/episodes.jsonl``, one record per episode (task, both rewards, the judge's per-item verdicts and replies).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

from benchmarks.experiments.result_tables import judge_agreement_table
from benchmarks.provenance import provenance


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", default="lab", help="a suite with checklist(task): lab (hidden rules) or lab-stated")
    ap.add_argument("--split", default="test", choices=("train", "test"))
    ap.add_argument("--episodes", type=int, default=12, help="episodes, round-robin over the suite's families")
    ap.add_argument("--policy", default="reference", help="'reference' (scripted, with mistakes) or a model")
    ap.add_argument("--mistake-rate", type=float, default=0.5, help="reference policy: chance of one mistaken call")
    ap.add_argument("--judge", default="smollm2-135m", help="LocalJudge model (name or folder)")
    ap.add_argument("--judge-url", default=None, help="an OpenAI-compatible base URL instead (OpenAIJudge)")
    ap.add_argument("--judge-model", default=None, help="with --judge-url: the served model id (default: --judge)")
    ap.add_argument("--judge-tokens", type=int, default=4, help="cap per judge reply, tokens (after the prefix)")
    ap.add_argument(
        "--judge-prefix",
        default='{"answer":',
        help="LocalJudge: the text its reply is made to start with (LocalJudge's reply_prefix; '' for none)",
    )
    ap.add_argument(
        "--judge-system",
        action="store_true",
        help="show the judge the episode's system message (the lab's rules and layout; ~2x longer prompts)",
    )
    ap.add_argument("--threshold", type=float, default=1.0, help="judge R at or above which an episode passes")
    ap.add_argument("--unparseable-score", type=float, default=0.0)
    ap.add_argument("--max-new-tokens", type=int, default=64, help="model policy: cap per ACT message")
    ap.add_argument("--max-steps-per-turn", type=int, default=8, help="model policy: ACT messages per user turn")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None, help="folder for results.json and episodes.jsonl")
    args = ap.parse_args(argv)
    if args.out and args.out.endswith(".jsonl"):
        ap.error(f"--out is a folder (results.json and episodes.jsonl go in it), got the file name {args.out!r}")
    if args.episodes < 1 or args.judge_tokens < 1 or not 0 <= args.mistake_rate <= 1:
        ap.error("--episodes and --judge-tokens must be >= 1 and --mistake-rate in [0, 1]")
    if not 0 <= args.threshold <= 1 or not 0 <= args.unparseable_score <= 1:
        ap.error("--threshold and --unparseable-score must be in [0, 1]")
    return args


def pick_tasks(suite: Any, split: str, n: int) -> list[Any]:
    """`n` tasks, one family after another (the first of each family, then the second, ...)."""
    by_family = [suite.tasks([c], split) for c in suite.categories]
    out = []
    for i in range(max(len(f) for f in by_family)):
        out += [f[i] for f in by_family if i < len(f)]
    if len(out) < n:
        raise SystemExit(f"the {split} split has {len(out)} tasks, fewer than --episodes {n}")
    return out[:n]


def reference_episodes(suite_name: str, suite: Any, tasks: list[Any], tokenizer: Any, args: argparse.Namespace):
    """The scripted policy's trajectories and whether each played a mistake."""
    from agents.training.demonstrations import demonstration_env, demonstration_for_task, error_demonstration

    env = demonstration_env(tokenizer, suite_name, tasks=tasks)
    out = []
    for i, task in enumerate(tasks):
        rng = random.Random(f"{args.seed}/{i}")
        calls = [c for turn in suite.ground_truth(task) for c in turn]
        mutations = suite.mutations(task, calls, rng) if rng.random() < args.mistake_rate else []
        if mutations:
            position, call = rng.choice(mutations)
            trajectory, _ = error_demonstration(env, task, position, call)
        else:
            trajectory, _ = demonstration_for_task(env, task)
        out.append((trajectory, bool(mutations)))
    return out


def model_episodes(suite_name: str, tasks: list[Any], args: argparse.Namespace):
    """Trajectories of a model acting greedily on the real backend."""
    from agents.policy import load_policy
    from envace_gym.envs.tool_use import ToolUseEnv
    from envace_gym.responders import RealBackend

    policy = load_policy(args.policy)
    out = []
    for i, task in enumerate(tasks):
        env = ToolUseEnv(
            suite=suite_name,
            tasks=[task],
            tokenizer=policy.tokenizer,
            responder=RealBackend(),
            max_new_tokens=args.max_new_tokens,
            temperature=0.0,
            max_steps_per_turn=args.max_steps_per_turn,
        )
        env.reset(seed=args.seed + i, options={"task_id": task.id})
        done = False
        while not done:
            (action,) = policy.act([env.trajectory.token_ids], max_new_tokens=args.max_new_tokens, temperature=0.0)
            _, _, terminated, truncated, _ = env.step(action)
            done = terminated or truncated
        out.append((env.trajectory, False))
    return out


def confusion(pairs: list[tuple[bool, bool]]) -> dict[str, Any]:
    """Counts of (verifier pass, judge pass), agreement and Cohen's kappa (None when undefined)."""
    n = len(pairs)
    tp = sum(v and j for v, j in pairs)
    tn = sum(not v and not j for v, j in pairs)
    fp = sum(not v and j for v, j in pairs)
    fn = sum(v and not j for v, j in pairs)
    agreement = (tp + tn) / n if n else 0.0
    p_v, p_j = (tp + fn) / n if n else 0.0, (tp + fp) / n if n else 0.0
    chance = p_v * p_j + (1 - p_v) * (1 - p_j)
    kappa = (agreement - chance) / (1 - chance) if chance < 1 else None
    return {
        "both_pass": tp,
        "both_fail": tn,
        "judge_only": fp,
        "verifier_only": fn,
        "agreement": agreement,
        "kappa": kappa,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    import torch

    from agents.judges import LocalJudge, OpenAIJudge
    from agents.models import default_store
    from envace_gym.judging import score_with_judge
    from envace_gym.suites import make_suite

    torch.set_num_threads(args.threads)
    suite = make_suite(args.suite)
    if not callable(getattr(suite, "checklist", None)):
        raise SystemExit(f"suite {args.suite!r} derives no checklists (no checklist(task) method)")
    tasks = pick_tasks(suite, args.split, args.episodes)
    t0 = time.perf_counter()
    if args.judge_url:
        judge: Any = OpenAIJudge(args.judge_model or args.judge, args.judge_url, max_tokens=args.judge_tokens)
        tokenizer = default_store().tokenizer("smollm2-135m")
    else:
        judge = LocalJudge(args.judge, max_new_tokens=args.judge_tokens, reply_prefix=args.judge_prefix)
        tokenizer = judge.policy.tokenizer
    if args.policy == "reference":
        episodes = reference_episodes(args.suite, suite, tasks, tokenizer, args)
    else:
        episodes = model_episodes(args.suite, tasks, args)
    t_play = time.perf_counter() - t0
    records, pairs = [], []
    for (trajectory, mistaken), task in zip(episodes, tasks):
        verifier = suite.verify(trajectory).reward
        judged, info = score_with_judge(
            trajectory, suite.checklist(task), judge, unparseable_score=args.unparseable_score, system=args.judge_system
        )
        pairs.append((verifier == 1.0, judged >= args.threshold))
        records.append(
            {
                "task_id": task.id,
                "mistake": mistaken,
                "verifier": verifier,
                "judge": judged,
                "judge_pass": judged >= args.threshold,
                "unparseable": info["unparseable"],
                "items": [dict(r) for t in info["turns"] for r in t["items"]],
            }
        )
    c = confusion(pairs)
    mean = {
        cls: (sum(r["judge"] for r in rs) / len(rs) if rs else None)
        for cls, rs in (
            ("verifier_pass", [r for r in records if r["verifier"] == 1.0]),
            ("verifier_fail", [r for r in records if r["verifier"] != 1.0]),
        )
    }
    report = {
        "episodes": len(records),
        "suite": args.suite,
        "split": args.split,
        "policy": args.policy,
        "judge": args.judge_url or args.judge,
        "judge_prefix": None if args.judge_url else args.judge_prefix,
        "unparseable_score": args.unparseable_score,
        "threshold": args.threshold,
        "confusion": c,
        "judge_mean_reward": mean,
        "unparseable": judge.stats.unparseable,
        "judge_stats": judge.stats.to_dict(),
        "play_s": round(t_play, 1),
        "total_s": round(time.perf_counter() - t0, 1),
    }
    print("[judge_agreement] " + "\n".join(judge_agreement_table(report)))
    if args.out:
        import shlex

        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        command = "python -m benchmarks.experiments.judge_agreement " + shlex.join(argv or [])
        stored = {"kind": "judge_agreement", "command": command.strip(), **provenance(), **report}
        (out / "results.json").write_text(json.dumps(stored, indent=1))
        print(f"results in {out / 'results.json'}, per-episode records in {out / 'episodes.jsonl'}")
    return report


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
