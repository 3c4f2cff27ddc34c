"""One GRPO step on the same BFCL multi-turn tasks: envace-gym (rehearsed and real rollouts) vs TRL 1.16's
GRPOTrainer with real tools (through `agents.training.trl_adapter`), side by side in one run.

Workload, the same on every side: the first ``--tasks`` train tasks of ``--category`` (B), K = ``--k``
samples each, at most ``--max-new-tokens`` per ACT message, ``--max-steps-per-turn`` messages per user turn,
temperature 1, SmolLM2-135M-Instruct in float32, lr 1e-6, beta 0, one optimizer step, gradient
checkpointing on, ``--threads`` torch threads. Each side runs in a fresh subprocess, sides alternate over
``--rounds``.

- ``rehearse``: `agents.training.trainer.RoleWiseGRPOTrainer`, rollout "rehearse" (the policy answers its own tool
  calls; ACT and REHEARSE tokens are trained);
- ``real``: the same trainer with rollout "real" (the BFCL backends answer; ACT tokens trained);
- ``trl``: `trl.GRPOTrainer` with ``rollout_func=EnvACERollout`` (TRL's Transformers engine generates
  every ACT message, the BFCL backends answer, ACT tokens trained through ``env_mask``).

An untrained model earns no reward here, so every advantage is 0: envace-gym skips such an update, TRL
does not. ``--force-update 1`` (default) sets envace-gym's ``skip_empty_updates`` to false so that its
update runs too, with the same loss (0) and the same forward and backward work.

The sides sample their own completions, so the work is not forced equal (a multi-turn episode's length
depends on what the model writes). Printed per side: step, rollout and update seconds, generated and trained
tokens, seconds per generated token (rollout) and per trained token (update). A step ratio is printed
only between sides whose generated-token counts are within 5% of each other; otherwise the per-token
times are the comparison.

    .venv/bin/python -m benchmarks.perf.multiturn_grpo_vs_trl --tasks 2 --k 2 --rounds 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

SIDES = ("rehearse", "real", "trl")
EQUAL_WORK_TOLERANCE = 0.05


def task_ids(args) -> list[str]:
    from envace_gym.suites import make_suite

    return [t.id for t in make_suite("bfcl").tasks([args.category], "train")[: args.tasks]]


def run_ours(args, rollout: str) -> dict:
    import torch

    from agents.config import TrainConfig
    from agents.training.trainer import RoleWiseGRPOTrainer

    torch.set_num_threads(args.threads)
    ids = task_ids(args)
    with tempfile.TemporaryDirectory() as tmp:
        config = TrainConfig(
            run_dir=tmp,
            model=args.model,
            suite="bfcl",
            categories=[args.category],
            task_ids=ids,
            batch_tasks=len(ids),
            group_size=args.k,
            rollout=rollout,
            max_new_tokens=args.max_new_tokens,
            rehearse_max_new_tokens=args.max_new_tokens,
            max_steps_per_turn=args.max_steps_per_turn,
            temperature=1.0,
            optim={"lr": 1e-6},
            num_steps=1,
            seed=args.seed,
            min_solvable_fraction=0.0,
            tensorboard=False,
            run={"threads": args.threads, "device": "cpu"},
            skip_empty_updates=not args.force_update,
        )
        trainer = RoleWiseGRPOTrainer(config, log=None)
        (m,) = trainer.train(progress=False)
        trainer.close()
    generated = m["rollout/tokens/act"] + m["rollout/tokens/rehearse"]
    trained = generated if rollout == "rehearse" else m["rollout/tokens/act"]
    return {
        "side": rollout,
        "step_s": m["perf/step_s"],
        "rollout_s": m["perf/rollout_s"],
        "update_s": m["perf/update_s"],
        "generated_tokens": generated,
        "trained_tokens": trained,
        "reward_mean": m["rollout/reward_mean"],
        "real_tool_calls": m["rollout/real_tool_calls"],
        "skipped_update": bool(m["train/skipped_update"]),
    }


def run_trl(args) -> dict:
    import torch
    from trl import GRPOConfig, GRPOTrainer

    from agents.models import default_store
    from agents.training.trl_adapter import EnvACERollout, envace_dataset, envace_reward

    torch.set_num_threads(args.threads)
    ids = set(task_ids(args))
    store = default_store()
    model = store.model(args.model, shared=False)
    tokenizer = store.tokenizer(args.model)
    tokenizer.padding_side = "left"
    dataset = envace_dataset("bfcl", [args.category]).filter(lambda row: row["task_id"] in ids)
    rollout = EnvACERollout(
        suite="bfcl",
        categories=[args.category],
        max_new_tokens=args.max_new_tokens,
        max_steps_per_turn=args.max_steps_per_turn,
    )
    with tempfile.TemporaryDirectory() as tmp:
        config = GRPOConfig(
            output_dir=tmp,
            use_cpu=True,
            report_to="none",
            per_device_train_batch_size=len(ids) * args.k,
            num_generations=args.k,
            max_completion_length=args.max_new_tokens,
            max_steps=1,
            logging_steps=1,
            learning_rate=1e-6,
            beta=0.0,
            temperature=1.0,
            gradient_checkpointing=True,
            save_strategy="no",
            seed=args.seed,
            dataloader_num_workers=0,
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=envace_reward,
            args=config,
            train_dataset=dataset,
            rollout_func=rollout,
            processing_class=tokenizer,
        )
        t0 = time.perf_counter()
        trainer.train()
        wall = time.perf_counter() - t0
    logged = trainer.state.log_history[0]
    step_s = float(logged.get("step_time", wall))
    stats = rollout.last_stats
    return {
        "side": "trl",
        "step_s": step_s,
        "rollout_s": stats["rollout_s"],
        "update_s": step_s - stats["rollout_s"],
        "generated_tokens": stats["generated_tokens"],
        "trained_tokens": stats["act_tokens"],
        "reward_mean": stats["reward_mean"],
        "real_tool_calls": None,
        "skipped_update": False,
    }


def _subprocess(args, side: str) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.perf.multiturn_grpo_vs_trl",
        "--side",
        side,
        "--tasks",
        str(args.tasks),
        "--k",
        str(args.k),
        "--category",
        args.category,
        "--model",
        args.model,
        "--max-new-tokens",
        str(args.max_new_tokens),
        "--max-steps-per-turn",
        str(args.max_steps_per_turn),
        "--threads",
        str(args.threads),
        "--seed",
        str(args.seed),
        "--force-update",
        str(args.force_update),
    ]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), HF_DATASETS_OFFLINE="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    if proc.returncode != 0:
        raise RuntimeError(f"side {side} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    for line in reversed(proc.stdout.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"no JSON line from side {side}:\n{proc.stdout[-2000:]}")


def per_token(row: dict) -> dict:
    return {
        "rollout_s_per_generated_token": row["rollout_s"] / max(row["generated_tokens"], 1),
        "update_s_per_trained_token": row["update_s"] / max(row["trained_tokens"], 1),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sides", default=",".join(SIDES), help=f"comma-separated subset of {SIDES}")
    ap.add_argument("--side", choices=SIDES, default=None, help="run one side in this process (what the runner calls)")
    ap.add_argument("--tasks", type=int, default=2, help="B: the first B train tasks of the category")
    ap.add_argument("--k", type=int, default=2, help="K samples per task")
    ap.add_argument("--category", default="multi_turn_base")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--max-steps-per-turn", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument(
        "--force-update",
        type=int,
        choices=[0, 1],
        default=1,
        help="1: envace-gym runs its update even when every advantage is 0 (skip_empty_updates false; "
        "by default it skips such batches, TRL runs its forward and backward on every batch), so "
        "both sides do the update's work; 0: envace-gym's default",
    )
    args = ap.parse_args(argv)
    if args.side:
        row = run_trl(args) if args.side == "trl" else run_ours(args, args.side)
        print(json.dumps(row), flush=True)
        return 0
    sides = [s for s in args.sides.split(",") if s]
    runs: dict[str, list[dict]] = {s: [] for s in sides}
    for r in range(args.rounds):
        for side in sides if r % 2 == 0 else sides[::-1]:
            row = _subprocess(args, side)
            runs[side].append(row)
            print(
                f"round {r} {side:8s} step {row['step_s']:.1f} s (rollout {row['rollout_s']:.1f} + update "
                f"{row['update_s']:.1f}), generated {row['generated_tokens']} trained {row['trained_tokens']} tokens, "
                f"reward {row['reward_mean']:.3f}",
                flush=True,
            )
    summary = {}
    for side, rows in runs.items():
        med = {
            k: statistics.median(x[k] for x in rows)
            for k in ("step_s", "rollout_s", "update_s", "generated_tokens", "trained_tokens")
        }
        summary[side] = {**med, **per_token(med)}
    ratios = {}
    names = list(summary)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            ga, gb = summary[a]["generated_tokens"], summary[b]["generated_tokens"]
            gap = abs(ga - gb) / max(ga, gb, 1)
            key = f"{a}/{b}"
            per_gen = summary[a]["rollout_s_per_generated_token"] / summary[b]["rollout_s_per_generated_token"]
            per_trained = summary[a]["update_s_per_trained_token"] / summary[b]["update_s_per_trained_token"]
            ratios[key] = {
                "rollout_per_generated_token": round(per_gen, 3),
                "update_per_trained_token": round(per_trained, 3),
                "generated_token_gap": round(gap, 3),
            }
            if gap <= EQUAL_WORK_TOLERANCE:
                ratios[key]["step"] = round(summary[a]["step_s"] / summary[b]["step_s"], 3)
            else:
                ratios[key]["step"] = (
                    f"not printed: generated tokens differ by {gap:.0%} (> {EQUAL_WORK_TOLERANCE:.0%})"
                )
    skipped = {side: any(x["skipped_update"] for x in rows) for side, rows in runs.items()}
    for key in ratios:
        a, b = key.split("/")
        if skipped[a] or skipped[b]:
            ratios[key]["update_per_trained_token"] = "not printed: one side skipped its update (no learning signal)"
            ratios[key]["step"] = "not printed: one side skipped its update (no learning signal)"
    print(
        json.dumps(
            {
                "workload": {
                    "category": args.category,
                    "B": args.tasks,
                    "K": args.k,
                    "model": args.model,
                    "max_new_tokens": args.max_new_tokens,
                    "max_steps_per_turn": args.max_steps_per_turn,
                    "rounds": args.rounds,
                    "force_update": bool(args.force_update),
                },
                "sides": summary,
                "skipped_update": skipped,
                "ratios": ratios,
            },
            indent=1,
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
