"""Rehearsal throughput: the batched vector env vs N sequential single envs, same seeds, one run.

Both sides play the same BFCL multi_turn_base tasks with the same env seeds and the same scripted ACT
actions (one tool call per step, drawn from each task's ground truth), so they rehearse the same calls:
the vector env answers all N pending calls with ONE batched generate per step, the sequential side makes
N generate calls of batch 1. Prints rehearsed tokens per second for both and their ratio (target >= 3x at
N = 8 with the tiny model). Runs alternate (sequential, vector, sequential, ...) and the median is used.

Every run starts from an empty prefix KV cache (`agents.engines.kv_cache.PrefixKVCache.clear`), so neither side
reuses keys/values computed by an earlier run. Within a run the cache works as in training (each call
feeds only the new tokens; prompt prefixes shared by several tasks are prefilled once). Two settings,
both printed:

* ``cold``: the timed rehearsal calls also encode each episode's prompt (system prompt, tool schemas,
  user turn: 3-5k tokens per BFCL task), because the scripted actions never ran the model on it.
* ``rollout``: before the timed steps, the policy encodes each episode's prompt (untimed, in the same
  way on both sides: one call per env for the sequential envs, one batched call for the vector env),
  as the ACT role's generation does in a real rollout (`agents.rollout.collect_rollouts`), where the
  rehearsal continues the KV of the ACT message it answers. This is the rehearsal work a rollout pays.

Measured here (2 cores, tiny model, N = 8, 3 steps, 64 tokens, threads 2): rollout 3.27x, cold 2.55x;
with 32 tokens: rollout 2.99-3.28x, cold 1.93-2.03x (two runs). The cold ratio is bounded by the prompt
prefill, which batching cannot shrink: it is the same per-token work on both sides (attention over the
3-5k-token prompt), and it dominates the vector env's time.

    .venv/bin/python -m benchmarks.perf.rehearse_throughput [--num-envs 8] [--model tiny-random] [--steps 3] \\
        [--max-new-tokens 64]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import envace_gym  # noqa: F401
from agents.policy import load_policy, make_policy_rehearser
from benchmarks.bfcl.verify import ground_truth_tool_calls
from envace_gym.envs.rehearse import RehearseEnv
from envace_gym.envs.rehearse_vector import RehearseVectorEnv
from envace_gym.parsing import format_tool_calls


def _actions(env: RehearseEnv, task_ids: list[str], steps: int) -> list[list[str]]:
    """Per env, `steps` single-call actions from the task's ground truth (cycled)."""
    out = []
    for tid in task_ids:
        task = env.task_by_id(tid)
        calls = [c for turn in ground_truth_tool_calls(task) for c in turn]
        out.append([format_tool_calls([calls[i % len(calls)]], "hermes") for i in range(steps)])
    return out


def _encode_prompts(policy, envs: list[RehearseEnv]) -> None:
    """Run the policy over each env's current context (what an ACT generation does first), untimed."""
    policy.generate([e.trajectory.token_ids for e in envs], max_new_tokens=1, temperature=0.0, seeds=[0] * len(envs))


def run_sequential(envs: list[RehearseEnv], task_ids, actions, seed: int, policy=None) -> tuple[float, int]:
    """Timed steps of N single envs one after the other; with `policy`, prompts are encoded first (untimed)."""
    tokens, elapsed = 0, 0.0
    for i, env in enumerate(envs):
        t0 = time.perf_counter()
        env.reset(seed=seed + i, options={"task_id": task_ids[i]})
        if policy is not None:
            _encode_prompts(policy, [env])
            t0 = time.perf_counter()
        for action in actions[i]:
            _, _, term, trunc, info = env.step(action)
            tokens += sum(len(r.token_ids) for r in info["rehearsals"])
            if term or trunc:
                break
        elapsed += time.perf_counter() - t0
    return elapsed, tokens


def run_vector(venv: RehearseVectorEnv, task_ids, actions, seed: int, policy=None) -> tuple[float, int]:
    """Timed steps of the vector env; with `policy`, prompts are encoded first in one batch (untimed)."""
    tokens = 0
    t0 = time.perf_counter()
    venv.reset(seed=seed, options={"task_ids": task_ids})
    if policy is not None:
        _encode_prompts(policy, venv.envs)
        t0 = time.perf_counter()
    for s in range(len(actions[0])):
        _, _, _, _, infos = venv.step([a[s] for a in actions])
        tokens += sum(len(r.token_ids) for rs in infos["rehearsals"] for r in (rs or []))
    return time.perf_counter() - t0, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--model", default="tiny-random")
    parser.add_argument("--steps", type=int, default=3, help="tool-call steps per episode")
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        default=64,
        help="cap on tokens per rehearsed tool response (64: TrainConfig.rehearse_max_new_tokens)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rehearser = make_policy_rehearser(policy=load_policy(args.model))
    kw = dict(
        suite="bfcl",
        categories=["multi_turn_base"],
        split="train",
        rehearser=rehearser,
        max_new_tokens=args.max_new_tokens,
        temperature=1.0,
        max_steps_per_turn=args.steps + 1,
    )
    envs = [RehearseEnv(**kw) for _ in range(args.num_envs)]
    venv = RehearseVectorEnv(num_envs=args.num_envs, **kw)
    task_ids = [t.id for t in envs[0].tasks[: args.num_envs]]
    actions = _actions(envs[0], task_ids, args.steps)
    policy = rehearser.policy
    print(
        f"model={args.model} N={args.num_envs} steps={args.steps} max_new_tokens={args.max_new_tokens} "
        f"threads={args.threads} repeats={args.repeats}"
    )
    for setting, encoder in (("cold", None), ("rollout", policy)):
        seq, vec = [], []
        for r in range(args.repeats):
            for runs, fn, target in ((seq, run_sequential, envs), (vec, run_vector, venv)):
                if policy.kv_cache is not None:
                    policy.kv_cache.clear()
                runs.append(fn(target, task_ids, actions, seed=100 * r, policy=encoder))
        seq_tps = statistics.median(tok / s for s, tok in seq)
        vec_tps = statistics.median(tok / s for s, tok in vec)
        same = all(a[1] == b[1] for a, b in zip(seq, vec))
        print(
            f"[{setting}] sequential single envs : {seq_tps:8.1f} rehearsed tokens/s  "
            f"(median of {[f'{s:.2f}s' for s, _ in seq]})"
        )
        print(
            f"[{setting}] batched vector env     : {vec_tps:8.1f} rehearsed tokens/s  "
            f"(median of {[f'{s:.2f}s' for s, _ in vec]})"
        )
        print(f"[{setting}] ratio vector/sequential: {vec_tps / seq_tps:.2f}x   (same rehearsed token counts: {same})")


if __name__ == "__main__":
    main()
