"""One decode step of the CPU engine against this machine's limits, measured side by side in one run.

For each batch size B (rows decoding together) and a context of ``--context`` tokens per row, it prints:

* **read bandwidth** of this machine, measured here: the best of several ``torch.sum`` passes over a
  ``--bandwidth-mb`` float32 tensor (far larger than the caches), with the same thread count;
* **bandwidth bound**: the bytes one step must read (every weight once, the tied LM head once, plus the K/V
  of the context every layer attends to, ``B × L × layers × 2 × kv_heads × head_dim × 4`` bytes) divided by
  that bandwidth: no decode step can be faster;
* **kernel floor**: the step's matrix products alone (every ``F.linear`` of a decoder layer, the LM head,
  and attention's two batched products over the context), at the shapes of the step, with the model's own
  weights, timed in a loop: what the BLAS this PyTorch uses can do for those shapes, with no other work
  (attention's products read each K/V head once, as grouped-query attention allows);
* **HF forward**: a plain Transformers decode step, ``model(input_ids, cache=cache, use_cache=True,
  logits_to_keep=1)`` with a `transformers.DynamicCache` and greedy ``argmax``;
* **ours**: a step of `agents.engines.generation.generate` (the engine every rollout uses): sampling with a seeded
  generator per row and the logprob of each sampled id, each step through `agents.engines.decode.decode_step`
  (the lean path, without the Transformers module stack). Its step time is
  ``(t(N + 1 new tokens) - t(1 new token)) / N``, so the prefill and the one-off set-up cancel (a primed
  prefix cache makes each prefill one token per row, as in a rollout's later turns); no row stops (no stop
  id), so every step decodes all B rows;
* **ours, model forward**: the same with ``fast_decode=False``, each step through the model's own forward.

The four are timed in interleaved rounds (floor, HF, ours, ..., floor, ...; this machine's speed drifts by tens
of percent over a minute), and each time is the median of ``--repeats`` rounds after an untimed one (the first
calls of a shape set up their kernels); each column prints ms per step, tokens/s
(``B / step``), ``× kernel floor`` and ``% of bandwidth bound`` (bound / step: 100% would be reading at the
measured bandwidth and doing nothing else).

Usage::

    HF_HUB_OFFLINE=1 .venv/bin/python -m benchmarks.perf.decode_step                    # SmolLM2-135M
    HF_HUB_OFFLINE=1 .venv/bin/python -m benchmarks.perf.decode_step --batches 8 --model smollm2-lab
    .venv/bin/python -m benchmarks.perf.decode_step --model tiny-random --batches 1 4   # quick check
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from agents.engines.generation import generate
from agents.engines.kv_cache import PrefixKVCache
from agents.models import default_store


def read_bandwidth(megabytes: int, passes: int = 5) -> float:
    """Bytes per second ``torch.sum`` reads from a ``megabytes`` float32 tensor: the best of `passes`."""
    x = torch.ones(megabytes * 2**20 // 4, dtype=torch.float32)
    float(x.sum())  # touch every page once
    best = float("inf")
    for _ in range(passes):
        t = time.perf_counter()
        float(x.sum())
        best = min(best, time.perf_counter() - t)
    return x.numel() * 4 / best


def step_bytes(model: torch.nn.Module, batch: int, context: int) -> int:
    """Bytes one decode step must read: every parameter once (a tied LM head counted once) plus the K and V
    of ``batch`` rows of ``context`` tokens in every layer."""
    params = {p.data_ptr(): p.numel() * p.element_size() for p in model.parameters()}
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    kv = batch * context * c.num_hidden_layers * 2 * c.num_key_value_heads * head_dim * 4
    return sum(params.values()) + kv


def kernel_floor(model: torch.nn.Module, batch: int, context: int) -> Callable[[], float]:
    """A timer of one step's matrix products alone: each decoder layer's linears in order and attention's
    ``q @ k^T`` and ``p @ v`` over ``context`` keys (each K/V head read once: the query heads that share it
    are its rows, grouped-query attention's minimal reads), then the LM head. Each call returns the seconds
    of one pass."""
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    heads = c.num_attention_heads
    layers = model.get_decoder().layers
    x = torch.randn(batch, 1, c.hidden_size)  # (B, 1, H)
    mlp_in = torch.randn(batch, 1, c.intermediate_size)  # (B, 1, I)
    kv_heads = c.num_key_value_heads
    q = torch.randn(batch, kv_heads, heads // kv_heads, head_dim)  # (B, kv_heads, groups, D)
    k = torch.randn(batch, kv_heads, context, head_dim)  # (B, kv_heads, L, D)
    v = torch.randn(batch, kv_heads, context, head_dim)  # (B, kv_heads, L, D)
    head = model.get_output_embeddings().weight

    @torch.no_grad()
    def one_pass() -> float:
        t = time.perf_counter()
        for layer in layers:
            a = layer.self_attn
            F.linear(x, a.q_proj.weight), F.linear(x, a.k_proj.weight), F.linear(x, a.v_proj.weight)
            p = torch.matmul(q, k.transpose(-1, -2))  # (B, kv_heads, groups, L)
            torch.matmul(p, v)  # (B, kv_heads, groups, D)
            F.linear(x, a.o_proj.weight)
            m = layer.mlp
            F.linear(x, m.gate_proj.weight), F.linear(x, m.up_proj.weight)
            F.linear(mlp_in, m.down_proj.weight)
        F.linear(x, head)
        return time.perf_counter() - t

    return one_pass


def hf_step(model: torch.nn.Module, contexts: torch.Tensor, steps: int) -> Callable[[], float]:
    """A timer of plain Transformers decode steps (DynamicCache, last-position logits, greedy argmax) after a
    prefill of ``contexts`` ``(B, L)``: each call returns the seconds per step of `steps` steps (the prefill
    is not timed)."""

    @torch.no_grad()
    def one_run() -> float:
        out = model(input_ids=contexts, cache=DynamicCache(), use_cache=True, logits_to_keep=1)
        next_ids = out.logits[:, -1].argmax(-1, keepdim=True)  # (B, 1)
        t = time.perf_counter()
        for _ in range(steps):
            out = model(input_ids=next_ids, cache=out.cache, use_cache=True, logits_to_keep=1)
            next_ids = out.logits[:, -1].argmax(-1, keepdim=True)  # (B, 1)
        return (time.perf_counter() - t) / steps

    return one_run


def our_step(
    model: torch.nn.Module, contexts: list[list[int]], steps: int, pad_id: int, fast_decode: bool = True
) -> Callable[[], float]:
    """A timer of `agents.engines.generation.generate` decode steps: each call returns
    ``(t(steps + 1 new tokens) - t(1 new token)) / steps``, temperature 1, no stop id. A `PrefixKVCache`
    primed with the contexts makes each call's prefill one token per row (as in a rollout's later turns), so
    the difference is not swamped by the variance of a full prefill."""
    cache = PrefixKVCache(max_tokens=10**7, max_idle_calls=2)  # the primed entry is refreshed by every lookup

    def run(new: int) -> float:
        t = time.perf_counter()
        generate(
            model,
            contexts,
            max_new_tokens=new,
            temperature=1.0,
            stop_ids=[],
            pad_id=pad_id,
            seeds=list(range(len(contexts))),
            kv_cache=cache,
            fast_decode=fast_decode,
        )
        return time.perf_counter() - t

    run(1)  # primes the cache

    def one_run() -> float:
        return (run(steps + 1) - run(1)) / steps

    return one_run


def interleaved_medians(timers: dict[str, Callable[[], float]], repeats: int, warmup: int = 1) -> dict[str, float]:
    """Median seconds of each timer over `repeats` rounds that call every timer once in turn (so a slower
    or faster stretch of the machine touches all of them), after `warmup` untimed rounds (the first calls
    of a shape set up its kernels)."""
    seen: dict[str, list[float]] = {k: [] for k in timers}
    for r in range(warmup + repeats):
        for name, timer in timers.items():
            t = timer()
            if r >= warmup:
                seen[name].append(t)
    return {k: statistics.median(v) for k, v in seen.items()}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m", help="a known model name or a local folder")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4, 8, 16, 32], help="rows decoding together")
    ap.add_argument("--context", type=int, default=256, help="tokens of context per row before the decode")
    ap.add_argument("--steps", type=int, default=32, help="decode steps per timed run")
    ap.add_argument("--repeats", type=int, default=5, help="timed rounds (median)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    ap.add_argument("--bandwidth-mb", type=int, default=1024, help="size of the bandwidth probe's tensor")
    ap.add_argument("--json", default=None, help="also write the rows to this file")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    store = default_store()
    model = store.model(args.model).eval()
    tokenizer = store.tokenizer(args.model)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    vocab = model.get_output_embeddings().weight.shape[0]
    bandwidth = read_bandwidth(args.bandwidth_mb)
    print(
        f"model {args.model}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, vocabulary "
        f"{vocab}; context {args.context} tokens per row; {args.threads} threads; read bandwidth "
        f"{bandwidth / 1e9:.1f} GB/s (torch.sum over {args.bandwidth_mb} MB)"
    )
    columns = {"hf": "HF forward", "ours_forward": "ours, model forward", "ours": "ours"}
    head = f"{'B':>3} | {'bound ms':>8} {'floor ms':>8} | " + " | ".join(
        f"{label + ' ms':>22} {'tok/s':>6} {'x floor':>7} {'% bound':>7}" for label in columns.values()
    )
    print(head)
    print("-" * len(head))
    rows = []
    for b in args.batches:
        ids = torch.randint(0, vocab, (b, args.context))  # (B, L)
        bound = step_bytes(model, b, args.context) / bandwidth
        medians = interleaved_medians(
            {
                "floor": kernel_floor(model, b, args.context),
                "hf": hf_step(model, ids, args.steps),
                "ours_forward": our_step(model, ids.tolist(), args.steps, pad_id, fast_decode=False),
                "ours": our_step(model, ids.tolist(), args.steps, pad_id),
            },
            args.repeats,
        )
        floor = medians["floor"]
        row = dict(
            batch=b, bound_s=bound, floor_s=floor, bandwidth_Bps=bandwidth, **{f"{k}_s": medians[k] for k in columns}
        )
        rows.append(row)
        print(
            f"{b:>3} | {bound * 1e3:>8.1f} {floor * 1e3:>8.1f} | "
            + " | ".join(
                (
                    f"{medians[k] * 1e3:>22.1f} {b / medians[k]:>6.0f} {medians[k] / floor:>7.2f} "
                    f"{100 * bound / medians[k]:>6.0f}%"
                )
                for k in columns
            ),
            flush=True,
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return {"rows": rows}


if __name__ == "__main__":
    main()
