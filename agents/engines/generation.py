"""Batched sampling with per-token logprobs, for both roles (ACT and REHEARSE).

One call serves a batch of token contexts of different lengths (left padding with explicit position ids),
decodes with the model's KV cache, computes logits for the last position only (``logits_to_keep=1``: a
full-vocabulary logit tensor over a 6k-token BFCL prompt would take gigabytes), samples each row with its
own seeded `torch.Generator` (so a rollout is reproducible from its seeds whatever the batch), stops a row
on any end-of-message id, and records each sampled token's logprob from the same logits it was sampled from.

Recorded logprobs are ``log_softmax(logits / temperature)`` at the sampled id (temperature 0: greedy, and
the logprob of ``log_softmax(logits)``), which is what the trainer's recomputation uses (same temperature).

With a `agents.engines.kv_cache.PrefixKVCache` (the inline-mode default of `agents.policy.Policy`), each row reuses
the keys/values of its longest cached prefix and the model processes only the new tokens; the layout is in
`generate`'s docstring; prompt prefixes that several rows of one call share (BFCL tasks with the same
tools) are prefilled once. The decode loop does only step-dependent work: the KV buffers are reserved for
every new column once (no concatenation per token), the output buffers are allocated once, ids and
logprobs are copied to Python lists once at the end; finished rows leave the batch once enough of them have
finished (`COMPACT_FRACTION`: the KV buffers and the mask are then copied once, smaller); with the lean decode
(`agents.engines.decode.decode_step`) the rows are ordered by width and each step's attention skips the left
padding that a segment of rows shares (`attention_segments`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.modeling_outputs import CausalLMOutputWithPast

from agents.engines.decode import decode_step, supports_decode_step
from agents.engines.kv_cache import KVEntry, PrefixKVCache, common_prefix_length

if TYPE_CHECKING:
    from transformers import PreTrainedConfig

__all__ = ["Generation", "attention_segments", "generate"]

# The name of a causal LM's KV-cache argument and output field: ``cache`` from Transformers 5.24 on,
# ``past_key_values`` before. Both are supported: vLLM's CPU wheel pins transformers<5.20, and the HF engine runs
# beside it in that environment (the engines' parity tests compare the two).
_CACHE = "cache" if "cache" in {f.name for f in fields(CausalLMOutputWithPast)} else "past_key_values"


@dataclass
class Generation:
    """One sampled continuation.

    Attributes:
        token_ids: the generated ids `(C,)`, including the stop id when generation stopped on one.
        logprobs: the logprob of each generated id under the sampling distribution `(C,)`.
        stopped: True when the row ended on a stop id, False when it hit ``max_new_tokens``.
    """

    token_ids: list[int]
    logprobs: list[float]
    stopped: bool


@torch.no_grad()
def generate(
    model: torch.nn.Module,
    contexts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    temperature: float,
    stop_ids: Sequence[int],
    pad_id: int,
    seeds: Sequence[int | None] | None = None,
    kv_cache: PrefixKVCache | None = None,
    fast_decode: bool = True,
) -> list[Generation]:
    """Sample a continuation of every context in one batched decode.

    Without `kv_cache` every context is encoded in full. With it, each row's longest cached prefix
    (`PrefixKVCache.lookup`, exact id match) is reused and only the suffix is prefilled; identical
    (context, prefix) rows are prefilled once and their KV copied (the K samples of a group); a prefix of
    at least ``kv_cache.min_shared_prefix`` tokens that several distinct rows share is prefilled once and
    stored first, so each of them feeds only its own suffix; afterwards each row's processed ids
    (context + generated ids but the last) and KV are stored for its next call.

    KV layout (U unique rows, W = the longest context, N = ``max_new_tokens``): one buffer per layer
    ``(U, H_kv, W + N - 1, D)``; row u's context of length L_u fills columns ``[W - L_u, W)`` (masked columns
    to its left: left padding), the decode writes column ``W + t - 1`` at step t. The reused prefix is
    copied in, the model writes the rest (`_prefill`); rows of different shapes go through a few padded,
    masked forwards when short (`PADDED_PREFILL_MAX_WIDTH`; rows of similar suffix lengths together), else one
    at a time over their own slice of the buffers, without a mask. Finished rows leave the decode's batch
    (`COMPACT_FRACTION`); with the lean decode the batch's rows are ordered by context length, so that each
    step's attention can skip the padding a segment of rows shares (`attention_segments`; a reorder of unique rows
    costs a copy of their KV, made only when it pays). During the decode ``attention_mask`` ``(B, W + t)`` marks
    the real columns and ``position_ids`` continue each row's true length, so a row's logits do not depend on the
    batch it is in (up to float rounding).

    Args:
        model: a Transformers causal LM (accepts ``attention_mask``, ``position_ids``, ``cache``,
            ``logits_to_keep``; returns ``out.cache``, a `transformers.DynamicCache`; before Transformers 5.24
            ``past_key_values`` in and out).
        contexts: B token-id lists, each non-empty, of any lengths.
        max_new_tokens: cap on generated tokens per row (>= 1).
        temperature: > 0 samples from ``softmax(logits / temperature)``; 0 is greedy.
        stop_ids: ids that end a row (the template's end-of-message ids); the stop id is kept.
        pad_id: id used for left padding (masked out).
        seeds: one seed per row (None: unseeded); same seed and context give the same sample.
        kv_cache: the prefix cache to read and extend (None: no caching, full re-encoding).
        fast_decode: run each decode step through `agents.engines.decode.decode_step` where the model supports it
            (`agents.engines.decode.supports_decode_step`; the same numbers without the Transformers module stack);
            False runs the model's own forward at every step.

    Returns:
        B `Generation`s in input order.

    Raises:
        ValueError: an empty context, ``max_new_tokens < 1``, negative temperature, or len(seeds) != B.
    """
    if not contexts:
        return []
    if any(len(c) == 0 for c in contexts):
        raise ValueError("every context needs at least one token")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    batch = len(contexts)
    seeds = list(seeds) if seeds is not None else [None] * batch
    if len(seeds) != batch:
        raise ValueError(f"{len(seeds)} seeds for {batch} contexts")
    generators = []
    for s in seeds:
        g = torch.Generator()
        g.manual_seed(int(s) if s is not None else int(torch.randint(0, 2**31 - 1, ()).item()))
        generators.append(g)
    stop = torch.tensor(sorted(set(stop_ids)), dtype=torch.long)
    device = next(model.parameters()).device
    contexts = [list(c) for c in contexts]

    # Prefix lookup and de-duplication of identical rows (the K samples of a group share the prompt).
    sources: list[KVEntry | None] = [None] * batch
    reused = [0] * batch
    if kv_cache is not None:
        kv_cache.sync(model)
        kv_cache.begin_call()
        _prefill_shared_prefixes(model, contexts, kv_cache, device)
        for i, ctx in enumerate(contexts):
            sources[i], reused[i] = kv_cache.lookup(ctx)
    uniq: dict[tuple, int] = {}
    row_to_uniq = [uniq.setdefault((tuple(c), id(sources[i]), reused[i]), len(uniq)) for i, c in enumerate(contexts)]
    first_row = {u: i for i, u in reversed(list(enumerate(row_to_uniq)))}
    # unique rows in order of suffix length, so that `_padded_prefill`'s buckets of consecutive rows hold
    # similar suffixes; the decode maps batch positions back to rows (`rows`)
    order = sorted(range(len(uniq)), key=lambda u: len(contexts[first_row[u]]) - reused[first_row[u]])
    rank = {u: r for r, u in enumerate(order)}
    row_to_uniq = [rank[u] for u in row_to_uniq]
    rows_u = [first_row[u] for u in order]
    p_u = [reused[i] for i in rows_u]
    s_u = [len(contexts[i]) - reused[i] for i in rows_u]

    lean = fast_decode and supports_decode_step(model)
    logits, cache, prefill_mask, position_ids, width0 = _prefill(
        model, [contexts[i] for i in rows_u], [sources[i] for i in rows_u], p_u, max_new_tokens - 1, device
    )
    if kv_cache is not None:
        kv_cache.stats["fed_tokens"] += sum(s_u)
        kv_cache.stats["hits"] += sum(1 for r in reused if r > 0)
        kv_cache.stats["reused_tokens"] += sum(reused)
    expand = len(rows_u) < batch
    # with the lean decode, the batch's rows by their first real column (the widest context first), so that
    # `attention_segments` can cut it into segments of similar widths; rows keep that order when finished ones leave
    # (reordering unique rows costs a copy of their KV, which an expansion makes anyway: without one, only when
    # the padding it skips over the decode is worth twice that copy)
    natural = list(range(batch)) if expand else rows_u
    rows_b = natural
    segments: list[tuple[int, int, int]] | None = None  # None: the batch is not in that order, one attention
    if lean:
        by_width = sorted(natural, key=lambda r: -len(contexts[r]))
        lead = np.asarray([width0 - len(contexts[r]) for r in by_width])  # (B,) first real column per position
        cuts = attention_segments(lead, width0)
        saved = batch * (width0 - int(lead[0])) - sum((b - a) * (width0 - c) for a, b, c in cuts)  # cells/step
        copy = batch * (width0 + max_new_tokens - 1)  # cells of the reorder's copy of the buffers
        if by_width != natural and (saved > 0 if expand else saved * max_new_tokens > 2 * copy):
            rows_b = by_width
        if rows_b == by_width:  # (a stable sort: also when the natural order already was this one)
            segments = cuts
    reorder = rows_b is not natural
    if expand or reorder:  # the unique rows expanded back to the B rows, in batch order
        if expand:
            index = torch.tensor([row_to_uniq[r] for r in rows_b], dtype=torch.long)  # (B,)
        else:
            position_of = {r: j for j, r in enumerate(rows_u)}
            index = torch.tensor([position_of[r] for r in rows_b], dtype=torch.long)  # (B,)
        for layer in _reserved_layers(cache):
            layer.select_rows(index.to(device))
        logits = logits.index_select(0, index)  # (B, V)
        prefill_mask = prefill_mask.index_select(0, index)  # (B, W)
        position_ids = position_ids.index_select(0, index)  # (B, 1)

    # Decode loop state (the KV buffers already have a column for every new id): the full attention mask, output
    # buffers, allocated once (the mask and the KV buffers shrink when finished rows leave the batch). The output
    # buffers are indexed by row; the loop state by position in the current batch, whose rows `rows` lists.
    attention_mask = torch.ones((batch, width0 + max_new_tokens), dtype=torch.long)  # (B, W+N)
    attention_mask[:, :width0] = prefill_mask
    attention_mask = attention_mask.to(device)
    next_pos = position_ids[:, -1:].to(device) + 1  # (B, 1)
    sampled = torch.full((batch, max_new_tokens), pad_id, dtype=torch.long)  # (B, N)
    sampled_lp = torch.zeros((batch, max_new_tokens), dtype=torch.float32)  # (B, N)
    lengths = torch.zeros(batch, dtype=torch.long)  # (B,) tokens generated per row
    finished = torch.zeros(batch, dtype=torch.bool)  # (B,)
    stopped = torch.zeros(batch, dtype=torch.bool)  # (B,)
    rows = torch.tensor(rows_b)  # (B_c,) the row at each batch position
    offset = 0  # leading columns dropped from the buffers, mask and `rows`' layout
    first_column = torch.tensor(
        [width0 - len(c) for c in contexts], dtype=torch.long
    )  # (B,) each row's first real column
    kv_of_row: list[tuple[list[tuple[torch.Tensor, torch.Tensor]], int, int] | None] = [None] * batch
    steps = 0
    next_ids = torch.empty(0, dtype=torch.long)  # the ids sampled at step t - 1: set at t == 0, read from t == 1 on
    for t in range(max_new_tokens):
        n_rows = rows.numel()
        if t > 0:
            ids, mask = (
                next_ids.view(n_rows, 1).to(device),
                attention_mask[:, : width0 - offset + t],
            )  # (B_c, 1), (B_c, W+t)
            if lean:
                logits = decode_step(model, ids, mask, next_pos, cache, segments).float()  # (B_c, V)
            else:
                out = model(
                    input_ids=ids,
                    attention_mask=mask,
                    position_ids=next_pos,
                    use_cache=True,
                    **{_CACHE: cache},
                    logits_to_keep=1,
                )
                cache = getattr(out, _CACHE)
                logits = out.logits[:, -1, :].float()  # (B_c, V)
            next_pos = next_pos + 1
        scaled = (logits / temperature if temperature not in (0.0, 1.0) else logits).cpu()  # (B_c, V)
        # log_softmax at the chosen id only: x_id - max - log(sum exp(x - max)), the same formula as
        # torch.log_softmax; the unnormalised exp(x - max) doubles as the sampling CDF (two vocab passes).
        row_max = scaled.amax(dim=-1, keepdim=True)  # (B_c, 1)
        cdf = (scaled - row_max).exp_().cumsum_(dim=-1)  # (B_c, V) unnormalised
        total = cdf[:, -1:]  # (B_c, 1)
        if temperature > 0:
            # Inverse-CDF sampling, batched: one uniform per row from that row's own generator keeps every
            # row reproducible from its seed whatever the batch it is in.
            u = torch.stack([torch.rand((), generator=generators[r]) for r in rows.tolist()])  # (B_c,)
            next_ids = torch.searchsorted(cdf, u.unsqueeze(-1) * total).squeeze(-1)  # (B_c,)
            next_ids = next_ids.clamp_(max=logits.shape[-1] - 1)
        else:
            next_ids = scaled.argmax(dim=-1)  # (B_c,)
        live = ~finished[rows]  # (B_c,)
        next_ids = torch.where(live, next_ids, torch.full_like(next_ids, pad_id))  # (B_c,)
        sampled[rows, t] = next_ids
        chosen = scaled.gather(-1, next_ids.view(n_rows, 1))  # (B_c, 1)
        sampled_lp[rows, t] = (chosen - row_max - total.log()).squeeze(-1)
        lengths[rows] += live.long()
        is_stop = torch.isin(next_ids, stop) & live  # (B_c,)
        stopped[rows] |= is_stop
        finished[rows] |= is_stop
        live &= ~is_stop
        steps = t + 1
        n_live = int(live.sum())
        if n_live == 0:
            break
        if t + 1 < max_new_tokens and n_live < n_rows and n_live <= COMPACT_FRACTION * n_rows:
            # Finished rows leave the batch: each later step then costs the live rows only. A row's KV is
            # complete when it finishes (its last sampled id is never fed), so its place in these buffers is all
            # `_store_entries` needs.
            keep = live.nonzero().squeeze(1)  # (B_c',) positions in the current batch
            if kv_cache is not None:
                # the leaving rows' KV stays where it is: `select_rows` copies the kept rows into new buffers and
                # never writes these again, and `_store_entries` clones what it keeps (no copy of them here; the
                # old buffers, free columns included, stay alive until this call ends: at most about twice the
                # first buffer, since each compaction at least halves the batch)
                layers = _cache_layers(cache)
                for position in (~live).nonzero().squeeze(1).tolist():
                    kv_of_row[int(rows[position])] = (layers, position, offset)
            rows = rows[keep]
            drop = int(first_column[rows].min()) - offset  # columns left of every kept row's context
            for layer in _reserved_layers(cache):
                layer.select_rows(keep.to(device), drop)
            attention_mask = attention_mask.index_select(0, keep.to(device))[:, drop:]
            next_pos = next_pos.index_select(0, keep.to(device))
            next_ids = next_ids.index_select(0, keep)
            offset += drop
            if segments is not None:  # the kept rows keep their order
                segments = attention_segments((first_column[rows] - offset).numpy(), width0 - offset)

    lens = lengths.tolist()
    ids_all, lps_all = sampled[:, :steps].tolist(), sampled_lp[:, :steps].tolist()
    gens = [Generation(ids_all[i][: lens[i]], lps_all[i][: lens[i]], bool(stopped[i])) for i in range(batch)]
    if kv_cache is not None:
        layers = _cache_layers(cache)
        for position, r in enumerate(rows.tolist()):
            kv_of_row[r] = (layers, position, offset)
        # Row i's fed columns are contiguous: its context in [W - len(context_i), W) (left padding) and its
        # first len_i - 1 generated ids after W (the last sampled id was never fed back).
        kv_cache.stats["fed_tokens"] += sum(max(n - 1, 0) for n in lens)
        _store_entries(kv_cache, cast(Any, kv_of_row), contexts, gens, sources, reused, row_to_uniq, width0)
    return gens


SEGMENT_CALL_CELLS = 256
"""What one more attention call of a decode step costs, in KV cells read (a cell: one row's key and value at one
column): `attention_segments` cuts the batch into another segment only where that skips more padding than this."""


def attention_segments(first_columns: np.ndarray, width: int) -> list[tuple[int, int, int]]:
    """Cut a decode batch into segments whose attention skips their common left padding.

    A decode step's attention reads every row's KV over all the batch's columns, its left padding included
    (masked, yet read); in a rollout's later calls contexts differ by hundreds of tokens, so about a third of
    what a step reads is padding. With the rows ordered by first real column (ascending: the widest context
    first), segment ``(a, b, c)`` attends rows ``a..b-1`` over columns ``c..`` only, ``c`` the first real column of
    row ``a``, the widest of them. Minimises ``sum((b - a) * (width - c)) + SEGMENT_CALL_CELLS`` per segment
    (dynamic programming, O(B^2); `_suffix_buckets`' method).

    Args:
        first_columns: ``(B,)`` int, each batch position's first real column, non-decreasing.
        width: the columns of the cache (every row's context ends before it).

    Returns:
        ``[(a, b, c), ...]`` covering positions ``0..B-1`` in order; one segment ``(0, B, 0)``-like when cutting
        saves nothing (its ``c`` is still row 0's first column).

    Raises:
        ValueError: ``first_columns`` not non-decreasing (a segment's column would cut a later row's context).
    """
    f = np.asarray(first_columns, dtype=np.int64)  # (B,)
    if len(f) and (np.diff(f) < 0).any():
        raise ValueError("attention_segments needs the rows ordered by first column (non-decreasing)")
    n = len(f)
    best = np.zeros(n + 1, dtype=np.int64)  # best[b]: the cheapest cut of positions [0, b)
    cut = [0] * (n + 1)
    for end in range(1, n + 1):
        cost = best[:end] + (end - np.arange(end)) * (width - f[:end]) + SEGMENT_CALL_CELLS
        cut[end] = int(cost.argmin())
        best[end] = cost[cut[end]]
    segments, end = [], n
    while end > 0:
        segments.append((cut[end], end, int(f[cut[end]])))
        end = cut[end]
    return segments[::-1]


COMPACT_FRACTION = 0.5
"""The decode drops finished rows from its batch (KV buffers, mask, positions) once the live rows are at most
this fraction of the batch: a step's attention reads every row's KV, and in a rollout most rows stop after a few
tokens while a few run to ``max_new_tokens``. Dropping copies the live rows' KV once, so it waits until enough
rows have finished to pay for itself. Leading columns that no live row uses are dropped with them."""


def _store_entries(
    kv_cache: PrefixKVCache,
    kv_of_row: Sequence[tuple[Sequence[tuple[torch.Tensor, torch.Tensor]], int, int]],
    contexts: Sequence[Sequence[int]],
    gens: Sequence[Generation],
    sources: Sequence[KVEntry | None],
    reused: Sequence[int],
    row_to_uniq: Sequence[int],
    width0: int,
) -> None:
    """Store each row's processed ids (its context and all its generated ids but the last) in `kv_cache`.

    Row i's KV is at ``kv_of_row[i] = (layers, position, offset)``: row ``position`` of ``layers`` (per layer
    ``(R, H_kv, C, D)``: the decode's batch when row i left it, or the last batch; their filled
    columns), whose column c is the layout's column ``c + offset``. In that layout a row's fed columns are
    contiguous: its context in ``[W - len(context_i), W)`` (left padding) and its generated ids after ``W``.
    With ``kv_cache.share_prefixes`` an entry stores only the KV its parent does not hold: a row links to the
    entry it continued (or, when it alone continued all of that entry, which it then replaces, to that
    entry's parent), and rows of identical contexts (a group's K copies of a prompt) share one entry of the
    context, each keeping only its generation. Otherwise every row's entry is whole, and an entry a row
    continued in full is replaced.
    """

    def columns(i: int, start: int, end: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        layers, p, offset = kv_of_row[i]
        start, end = start - offset, end - offset
        return (
            [k[p : p + 1, :, start:end].clone() for k, _ in layers],  # each (1, H_kv, end - start, D)
            [v[p : p + 1, :, start:end].clone() for _, v in layers],
        )

    lens = [len(g.token_ids) for g in gens]
    if not kv_cache.share_prefixes:
        entries = []
        for i, ctx in enumerate(contexts):
            keys, values = columns(i, width0 - len(ctx), width0 + max(lens[i] - 1, 0))
            entries.append(KVEntry(np.asarray(list(ctx) + gens[i].token_ids[:-1], dtype=np.int64), keys, values))
        kv_cache.store(
            entries, [s if s is not None and reused[i] == s.num_tokens else None for i, s in enumerate(sources)]
        )
        return
    users: dict[int, set[int]] = {}  # id(source) -> the distinct contexts that continue it
    for i, src in enumerate(sources):
        if src is not None and reused[i] > 0:
            users.setdefault(id(src), set()).add(row_to_uniq[i])
    replaced = {
        id(src): src
        for i, src in enumerate(sources)
        if kv_cache.replace and src is not None and reused[i] == src.num_tokens and len(users[id(src)]) == 1
    }
    rows_of: dict[int, list[int]] = {}
    for i, u in enumerate(row_to_uniq):
        rows_of.setdefault(u, []).append(i)
    entries = []
    for rows in rows_of.values():
        i0 = rows[0]
        src, n = sources[i0], reused[i0]
        parent, shared = (
            (None, 0)
            if src is None or n == 0
            else ((src.parent, src.prefix_tokens) if id(src) in replaced else (src, n))
        )
        context = list(contexts[i0])
        first = width0 - len(context)
        if len(rows) > 1:  # identical contexts: their KV once, each row's entry its generation only
            keys, values = columns(i0, first + shared, width0)
            shared_context = KVEntry(
                np.asarray(context, dtype=np.int64), keys, values, parent=parent, prefix_tokens=shared
            )
            entries.append(shared_context)
            parent, shared = shared_context, len(context)
        for i in rows:
            if len(rows) > 1 and lens[i] <= 1:
                continue  # nothing of its own beyond the shared context
            keys, values = columns(i, first + shared, width0 + max(lens[i] - 1, 0))
            entries.append(
                KVEntry(
                    np.asarray(context + gens[i].token_ids[:-1], dtype=np.int64),
                    keys,
                    values,
                    parent=parent,
                    prefix_tokens=shared,
                )
            )
    kv_cache.store(entries, list(replaced.values()))


def _prefill_shared_prefixes(
    model: torch.nn.Module, contexts: Sequence[Sequence[int]], kv_cache: PrefixKVCache, device: torch.device
) -> None:
    """Prefill once each prefix that several of ``contexts`` share and store it in ``kv_cache``.

    A row's shared length is its longest common prefix with any other distinct context of the call (the
    maximum over its neighbours in sorted order), capped at ``len - 1`` (the last id is always fed). When
    that is at least ``kv_cache.min_shared_prefix`` tokens longer than what the cache already gives the
    row, the prefix is prefilled (shortest first, each reusing the cache) and stored as an entry, which
    the rows' own lookups then find. Identical contexts are not "shared" here: `generate` de-duplicates
    them anyway.
    """
    uniq = sorted({tuple(c) for c in contexts})
    if len(uniq) < 2:
        return
    arrays = [np.asarray(c, dtype=np.int64) for c in uniq]
    neighbour = [common_prefix_length(arrays[i], arrays[i + 1]) for i in range(len(arrays) - 1)]
    prefixes: set[tuple[int, ...]] = set()
    for i, ctx in enumerate(uniq):
        shared = max(neighbour[i - 1] if i > 0 else 0, neighbour[i] if i < len(neighbour) else 0)
        shared = min(shared, len(ctx) - 1)
        if shared < kv_cache.min_shared_prefix:
            continue
        _, hit = kv_cache.lookup(ctx)
        if shared - hit >= kv_cache.min_shared_prefix:
            prefixes.add(ctx[:shared])
    for prefix in sorted(prefixes, key=len):
        src, p = kv_cache.lookup(prefix)  # p <= len(prefix) - 1: at least one id is fed
        _, cache, _, _, _ = _prefill(model, [prefix], [src], [p], 0, device)
        kv_cache.stats["fed_tokens"] += len(prefix) - p
        kv_cache.stats["shared_prefixes"] += 1
        parent, shared = (None, 0) if src is None or p == 0 or not kv_cache.share_prefixes else (src, p)
        # extra=0: each layer's buffer is exactly the prefix; the part a parent holds is sliced off (a copy)
        layers = _reserved_layers(cache)
        keys = [layer.keys if shared == 0 else layer.keys[:, :, shared:].clone() for layer in layers]
        values = [layer.values if shared == 0 else layer.values[:, :, shared:].clone() for layer in layers]
        kv_cache.store([KVEntry(np.asarray(prefix, dtype=np.int64), keys, values, parent=parent, prefix_tokens=shared)])


def _prefill(
    model: torch.nn.Module,
    contexts: Sequence[Sequence[int]],
    sources: Sequence[KVEntry | None],
    reused: Sequence[int],
    extra: int,
    device: torch.device,
) -> tuple[torch.Tensor, DynamicCache, torch.Tensor, torch.Tensor, int]:
    """Prefill U rows into ONE left-padded KV buffer per layer, with ``extra`` free columns for the decode.

    Row u occupies columns ``[W - len_u, W)`` of buffers ``(U, H_kv, W + extra, D)`` (W = the longest
    context): its first ``reused[u]`` columns are copied from ``sources[u]``, the model writes the rest in
    place (`_ReservedLayer`). Rows of equal lengths and equal reuse go through the model in one batched
    forward. Otherwise, short rows (the longest context within `PADDED_PREFILL_MAX_WIDTH`) go through a
    few padded forwards with an attention mask, one per bucket of similar suffixes (`_padded_prefill`), and
    long rows run alone over their own view of the buffers, without padding and hence without a mask: a
    mask sends CPU attention to its masked math path, which costs more than per-call overhead at long
    contexts (measured: 8 BFCL-length rows 1.9 s padded vs 0.6 s one at a time, tiny model) and less at
    short ones (128 EnvACE-Lab rows of lab-tiny: a few padded forwards instead of up to 128).

    Returns:
        ``(logits (U, V) float32, cache, prefill_mask (U, W) int64, position_ids (U, 1), W)``: the cache's
        layers hold W columns (views of the buffers), ``prefill_mask`` marks each row's real columns,
        ``position_ids`` the position of each row's last id (the decode continues from it).

    Raises:
        NotImplementedError: the model's cache layers are not plain full-attention `DynamicLayer`s.
    """
    lengths = [len(c) for c in contexts]
    n_rows, width = len(contexts), max(lengths)
    same_shape = n_rows == 1 or (len(set(lengths)) == 1 and len(set(reused)) == 1)
    if not same_shape and width <= PADDED_PREFILL_MAX_WIDTH:
        logits, key_buffers, value_buffers = _padded_prefill(model, contexts, sources, reused, extra, device)
        return logits, _buffer_cache(model, key_buffers, value_buffers, width), *_row_layout(lengths, width)
    n_layers, kv_heads, head_dim, dtype = _kv_geometry(model)
    shape = (n_rows, kv_heads, width + extra, head_dim)
    key_buffers = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]  # (U, H_kv, W+E, D)
    value_buffers = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]  # (U, H_kv, W+E, D)
    for u, (src, p) in enumerate(zip(sources, reused)):
        if src is not None and p > 0:
            src.copy_into(key_buffers, value_buffers, u, width - lengths[u], p)

    if same_shape:
        p = reused[0]
        cache = _buffer_cache(model, key_buffers, value_buffers, p)
        ids = torch.tensor([list(c[p:]) for c in contexts], dtype=torch.long, device=device)  # (U, S)
        pos = torch.arange(p, width, device=device).expand(n_rows, -1)  # (U, S)
        out = model(input_ids=ids, position_ids=pos, use_cache=True, logits_to_keep=1, **{_CACHE: cache})
        logits = out.logits[:, -1, :].float()  # (U, V)
    else:
        rows_logits = []
        for u, (ctx, p) in enumerate(zip(contexts, reused)):
            start = width - lengths[u]
            row_cache = _buffer_cache(
                model,
                [b[u : u + 1, :, start:] for b in key_buffers],
                [b[u : u + 1, :, start:] for b in value_buffers],
                p,
            )
            ids = torch.tensor([list(ctx[p:])], dtype=torch.long, device=device)  # (1, S_u)
            pos = torch.arange(p, len(ctx), device=device).view(1, -1)  # (1, S_u)
            out = model(input_ids=ids, position_ids=pos, use_cache=True, logits_to_keep=1, **{_CACHE: row_cache})
            rows_logits.append(out.logits[:, -1, :].float())  # (1, V)
        logits = torch.cat(rows_logits, dim=0)  # (U, V)
        cache = _buffer_cache(model, key_buffers, value_buffers, width)
    return logits, cache, *_row_layout(lengths, width)


def _row_layout(lengths: Sequence[int], width: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``(prefill_mask (U, W) int64, position_ids (U, 1), W)``: each row's real columns ``[W - len_u, W)``
    and the position of its last id."""
    columns = np.arange(width)  # (W,)
    prefill_mask = torch.from_numpy(columns >= width - np.asarray(lengths)[:, None]).long()  # (U, W)
    position_ids = torch.tensor(list(lengths), dtype=torch.long).view(-1, 1) - 1  # (U, 1)
    return prefill_mask, position_ids, width


PADDED_PREFILL_MAX_WIDTH = 1024
"""Longest context (tokens) that `_prefill` runs through `_padded_prefill`'s masked forwards; calls with a longer
one prefill row by row (see `_prefill`)."""


def _padded_prefill(
    model: torch.nn.Module,
    contexts: Sequence[Sequence[int]],
    sources: Sequence[KVEntry | None],
    reused: Sequence[int],
    extra: int,
    device: torch.device,
) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """Prefill rows of different lengths and reuse in a few masked forwards, straight into `_prefill`'s layout;
    returns ``(logits (U, V), keys, values)`` with per-layer buffers ``(U, H_kv, W + extra, D)`` (row u in
    columns ``[W - len_u, W)``, W = the longest context).

    Rows are cut into buckets of consecutive rows (`_suffix_buckets`; `generate` orders its rows by suffix
    length, so a bucket holds similar suffixes). A bucket whose longest suffix is S feeds every row's last S ids
    into columns ``[W - S, W)``: a row with a shorter suffix (s_u < S) feeds S - s_u ids of its reused prefix
    again (their keys and values are recomputed, equal to the stored ones up to float rounding, and
    overwrite them), a row shorter than S is left-padded with masked ids. Only the part of each reused prefix
    left of ``W - S`` is copied in. Every row's columns are thus in place when its forward ends: no scratch
    layout and no gather. A padding query of a row shorter than S sees no column at all: the attention kernel
    returns 0 for such a row (PyTorch's SDPA; checked finite on CPU with `sdpa` and `eager` attention, not
    on CUDA), so the padding's KV stays finite, and real queries give it weight 0.
    """
    n_rows = len(contexts)
    lengths = [len(c) for c in contexts]
    suffixes = [n - p for n, p in zip(lengths, reused)]
    width = max(lengths)
    n_layers, kv_heads, head_dim, dtype = _kv_geometry(model)
    shape = (n_rows, kv_heads, width + extra, head_dim)
    keys = [torch.empty(shape, dtype=dtype, device=device) for _ in range(n_layers)]  # (U, H_kv, W+E, D)
    values = [torch.empty(shape, dtype=dtype, device=device) for _ in range(n_layers)]
    # Left padding is read by later steps (with weight 0, which a NaN would still poison): zeros there. Every
    # other column is written before it is read (copied prefix, fed ids, then the decode's columns past W).
    for buffer in keys + values:
        buffer[:, :, : width - min(lengths)].zero_()
    logits = []
    for start, end in _suffix_buckets(suffixes):
        fed = max(suffixes[start:end])  # S
        ids = np.zeros((end - start, fed), dtype=np.int64)  # (n, S), padding id 0 is masked out
        pos = np.zeros((end - start, fed), dtype=np.int64)  # (n, S)
        mask = np.zeros((end - start, width), dtype=np.int64)  # (n, W)
        for j, u in enumerate(range(start, end)):
            n, src = lengths[u], sources[u]
            kept = n - fed  # prefix ids left of the fed columns (negative: the row is shorter than S)
            if src is not None and kept > 0:
                src.copy_into(keys, values, u, width - n, kept)
            ids[j, max(-kept, 0) :] = contexts[u][max(kept, 0) :]
            pos[j, max(-kept, 0) :] = np.arange(max(kept, 0), n)
            mask[j, width - n :] = 1
        cache = _buffer_cache(
            model, [k[start:end] for k in keys], [v[start:end] for v in values], width - fed
        )  # views of the bucket's rows: the forward writes columns [W - S, W) in place
        out = model(
            input_ids=torch.from_numpy(ids).to(device),
            attention_mask=torch.from_numpy(mask).to(device),
            position_ids=torch.from_numpy(pos).to(device),
            use_cache=True,
            **{_CACHE: cache},
            logits_to_keep=1,
        )
        logits.append(out.logits[:, -1, :].float())  # (n, V)
    return torch.cat(logits, dim=0), keys, values


BUCKET_CALL_TOKENS = 256
"""What one more forward costs in `_padded_prefill`, in fed tokens (per-call overhead of a small model on a CPU):
`_suffix_buckets` splits rows into another bucket only where that saves more padding than this."""


def _suffix_buckets(suffixes: Sequence[int]) -> list[tuple[int, int]]:
    """Cut rows ``0..U-1`` into ranges ``[start, end)`` of consecutive rows minimising the fed tokens
    (each range costs ``(end - start) * max(suffixes[start:end]) + BUCKET_CALL_TOKENS``; dynamic programming,
    O(U^2)). In a rollout's later calls most rows feed a few template ids and a few feed a long tool output:
    one forward for all would feed every row the longest."""
    s = np.asarray(suffixes, dtype=np.int64)  # (U,)
    best = np.zeros(len(s) + 1, dtype=np.int64)  # best[b]: the cheapest cut of rows [0, b)
    cut = [0] * (len(s) + 1)
    for end in range(1, len(s) + 1):
        widest = np.maximum.accumulate(s[:end][::-1])[::-1]  # (end,) max(s[a:end]) for each start a
        cost = best[:end] + (end - np.arange(end)) * widest + BUCKET_CALL_TOKENS
        cut[end] = int(cost.argmin())
        best[end] = cost[cut[end]]
    ranges, end = [], len(s)
    while end > 0:
        ranges.append((cut[end], end))
        end = cut[end]
    return ranges[::-1]


def _kv_geometry(model: torch.nn.Module) -> tuple[int, int, int, torch.dtype]:
    """``(layers, kv_heads, head_dim, dtype)`` of the model's KV cache, from its config."""
    config: Any = model.config  # a Transformers config (an attribute nn.Module's stubs do not know)
    cfg = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return cfg.num_hidden_layers, kv_heads, head_dim, next(model.parameters()).dtype


def _buffer_cache(
    model: torch.nn.Module, key_buffers: Sequence[torch.Tensor], value_buffers: Sequence[torch.Tensor], n_cols: int
) -> DynamicCache:
    """A `DynamicCache` whose layers are `_ReservedLayer`s over the given buffers, ``n_cols`` of them filled."""
    cache = DynamicCache(config=cast("PreTrainedConfig", model.config))
    if len(cache.layers) != len(key_buffers) or any(type(layer) is not DynamicLayer for layer in cache.layers):
        raise NotImplementedError(
            f"{type(model).__name__}: generation supports models whose cache layers are all full-attention "
            f"DynamicLayers (Llama, Qwen3 without sliding window), got {[type(x).__name__ for x in cache.layers]}"
        )
    for i, (k, v) in enumerate(zip(key_buffers, value_buffers)):
        cache.layers[i] = _ReservedLayer(k, v, n_cols)
    return cache


def _reserved_layers(cache: DynamicCache) -> list[_ReservedLayer]:
    """The layers of a cache `_buffer_cache` built: all `_ReservedLayer`s."""
    return cast(list[_ReservedLayer], cache.layers)


class _ReservedLayer(DynamicLayer):
    """A `DynamicLayer` over preallocated buffers ``(B, H_kv, C, D)`` whose first ``n_cols`` columns are filled.

    `DynamicLayer.update` concatenates, copying the whole ``(B, H_kv, T, D)`` cache at every decode step
    (O(B × T) per token: for 8 rows of 4k tokens that copy costs more than a tiny model's forward).
    Here `update` writes the new columns in place and ``keys``/``values`` are views of the filled columns,
    so nothing else changes (sequence length, mask sizes). When the buffers are full, or something
    replaced ``keys`` (``crop``, ``batch_select_indices``), it concatenates like a plain `DynamicLayer`.
    """

    # always tensors here (`_fill`; the base class's None means "not initialized", which this layer never is)
    keys: torch.Tensor
    values: torch.Tensor

    def __init__(self, key_buffer: torch.Tensor, value_buffer: torch.Tensor, n_cols: int) -> None:
        super().__init__()
        self._key_buffer, self._value_buffer = key_buffer, value_buffer
        self.device = key_buffer.device
        self.is_initialized = True
        self._fill(n_cols)

    def _fill(self, n_cols: int) -> None:
        self.keys = self._key_buffer[..., :n_cols, :]  # (B, H_kv, n_cols, D) view
        self.values = self._value_buffer[..., :n_cols, :]  # (B, H_kv, n_cols, D) view
        self._view = self.keys

    def _in_buffer(self, n_new: int, rows: int) -> bool:
        return (
            self.keys is self._view
            and rows == self._key_buffer.shape[0]
            and self.keys.shape[-2] + n_new <= self._key_buffer.shape[-2]
        )

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n_cols, n_new = self.keys.shape[-2], key_states.shape[-2]
        if not self._in_buffer(n_new, key_states.shape[0]):
            return super().update(key_states, value_states, *args, **kwargs)
        self._key_buffer[..., n_cols : n_cols + n_new, :] = key_states
        self._value_buffer[..., n_cols : n_cols + n_new, :] = value_states
        self._fill(n_cols + n_new)
        return self.keys, self.values

    def select_rows(self, index: torch.Tensor, drop: int = 0) -> None:
        """Keep, reorder or repeat the rows `index` and keep the columns from `drop` on, free columns included:
        ``(B, H_kv, C, D) -> (len(index), H_kv, C - drop, D)`` (a copy; the old buffers stay valid for whoever
        holds views of them)."""
        if self.keys is self._view:
            n_cols = self.keys.shape[-2]
            self._key_buffer = self._key_buffer[:, :, drop:].index_select(0, index)
            self._value_buffer = self._value_buffer[:, :, drop:].index_select(0, index)
            self._fill(n_cols - drop)
        else:
            self.keys = self.keys[:, :, drop:].index_select(0, index)
            self.values = self.values[:, :, drop:].index_select(0, index)


def _cache_layers(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per-layer ``(keys, values)`` of a `DynamicCache`, each ``(B, H_kv, T, D)``."""
    return [(layer.keys, layer.values) for layer in cache.layers]
