"""The HF engine and the vLLM engine on equal work: the same rollout batches, the same lengths, side by side.

A batch is the first ACT call of B rollouts, as `agents.rollout.collect_rollouts` makes it: B / K tasks, each
task's prompt K times (the K samples of a GRPO group; ``--k``), rendered by the environment
(``EnvACE-Tool-v0``'s reset) for the workload's suite and model. Both engines sample ``--new`` tokens per row at
temperature 1 with one seed per row and no stop id (EOS ignored: every row generates exactly ``--new`` tokens,
checked), so they do the same work; each engine starts every timed call from an empty cache (the HF engine gets
a new `agents.engines.kv_cache.PrefixKVCache`, vLLM's prefix cache is reset), as a rollout's first call does, and
both use what they have for the K identical prompts (the HF engine prefills a repeated context once, vLLM's
prefix cache shares its blocks).

Workloads (``--workloads``):

* ``lab-tiny``: EnvACE-Lab (every family) with lab-tiny, the lab recipe's model (0.9M parameters, ~51-token
  prompts);
* ``lab-smollm2``: EnvACE-Lab with smollm2-lab (SmolLM2-135M on the lab vocabulary, ~130-token prompts);
* ``bfcl``: BFCL ``simple_python`` with SmolLM2-135M (240-400-token prompts);
* ``bfcl-multi-turn``: BFCL ``multi_turn_base`` with SmolLM2-135M (3-5.6k-token prompts). Not in the default
  list: at B = 128 the HF engine's KV cache alone (one copy per row) would take ~18 GB.

Per workload and B (``--batches``) it prints, for each engine: tokens/s (``B × new / t(new)``, prefill included)
and ms per decode step (``(t(new) - t(1)) / (new - 1)``: the prefill and one-off costs cancel), each the median
of ``--repeats`` rounds after an untimed one, the two engines interleaved within a round (this machine's speed
drifts); then vLLM's speed-up. Both engines run in this process with ``--threads`` torch threads; models are
fp32. The load average is printed before each workload and at the end, and recorded before each workload and
after each row (a shared machine's other jobs slow both
engines, and more threads than free cores slow them unevenly).

With ``--out DIR`` it writes ``DIR/results.json`` (kind ``engines_equal_work``), which ``python -m
benchmarks.results DIR`` renders into the results page. Run it in the vLLM environment (``make venv-vllm``)::

    .venv-vllm/bin/python -m benchmarks.perf.engines_equal_work --out runs/engines_equal_work
    .venv-vllm/bin/python -m benchmarks.perf.engines_equal_work --workloads lab-tiny --batches 8 --repeats 1
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import time
from collections.abc import Callable

import gymnasium as gym
import torch

import envace_gym  # noqa: F401  (registers the environments)
from agents.engines.kv_cache import PrefixKVCache
from agents.engines.registry import HFEngine
from agents.engines.vllm_engine import VLLMEngine
from agents.models import LAB_MODEL, LAB_TINY_MODEL, default_store
from benchmarks.provenance import provenance

WORKLOADS = {
    "lab-tiny": ("lab", None, LAB_TINY_MODEL),
    "lab-smollm2": ("lab", None, LAB_MODEL),
    "bfcl": ("bfcl", ["simple_python"], "smollm2-135m"),
    "bfcl-multi-turn": ("bfcl", ["multi_turn_base"], "smollm2-135m"),
}


def prompts(suite: str, categories: list[str] | None, model: str, tasks: int) -> list[list[int]]:
    """The first ACT context of the first `tasks` tasks of the suite (split ``all``), rendered by the env."""
    env = gym.make("EnvACE-Tool-v0", suite=suite, categories=categories, model=model, split="all")
    unwrapped = env.unwrapped
    out = []
    for task in unwrapped.tasks[:tasks]:  # type: ignore[attr-defined]
        env.reset(seed=0, options={"task_id": task.id})
        out.append(list(unwrapped.trajectory.token_ids))  # type: ignore[attr-defined]
    env.close()
    if len(out) < tasks:
        raise ValueError(f"{suite} {categories} has {len(out)} tasks, {tasks} needed")
    return out


def timer(engine: HFEngine | VLLMEngine, contexts: list[list[int]], new: int) -> Callable[[int], float]:
    """``run(n)``: seconds of one call generating `n` tokens per row from empty caches (checked: exactly `n`)."""
    seeds = list(range(len(contexts)))

    def run(n: int) -> float:
        if isinstance(engine, HFEngine):
            engine.kv_cache = PrefixKVCache()
        else:
            engine.llm.reset_prefix_cache()
        t = time.perf_counter()
        gens = engine.generate(contexts, max_new_tokens=n, temperature=1.0, stop_ids=[], seeds=seeds)
        elapsed = time.perf_counter() - t
        if any(len(g.token_ids) != n for g in gens):
            raise RuntimeError(f"{type(engine).__name__} did not generate {n} tokens in every row")
        return elapsed

    return run


def measure(engines: dict[str, HFEngine | VLLMEngine], contexts: list[list[int]], new: int, repeats: int) -> dict:
    """Median ``t(new)`` and ``t(1)`` of each engine over `repeats` rounds after an untimed one, interleaved."""
    runs = {name: timer(engine, contexts, new) for name, engine in engines.items()}
    seen: dict[str, dict[str, list[float]]] = {name: {"full": [], "one": []} for name in engines}
    for r in range(repeats + 1):
        for name, run in runs.items():
            full, one = run(new), run(1)
            if r:
                seen[name]["full"].append(full)
                seen[name]["one"].append(one)
    out = {}
    for name, s in seen.items():
        full, one = statistics.median(s["full"]), statistics.median(s["one"])
        out[name] = {
            "tokens_per_s": len(contexts) * new / full,
            "ms_per_step": 1e3 * (full - one) / (new - 1),
            "call_s": full,
        }
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", nargs="+", default=["lab-tiny", "lab-smollm2", "bfcl"], choices=sorted(WORKLOADS))
    ap.add_argument("--batches", type=int, nargs="+", default=[8, 32, 128], help="rows per call (B)")
    ap.add_argument("--k", type=int, default=8, help="samples per task (rows sharing a prompt)")
    ap.add_argument("--new", type=int, default=64, help="tokens generated per row")
    ap.add_argument("--repeats", type=int, default=3, help="timed rounds (median)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (both engines)")
    ap.add_argument("--kv-cache-gib", type=float, default=4.0, help="vLLM's KV cache")
    ap.add_argument("--out", default=None, help="write results.json here (for python -m benchmarks.results)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    store = default_store()
    print(f"new {args.new} tokens per row, K = {args.k} rows per prompt, {args.threads} torch threads, fp32")
    head = (
        f"{'workload':<12} {'B':>4} {'prompt':>6} | {'HF tok/s':>9} {'HF ms/step':>10} | "
        f"{'vLLM tok/s':>10} {'vLLM ms/step':>12} | {'vLLM / HF':>9}"
    )
    print(head)
    print("-" * len(head))
    rows = []
    for workload in args.workloads:
        load_before = os.getloadavg()[0]
        print(f"load average {load_before:.2f} ({os.cpu_count()} CPUs)", flush=True)
        suite, categories, model_name = WORKLOADS[workload]
        model = store.model(model_name).eval()
        pad = store.tokenizer(model_name).pad_token_id or 0
        hf = HFEngine(model, pad)
        vllm = VLLMEngine(model, pad, kv_cache_gib=args.kv_cache_gib)
        if torch.get_num_threads() != args.threads:
            raise RuntimeError(f"torch threads changed to {torch.get_num_threads()} by the vLLM engine")
        groups = prompts(suite, categories, model_name, max(args.batches) // args.k)
        for b in args.batches:
            contexts = [c for c in groups[: max(1, b // args.k)] for _ in range(args.k)][:b]
            m = measure({"hf": hf, "vllm": vllm}, contexts, args.new, args.repeats)
            mean_prompt = statistics.mean(len(c) for c in contexts)
            row = dict(workload=workload, model=model_name, batch=b, prompt_tokens=mean_prompt, **m)
            rows.append(row | {"load_before": load_before, "load_after": os.getloadavg()[0]})
            print(
                f"{workload:<12} {b:>4} {mean_prompt:>6.0f} | {m['hf']['tokens_per_s']:>9.0f} "
                f"{m['hf']['ms_per_step']:>10.1f} | {m['vllm']['tokens_per_s']:>10.0f} "
                f"{m['vllm']['ms_per_step']:>12.1f} | {m['vllm']['tokens_per_s'] / m['hf']['tokens_per_s']:>8.2f}x",
                flush=True,
            )
        del hf, vllm, model
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    result = {
        "kind": "engines_equal_work",
        "command": ("python -m benchmarks.perf.engines_equal_work " + shlex.join(argv or [])).strip(),
        **provenance(),
        "settings": {k: v for k, v in vars(args).items() if k != "out"} | {"cpus": os.cpu_count()},
        "rows": rows,
    }
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {os.path.join(args.out, 'results.json')}")
    return result


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
