"""One GRPO optimizer step, ours vs TRL 1.16.0, on the fixed workload of /work/shared/bench/trl_grpo_step.py.

Same work on both sides (imported from that script: `build_rows`, `reward_fn`, `PhaseClock`): 64 "add two
numbers" chat prompts, 2 prompts x K=4 completions per step, at most 64 new tokens, temperature 1, fp32,
lr 1e-6, beta 0, one optimizer step per generation batch, 2 torch threads, 8 steps, median of steps 3..8.

Ours: `agents.policy.Policy.generate` (batched, identical prompts of a group prefilled once, last-position
logits only) -> `reward_fn` -> `agents.grpo.grpo_advantages` (group mean baseline, std scaling as TRL's
default) -> `agents.training.logprobs.token_logprobs` (chunked LM head, never the full (N, T, V) logits) ->
`agents.grpo.grpo_loss` (token-mean clipped surrogate; ratio against the logprobs recorded at generation, so
no extra old-logprob forward) -> backward -> grad-norm clip 1.0 -> AdamW. TRL: its own script, unchanged, in a
separate virtual environment (TRL is not a project dependency).

Equal work: by default every completion on both sides is exactly 64 tokens (ours samples with no stop id;
TRL's script gets ``--full-length``, i.e. ``min_new_tokens=64``), the prompts are the same workload rows
(TRL's prompt lengths are counted from the rows its script reports per step, through the tokenizer's chat
template), and the summary prints time per generated token (generate phase) and per trained token (loss
forward + backward + optimizer, over the real prompt + completion tokens) beside the per-step ratios. It
refuses to print a ratio (``step_ratio_ours_over_trl: null`` and ``refused``) when the two sides' generated
or trained token counts differ by more than 5%, which ``--natural-length`` (stop at end of message) usually
causes.

Each run is a fresh subprocess (so peak RSS is per implementation); runs alternate ours/TRL ``--rounds``
times and the ratio is of the medians over rounds of each run's median step.

Usage::

    python3 -m venv /tmp/trlvenv && /tmp/trlvenv/bin/pip install torch==2.13.0 trl==1.16.0 transformers==5.24.0
    SMOL=$(.venv/bin/python -c "import agents.models as m; print(m.ensure_smollm2_converted())")
    HF_HUB_OFFLINE=1 .venv/bin/python -m benchmarks.perf.grpo_step_vs_trl --model tiny --smol-path $SMOL --rounds 2
    HF_HUB_OFFLINE=1 .venv/bin/python -m benchmarks.perf.grpo_step_vs_trl --model smol --smol-path $SMOL --rounds 1
    # one side only (what the orchestrator runs): --impl ours  |  --impl trl --trl-python /tmp/trlvenv/bin/python
    # multi-turn BFCL episodes, envace-gym (rehearse, real) vs TRL with real tools, all in the project venv:
    .venv/bin/python -m benchmarks.perf.multiturn_grpo_vs_trl --tasks 2 --k 2   (its docstring has the workload)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from types import ModuleType

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
BENCH_DIRS = ("/work/shared/bench", os.path.join(REPO, "..", "shared", "bench"))


def _bench_dir() -> str:
    """The folder holding the shared workload script ``trl_grpo_step.py``.

    Raises:
        SystemExit: it is in none of `BENCH_DIRS` (the script is the project's shared anchor, not part of
            this repository).
    """
    for cand in BENCH_DIRS:
        if os.path.isfile(os.path.join(cand, "trl_grpo_step.py")):
            return os.path.abspath(cand)
    raise SystemExit(f"trl_grpo_step.py (the shared workload) not found in any of {list(BENCH_DIRS)}")


def load_workload() -> ModuleType:
    """The shared workload script as the module ``trl_grpo_step`` (its `build_rows`, `reward_fn`, `PhaseClock`),
    loaded from its file in `_bench_dir` once per process, without putting that folder on ``sys.path``."""
    name = "trl_grpo_step"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(_bench_dir(), f"{name}.py"))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # registered before it runs, as an import would
        spec.loader.exec_module(module)
    return sys.modules[name]


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

K = 4
PROMPTS_PER_STEP = 2
MAX_NEW = 64


def run_ours(args) -> dict:
    """Time our GRPO step in this process; returns the same summary keys as the TRL script."""
    import torch
    from transformers import AutoTokenizer

    anchor = load_workload()

    from agents.grpo import grpo_advantages, grpo_loss
    from agents.policy import Policy
    from agents.training.logprobs import token_logprobs
    from envace_gym.types import Message

    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(args.smol_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = anchor.build_model(args.model, tokenizer, args.smol_path, args.seed)
    model.train()
    policy = Policy(model, tokenizer, kv_cache=False)  # single-turn prompts: nothing to carry over
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.0)
    rows = anchor.build_rows()
    clock = anchor.PhaseClock()
    for step in range(args.max_steps):
        batch_rows = [rows[(step * PROMPTS_PER_STEP + j) % len(rows)] for j in range(PROMPTS_PER_STEP)]
        clock.begin()
        t_roll = time.perf_counter()
        prompts = [
            policy.renderer.prompt_ids([Message(role="user", content=r["prompt"][0]["content"])], None)
            for r in batch_rows
            for _ in range(K)
        ]
        t = time.perf_counter()
        model.eval()
        seeds = [args.seed * 1000 + step * 10 + i for i in range(len(prompts))]
        if args.full_length:  # no stop id: every completion is MAX_NEW tokens, as TRL's min_new_tokens makes its own
            gens = policy.engine.generate(prompts, max_new_tokens=MAX_NEW, temperature=1.0, stop_ids=[], seeds=seeds)
        else:
            gens = policy.generate(prompts, max_new_tokens=MAX_NEW, temperature=1.0, seeds=seeds)
        model.train()
        clock.add("generate", time.perf_counter() - t)
        t = time.perf_counter()
        texts = [policy.decode(g.token_ids) for g in gens]
        rewards = anchor.reward_fn(texts, [r["answer"] for r in batch_rows for _ in range(K)])
        clock.add("reward", time.perf_counter() - t)
        n = len(prompts)
        group_ids = torch.arange(n) // K  # (N,)
        adv = grpo_advantages(torch.tensor(rewards), group_ids, torch.arange(n), scale_by_std=True, eps=1e-4)  # (N,)
        width = max(len(p) + len(g.token_ids) for p, g in zip(prompts, gens))
        input_ids = torch.full((n, width), policy.pad_id, dtype=torch.long)  # (N, T) right padded
        attention_mask = torch.zeros((n, width), dtype=torch.long)  # (N, T)
        loss_mask = torch.zeros((n, width), dtype=torch.bool)  # (N, T)
        old_lp = torch.zeros((n, width))  # (N, T)
        for i, (p, g) in enumerate(zip(prompts, gens)):
            seq = p + g.token_ids
            input_ids[i, : len(seq)] = torch.tensor(seq)
            attention_mask[i, : len(seq)] = 1
            loss_mask[i, len(p) : len(seq)] = True
            old_lp[i, len(p) : len(seq)] = torch.tensor(g.logprobs)
        advantages = adv.view(n, 1).expand(n, width)  # (N, T)
        clock.add("rollout", time.perf_counter() - t_roll)
        t = time.perf_counter()
        lp = token_logprobs(model, input_ids, attention_mask, temperature=1.0)  # (N, T)
        loss, _ = grpo_loss(lp, old_lp, advantages, loss_mask, aggregation="token-mean")
        clock.add("loss_fwd", time.perf_counter() - t)
        t = time.perf_counter()
        loss.backward()
        clock.add("backward", time.perf_counter() - t)
        t = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        clock.add("optim", time.perf_counter() - t)
        rec = clock.end(
            global_step=step + 1,
            mean_completion_len=sum(len(g.token_ids) for g in gens) / n,
            mean_prompt_len=sum(len(p) for p in prompts) / n,
        )
        print("STEP " + json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in rec.items()}), flush=True)
    measured = [r for r in clock.steps if r["global_step"] > args.warmup]
    return {
        "impl": "ours",
        "model": args.model,
        "step_s": anchor.summarize([r["step"] for r in measured]),
        "phase_s": {p: anchor.summarize([r[p] for r in measured]) for p in anchor.PHASES},
        "mean_completion_len": anchor.summarize([r["mean_completion_len"] for r in measured]),
        "mean_prompt_len": anchor.summarize([r["mean_prompt_len"] for r in measured]),
        "peak_rss_mib": anchor.peak_rss_mib(),
        "torch_threads": torch.get_num_threads(),
    }


def _last_json(text: str) -> dict:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError("no JSON summary line in:\n" + text[-3000:])


def _subprocess(cmd: list[str]) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", OMP_NUM_THREADS="2")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return _last_json(proc.stdout)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=["tiny", "smol"], default="tiny")
    ap.add_argument("--smol-path", default=os.environ.get("SMOL_PATH"))
    ap.add_argument("--impl", choices=["both", "ours", "trl"], default="both")
    ap.add_argument("--trl-python", default="/tmp/trlvenv/bin/python")
    ap.add_argument("--rounds", type=int, default=2, help="alternating ours/TRL run pairs (--impl both)")
    ap.add_argument("--max-steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument(
        "--natural-length",
        dest="full_length",
        action="store_false",
        help="let completions stop at the end-of-message id (the two sides then sample different "
        "lengths and no step ratio is printed); default: every completion is exactly 64 tokens",
    )
    args = ap.parse_args(argv)
    bench_dir = _bench_dir()
    if not args.smol_path:
        from agents.models import ensure_smollm2_converted

        args.smol_path = str(ensure_smollm2_converted())
    if args.impl == "ours":
        print(json.dumps(run_ours(args)), flush=True)
        return
    common = [
        "--model",
        args.model,
        "--smol-path",
        args.smol_path,
        "--max-steps",
        str(args.max_steps),
        "--warmup",
        str(args.warmup),
        "--threads",
        str(args.threads),
        "--seed",
        str(args.seed),
    ]
    length = ["--full-length"] if args.full_length else []
    ours_cmd = [
        sys.executable,
        "-m",
        "benchmarks.perf.grpo_step_vs_trl",
        "--impl",
        "ours",
        *common,
        *([] if args.full_length else ["--natural-length"]),
    ]
    trl_cmd = [args.trl_python, os.path.join(bench_dir, "trl_grpo_step.py"), *common, *length]
    if args.impl == "trl":
        print(json.dumps(_subprocess(trl_cmd)), flush=True)
        return
    runs = {"ours": [], "trl": []}
    for r in range(args.rounds):
        for name, cmd in (
            (("ours", ours_cmd), ("trl", trl_cmd)) if r % 2 == 0 else (("trl", trl_cmd), ("ours", ours_cmd))
        ):
            res = _subprocess(cmd)
            runs[name].append(res)
            print(
                f"round {r} {name:4s} median step {res['step_s']['median']:.3f}s  generate "
                f"{res['phase_s']['generate']['median']:.3f}s  peak RSS {res['peak_rss_mib']:.0f} MiB  "
                f"completion len {res['mean_completion_len'].get('median')}",
                flush=True,
            )
    med = {k: statistics.median(x["step_s"]["median"] for x in v) for k, v in runs.items()}
    gen = {k: statistics.median(x["phase_s"]["generate"]["median"] for x in v) for k, v in runs.items()}
    update = {
        k: statistics.median(sum(x["phase_s"][p]["median"] for p in ("loss_fwd", "backward", "optim")) for x in v)
        for k, v in runs.items()
    }
    rss = {k: max(x["peak_rss_mib"] for x in v) for k, v in runs.items()}
    rows = K * PROMPTS_PER_STEP
    completion = {k: statistics.median(x["mean_completion_len"]["median"] for x in v) for k, v in runs.items()}
    prompt = {
        "ours": statistics.median(x["mean_prompt_len"]["median"] for x in runs["ours"]),
        "trl": _trl_prompt_len(args.smol_path, runs["trl"], args.warmup),
    }
    generated = {k: rows * completion[k] for k in runs}  # tokens sampled per step
    trained = {k: rows * (prompt[k] + completion[k]) for k in runs}  # real tokens through fwd + bwd per step
    gap = {
        "generated": abs(generated["ours"] / generated["trl"] - 1),
        "trained": abs(trained["ours"] / trained["trl"] - 1),
    }
    equal = all(g <= 0.05 for g in gap.values())
    summary = {
        "model": args.model,
        "rounds": args.rounds,
        "full_length": args.full_length,
        "median_step_s": med,
        "median_generate_s": gen,
        "median_update_s": update,
        "peak_rss_mib": rss,
        "generated_tokens_per_step": generated,
        "trained_tokens_per_step": trained,
        "token_gap": {k: round(v, 3) for k, v in gap.items()},
        "generate_ms_per_generated_token": {k: round(1e3 * gen[k] / generated[k], 2) for k in runs},
        "update_ms_per_trained_token": {k: round(1e3 * update[k] / trained[k], 3) for k in runs},
        "rss_ratio_ours_over_trl": round(rss["ours"] / rss["trl"], 3),
    }
    if equal:
        summary["step_ratio_ours_over_trl"] = round(med["ours"] / med["trl"], 3)
        summary["generate_ratio_ours_over_trl"] = round(gen["ours"] / gen["trl"], 3)
        summary["update_ratio_ours_over_trl"] = round(update["ours"] / update["trl"], 3)
    else:
        summary["step_ratio_ours_over_trl"] = None
        summary["refused"] = (
            f"the two sides did different work (generated tokens differ by {gap['generated']:.1%}, "
            f"trained tokens by {gap['trained']:.1%}; the limit is 5%): compare the per-token times"
        )
    print(json.dumps(summary), flush=True)


def _trl_prompt_len(smol_path: str, trl_runs: list[dict], warmup: int) -> float:
    """Mean prompt tokens of the rows TRL trained on in its measured steps: the prompts its script reports
    per step (``step_prompt_idx``; TRL's sampler orders the rows itself) through the tokenizer's chat template
    with the generation prompt, as TRL encodes them (its script reports only completion lengths)."""
    from transformers import AutoTokenizer

    anchor = load_workload()

    tokenizer = AutoTokenizer.from_pretrained(smol_path)
    rows = anchor.build_rows()
    lens = []
    for run in trl_runs:
        for step in run["step_prompt_idx"][warmup:]:
            for i in step:
                ids = tokenizer.apply_chat_template(rows[i]["prompt"], add_generation_prompt=True, tokenize=True)
                ids = ids["input_ids"] if hasattr(ids, "keys") else ids
                lens.extend([len(ids)] * K)
    return sum(lens) / len(lens)


if __name__ == "__main__":
    main()
