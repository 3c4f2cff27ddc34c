"""Peak memory and time of one forward+backward of selected-token logprobs: full logits vs chunked.

Each variant runs in a fresh Python subprocess so its peak RSS (``getrusage(RUSAGE_SELF).ru_maxrss``,
read inside the child) is its own. The child loads the model (``load_model(name, shared=False)``, put in
``train()`` mode, which for Llama changes no numbers but lets gradient checkpointing act), records its RSS
after loading (``VmRSS``), builds ``rows × tokens`` random ids from a fixed seed (full attention mask),
runs ``logprobs.sum()`` forward and backward once, and prints one JSON line. The parent prints a table:
peak RSS, peak increment over the post-load RSS, step time, the loss (the same sum in every variant, as a
check that all compute the same thing) and the ratios naive/variant (naive: the ``naive`` row, which runs
under the same allocator setting as ``chunked-gc``; else the first naive row).

Caveat: the safetensors weights are memory-mapped and only become resident when first read, so the
post-load RSS (about 0.45 GB for SmolLM2) does not yet hold all of them and each increment includes
about 0.5 GB of weights paged in by the first forward, in every variant alike.

Variants:
    naive       `agents.training.logprobs.naive_token_logprobs`: full ``(N, T, V)`` logits and log-softmax.
    naive-gc    the same with `enable_gradient_checkpointing` (decoder layers recomputed in backward).
    chunked     `agents.training.logprobs.token_logprobs` with ``--chunk-size``.
    chunked-gc  chunked plus `enable_gradient_checkpointing`: what `envace train` and `envace sft` run.

Allocator: every child first fixes glibc's mmap threshold at ``--malloc-mmap-threshold-kb`` (default 128,
the trainers' default ``memory.malloc_mmap_threshold_kb``; see `agents.training.allocator`), so freed activations leave
the RSS. A variant name with the suffix ``/glibc`` (e.g. ``chunked-gc/glibc``) keeps glibc's dynamic
threshold instead, to show what the allocator setting alone is worth.

Example:
    .venv/bin/python -m benchmarks.perf.logprob_memory --model smollm2-135m --rows 8 --tokens 512 --chunk-size 512
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

VARIANTS = ("naive", "naive-gc", "chunked", "chunked-gc")
GLIBC_SUFFIX = "/glibc"
DEFAULT_VARIANTS = "naive/glibc,naive,chunked-gc/glibc,chunked-gc"


def _rss_now_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _child(args: argparse.Namespace) -> dict:
    """Run one variant in this process and return its measurements."""
    import gc

    import torch

    from agents.models import load_model, tiny_random_model
    from agents.training.allocator import set_malloc_mmap_threshold
    from agents.training.logprobs import enable_gradient_checkpointing, naive_token_logprobs, token_logprobs

    torch.set_num_threads(args.threads)
    if args.malloc_mmap_threshold_kb and not args.variant.endswith(GLIBC_SUFFIX):
        set_malloc_mmap_threshold(args.malloc_mmap_threshold_kb * 1024)
    kind = args.variant.removesuffix(GLIBC_SUFFIX)
    if args.model == "tiny-random":
        model = tiny_random_model()
    else:
        model = load_model(args.model, shared=False)
    model.train()
    if kind.endswith("-gc"):
        enable_gradient_checkpointing(model)
    vocab = model.get_output_embeddings().weight.shape[0]
    g = torch.Generator().manual_seed(args.seed)
    input_ids = torch.randint(0, vocab, (args.rows, args.tokens), generator=g)  # (N, T)
    attention_mask = torch.ones_like(input_ids)  # (N, T)
    gc.collect()
    rss_after_load = _rss_now_bytes()
    peak_after_load = _peak_rss_bytes()

    start = time.perf_counter()
    if kind.startswith("naive"):
        logprobs = naive_token_logprobs(model, input_ids, attention_mask)  # (N, T)
    else:
        logprobs = token_logprobs(model, input_ids, attention_mask, chunk_size=args.chunk_size)  # (N, T)
    loss = logprobs.sum()
    loss.backward()
    step_s = time.perf_counter() - start
    grad_norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters() if p.grad is not None))
    peak = _peak_rss_bytes()
    return {
        "variant": args.variant,
        "peak_rss": peak,
        "rss_after_load": rss_after_load,
        "peak_after_load": peak_after_load,
        "increment": peak - rss_after_load,
        "step_s": step_s,
        "loss": float(loss),
        "grad_norm": float(grad_norm),
    }


def _run_variant(args: argparse.Namespace, variant: str) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.perf.logprob_memory",
        "--child",
        "--variant",
        variant,
        "--model",
        args.model,
        "--rows",
        str(args.rows),
        "--tokens",
        str(args.tokens),
        "--chunk-size",
        str(args.chunk_size),
        "--threads",
        str(args.threads),
        "--seed",
        str(args.seed),
        "--malloc-mmap-threshold-kb",
        str(args.malloc_mmap_threshold_kb),
    ]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), HF_HUB_OFFLINE="1")
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        # A killed child (e.g. out of memory: -9) is reported, not raised, so the other rows still print.
        tail = proc.stderr.strip().splitlines()[-3:]
        return {"variant": variant, "error": f"exit {proc.returncode}: {' | '.join(tail)}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _print_table(args: argparse.Namespace, results: list[dict]) -> None:
    gb = 1e9
    print(
        f"model={args.model} rows={args.rows} tokens={args.tokens} chunk_size={args.chunk_size} "
        f"threads={args.threads} seed={args.seed} malloc_mmap_threshold_kb={args.malloc_mmap_threshold_kb} "
        f"(variants ending in {GLIBC_SUFFIX}: glibc's dynamic threshold)"
    )
    # Reference: `naive` (the same allocator setting as ours), else the first naive-kind row that ran.
    ok = [r for r in results if "error" not in r]
    naive = next((r for r in ok if r["variant"] == "naive"), None) or next(
        (r for r in ok if r["variant"].startswith("naive")), None
    )
    if naive is not None:
        print(f"ratios x/y: y = {naive['variant']}")
    header = (
        f"{'variant':<16} {'peak RSS GB':>11} {'after load GB':>13} {'increment GB':>12} {'step s':>8} "
        f"{'loss':>14} {'grad norm':>11} {'peak naive/x':>12} {'incr naive/x':>12} {'time naive/x':>12}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        if "error" in r:
            print(f"{r['variant']:<16} FAILED ({r['error']})")
            continue
        ratios = ("", "", "")
        if naive is not None:
            ratios = (
                f"{naive['peak_rss'] / r['peak_rss']:.2f}x",
                f"{naive['increment'] / max(r['increment'], 1):.2f}x",
                f"{naive['step_s'] / r['step_s']:.2f}x",
            )
        print(
            f"{r['variant']:<16} {r['peak_rss'] / gb:>11.2f} {r['rss_after_load'] / gb:>13.2f} "
            f"{r['increment'] / gb:>12.2f} {r['step_s']:>8.2f} {r['loss']:>14.2f} {r['grad_norm']:>11.4g} "
            f"{ratios[0]:>12} {ratios[1]:>12} {ratios[2]:>12}"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", choices=["smollm2-135m", "tiny-random"])
    parser.add_argument("--rows", type=int, default=8, help="batch rows N")
    parser.add_argument("--tokens", type=int, default=512, help="tokens per row T")
    parser.add_argument("--chunk-size", type=int, default=512, help="positions per LM-head chunk (chunked variants)")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads in each child")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random token ids")
    parser.add_argument(
        "--variants", default=DEFAULT_VARIANTS, help=f"comma-separated subset of {','.join(VARIANTS)}, run in order"
    )
    parser.add_argument(
        "--malloc-mmap-threshold-kb",
        type=int,
        default=128,
        help="glibc mmap threshold every child fixes (0: glibc's dynamic default); see agents.training.allocator",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--variant", choices=VARIANTS + tuple(v + GLIBC_SUFFIX for v in VARIANTS), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args)))
        return
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(v for v in variants if v.removesuffix(GLIBC_SUFFIX) not in VARIANTS)
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {VARIANTS}, each optionally with {GLIBC_SUFFIX}")
    results = []
    for v in variants:
        results.append(_run_variant(args, v))
        print(f"# {v}: done", file=sys.stderr, flush=True)
    _print_table(args, results)


if __name__ == "__main__":
    main()
