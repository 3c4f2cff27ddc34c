"""Batched sampling with per-token logprobs, for both roles (ACT and REHEARSE).

One call serves a batch of token contexts of different lengths (left padding with explicit position ids),
decodes with the model's KV cache, computes logits for the last position only (``logits_to_keep=1``: a
full-vocabulary logit tensor over a 6k-token BFCL prompt would take gigabytes), samples each row with its
own seeded `torch.Generator` (so a rollout is reproducible from its seeds whatever the batch), stops a row
on any end-of-message id, and records each sampled token's logprob from the same logits it was sampled from.

Recorded logprobs are ``log_softmax(logits / temperature)`` at the sampled id (temperature 0: greedy, and
the logprob of ``log_softmax(logits)``), which is what the trainer's recomputation uses (same temperature).

With a `agents.kv_cache.PrefixKVCache` (the inline-mode default of `agents.policy.Policy`), each row reuses
the keys/values of its longest cached prefix and the model processes only the new tokens; the layout is in
`generate`'s docstring; prompt prefixes that several rows of one call share (BFCL tasks with the same
tools) are prefilled once. The decode loop does only step-dependent work: the KV buffers are reserved for
every new column once (no concatenation per token), the attention mask and the output buffers are
allocated once, ids and logprobs are copied to Python lists once at the end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from agents.kv_cache import KVEntry, PrefixKVCache

__all__ = ["Generation", "generate"]


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
) -> list[Generation]:
    """Sample a continuation of every context in one batched decode.

    Without `kv_cache` every context is encoded in full. With it, each row's longest cached prefix
    (`PrefixKVCache.lookup`, exact id match) is reused and only the suffix is prefilled; identical
    (context, prefix) rows are prefilled once and their KV copied (the K samples of a group); a prefix of
    at least ``kv_cache.min_shared_prefix`` tokens that several distinct rows share is prefilled once and
    stored first, so each of them feeds only its own suffix; afterwards each row's processed ids
    (context + generated ids but the last) and KV are stored for its next call.

    Batch layout of the prefill (U unique rows, P = longest reused prefix, S = longest suffix), per row u
    with reused length p_u and suffix length s_u::

        cache columns [0, P):      P - p_u zero pads | p_u reused KV
        input columns [P, P + S):  S - s_u pads      | s_u suffix ids

    ``attention_mask`` ``(U, P + S)`` marks the real columns and ``position_ids`` continue each row's true
    length (``p_u + j``), so a row's logits do not depend on the batch it is in (up to float rounding).

    Args:
        model: a Transformers causal LM (accepts ``attention_mask``, ``position_ids``, ``cache``,
            ``logits_to_keep``; returns ``out.cache``, a `transformers.DynamicCache`).
        contexts: B token-id lists, each non-empty, of any lengths.
        max_new_tokens: cap on generated tokens per row (>= 1).
        temperature: > 0 samples from ``softmax(logits / temperature)``; 0 is greedy.
        stop_ids: ids that end a row (the template's end-of-message ids); the stop id is kept.
        pad_id: id used for left padding (masked out).
        seeds: one seed per row (None: unseeded); same seed and context give the same sample.
        kv_cache: the prefix cache to read and extend (None: no caching, full re-encoding).

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
    rows_u = [first_row[u] for u in range(len(uniq))]
    p_u = [reused[i] for i in rows_u]
    s_u = [len(contexts[i]) - reused[i] for i in rows_u]
    n_u, width_p, width_s = len(rows_u), max(p_u), max(s_u)

    if n_u > 1 and (len(set(p_u)) > 1 or len(set(s_u)) > 1):
        # Ragged rows: prefill each unique row alone, then left-pad the finished KV for the batched decode.
        # A padded batched prefill needs an explicit attention mask, which sends CPU attention to its masked
        # math path (measured: 8 BFCL-length rows padded 1.9 s vs 0.6 s row by row, tiny model).
        logits, cache, prefill_mask, position_ids, width_p, width_s = _prefill_rows_separately(
            model, [contexts[i] for i in rows_u], [sources[i] for i in rows_u], p_u, device
        )
    else:
        input_ids = torch.full((n_u, width_s), pad_id, dtype=torch.long)  # (U, S)
        prefill_mask = torch.zeros((n_u, width_p + width_s), dtype=torch.long)  # (U, P+S)
        for u, i in enumerate(rows_u):
            input_ids[u, width_s - s_u[u]:] = torch.tensor(contexts[i][p_u[u]:], dtype=torch.long)
            prefill_mask[u, width_p - p_u[u]:width_p] = 1
            prefill_mask[u, width_p + width_s - s_u[u]:] = 1
        position_ids = (prefill_mask.cumsum(-1) - 1).clamp(min=0)[:, width_p:]  # (U, S): p_u + j on real columns
        cache = _past_cache(model, [sources[i] for i in rows_u], p_u, width_p, device) if width_p > 0 else None

        out = model(
            input_ids=input_ids.to(device),
            attention_mask=prefill_mask.to(device),
            position_ids=position_ids.to(device),
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        cache = out.cache
        logits = out.logits[:, -1, :].float()  # (U, V)
    if kv_cache is not None:
        kv_cache.stats["fed_tokens"] += sum(s_u)
        kv_cache.stats["hits"] += sum(1 for r in reused if r > 0)
        kv_cache.stats["reused_tokens"] += sum(reused)
    if n_u < batch:  # expand the unique rows back to the B rows
        index = torch.tensor(row_to_uniq, dtype=torch.long)  # (B,)
        _select_rows(cache, index.to(device))
        logits = logits.index_select(0, index)  # (B, V)
        prefill_mask = prefill_mask.index_select(0, index)  # (B, P+S)
        position_ids = position_ids.index_select(0, index)  # (B, S)

    # Decode loop state, allocated once: KV buffers with room for every new column, the full attention
    # mask, output buffers.
    _reserve_columns(cache, max_new_tokens - 1)
    width0 = width_p + width_s
    attention_mask = torch.ones((batch, width0 + max_new_tokens), dtype=torch.long)  # (B, P+S+N)
    attention_mask[:, :width0] = prefill_mask
    attention_mask = attention_mask.to(device)
    next_pos = position_ids[:, -1:].to(device) + 1  # (B, 1)
    sampled = torch.full((batch, max_new_tokens), pad_id, dtype=torch.long)  # (B, N)
    sampled_lp = torch.zeros((batch, max_new_tokens), dtype=torch.float32)  # (B, N)
    lengths = torch.zeros(batch, dtype=torch.long)  # (B,) tokens generated per row
    finished = torch.zeros(batch, dtype=torch.bool)  # (B,)
    stopped = torch.zeros(batch, dtype=torch.bool)  # (B,)
    pad_fill = torch.full((batch,), pad_id, dtype=torch.long)  # (B,)
    steps = 0
    for t in range(max_new_tokens):
        if t > 0:
            out = model(
                input_ids=next_ids.view(batch, 1).to(device),
                attention_mask=attention_mask[:, : width0 + t],
                position_ids=next_pos,
                cache=cache,
                use_cache=True,
                logits_to_keep=1,
            )
            cache = out.cache
            logits = out.logits[:, -1, :].float()  # (B, V)
            next_pos = next_pos + 1
        scaled = (logits / temperature if temperature not in (0.0, 1.0) else logits).cpu()  # (B, V)
        # log_softmax at the chosen id only: x_id - max - log(sum exp(x - max)), the same formula as
        # torch.log_softmax; the unnormalised exp(x - max) doubles as the sampling CDF (two vocab passes).
        row_max = scaled.amax(dim=-1, keepdim=True)  # (B, 1)
        cdf = (scaled - row_max).exp_().cumsum_(dim=-1)  # (B, V) unnormalised
        total = cdf[:, -1:]  # (B, 1)
        if temperature > 0:
            # Inverse-CDF sampling, batched: one uniform per row from that row's own generator keeps every
            # row reproducible from its seed whatever the batch it is in.
            u = torch.stack([torch.rand((), generator=g) for g in generators])  # (B,)
            next_ids = torch.searchsorted(cdf, u.unsqueeze(-1) * total).squeeze(-1)  # (B,)
            next_ids = next_ids.clamp_(max=logits.shape[-1] - 1)
        else:
            next_ids = scaled.argmax(dim=-1)  # (B,)
        next_ids = torch.where(finished, pad_fill, next_ids)  # (B,)
        live = ~finished  # (B,)
        sampled[:, t] = next_ids
        chosen = scaled.gather(-1, next_ids.view(batch, 1))  # (B, 1)
        sampled_lp[:, t] = (chosen - row_max - total.log()).squeeze(-1)
        lengths += live.long()
        is_stop = torch.isin(next_ids, stop) & live  # (B,)
        stopped |= is_stop
        finished |= is_stop
        steps = t + 1
        if bool(finished.all()):
            break

    lens = lengths.tolist()
    ids_all, lps_all = sampled[:, :steps].tolist(), sampled_lp[:, :steps].tolist()
    gens = [Generation(ids_all[i][: lens[i]], lps_all[i][: lens[i]], bool(stopped[i])) for i in range(batch)]
    if kv_cache is not None:
        # Columns fed for row i: the prefill columns plus its first len_i - 1 generated ids (the last
        # sampled id was never fed back); keep the real ones only.
        fed_mask = attention_mask[:, : width0 + steps - 1].clone()  # (B, P+S+steps-1)
        for i in range(batch):
            fed_mask[i, width0 + max(lens[i] - 1, 0):] = 0
        kv_cache.stats["fed_tokens"] += sum(max(n - 1, 0) for n in lens)
        new_entries = []
        layers = _cache_layers(cache)
        for i in range(batch):
            cols = fed_mask[i].nonzero().squeeze(-1)  # (L_i,)
            ids = contexts[i] + gens[i].token_ids[:-1]
            keys = [k[i : i + 1].index_select(2, cols) for k, _ in layers]  # each (1, H_kv, L_i, D)
            values = [v[i : i + 1].index_select(2, cols) for _, v in layers]  # each (1, H_kv, L_i, D)
            new_entries.append(KVEntry(np.asarray(ids, dtype=np.int64), keys, values))
        # Only an entry a row continued in full is superseded by that row's new entry.
        kv_cache.store(new_entries, [s if s is not None and reused[i] == s.num_tokens else None
                                     for i, s in enumerate(sources)])
    return gens


def _common_prefix_length(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two 1-D id arrays."""
    n = min(a.shape[0], b.shape[0])
    eq = a[:n] == b[:n]  # (n,)
    return n if bool(eq.all()) else int(eq.argmin())


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
    neighbour = [_common_prefix_length(arrays[i], arrays[i + 1]) for i in range(len(arrays) - 1)]
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
        row_cache = _past_cache(model, [src], [p], p, device) if p > 0 else None
        ids = torch.tensor([list(prefix[p:])], dtype=torch.long, device=device)  # (1, S)
        pos = torch.arange(p, len(prefix), device=device).view(1, -1)  # (1, S)
        out = model(input_ids=ids, position_ids=pos, cache=row_cache, use_cache=True, logits_to_keep=1)
        layers = _cache_layers(out.cache)
        kv_cache.stats["fed_tokens"] += len(prefix) - p
        kv_cache.stats["shared_prefixes"] += 1
        kv_cache.store([KVEntry(np.asarray(prefix, dtype=np.int64), [k for k, _ in layers], [v for _, v in layers])])


def _prefill_rows_separately(
    model: torch.nn.Module,
    contexts: Sequence[Sequence[int]],
    sources: Sequence[KVEntry | None],
    reused: Sequence[int],
    device: torch.device,
) -> tuple[torch.Tensor, DynamicCache, torch.Tensor, torch.Tensor, int, int]:
    """Prefill U rows one at a time (no padding, so no attention mask), then batch their KV.

    Row u reuses the first ``reused[u]`` positions of ``sources[u]`` and feeds the rest of ``contexts[u]``.
    Returns ``(logits (U, V), cache, prefill_mask (U, W), position_ids (U, 1), W, 0)``: the cache holds every
    row's whole context left-padded with zeros to W = the longest context, ``prefill_mask`` marks the real
    columns, ``position_ids`` the last position of each row (the decode continues from it).
    """
    rows: list[KVEntry] = []
    logits = []
    for ctx, src, p in zip(contexts, sources, reused):
        row_cache = _past_cache(model, [src], [p], p, device) if p > 0 else None
        ids = torch.tensor([list(ctx[p:])], dtype=torch.long, device=device)  # (1, S_u)
        pos = torch.arange(p, len(ctx), device=device).view(1, -1)  # (1, S_u)
        out = model(input_ids=ids, position_ids=pos, cache=row_cache, use_cache=True, logits_to_keep=1)
        logits.append(out.logits[:, -1, :].float())  # (1, V)
        layers = _cache_layers(out.cache)
        rows.append(KVEntry(np.asarray(list(ctx), dtype=np.int64), [k for k, _ in layers], [v for _, v in layers]))
    lengths = [len(c) for c in contexts]
    width = max(lengths)
    prefill_mask = torch.zeros((len(contexts), width), dtype=torch.long)  # (U, W)
    for u, n in enumerate(lengths):
        prefill_mask[u, width - n:] = 1
    position_ids = torch.tensor(lengths, dtype=torch.long).view(-1, 1) - 1  # (U, 1)
    cache = _past_cache(model, rows, lengths, width, device)
    return torch.cat(logits, dim=0), cache, prefill_mask, position_ids, width, 0  # (U, V)


class _ReservedLayer(DynamicLayer):
    """A `DynamicLayer` that writes new keys/values into buffers reserved for ``extra`` more columns.

    `DynamicLayer.update` concatenates, copying the whole ``(B, H_kv, T, D)`` cache at every decode step
    (O(B × T) per token: for 8 rows of 4k tokens that copy costs more than a tiny model's forward).
    Here `update` writes the new columns in place and returns views of the written columns, so nothing
    else changes (sequence length, mask sizes). When the reserve runs out, or something replaced
    ``keys`` (``crop``, ``batch_select_indices``), it concatenates like a plain `DynamicLayer`.
    """

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, extra: int) -> None:
        super().__init__()
        n_cols = keys.shape[-2]
        shape_k = (*keys.shape[:-2], n_cols + extra, keys.shape[-1])
        shape_v = (*values.shape[:-2], n_cols + extra, values.shape[-1])
        self._key_buffer = keys.new_empty(shape_k)  # (B, H_kv, T + extra, D)
        self._value_buffer = values.new_empty(shape_v)  # (B, H_kv, T + extra, D)
        self._key_buffer[..., :n_cols, :] = keys
        self._value_buffer[..., :n_cols, :] = values
        self.keys = self._key_buffer[..., :n_cols, :]  # (B, H_kv, T, D) view
        self.values = self._value_buffer[..., :n_cols, :]  # (B, H_kv, T, D) view
        self.device = keys.device
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n_cols, n_new = self.keys.shape[-2], key_states.shape[-2]
        in_buffer = (
            self.keys.data_ptr() == self._key_buffer.data_ptr()
            and self.keys.shape[0] == key_states.shape[0] == self._key_buffer.shape[0]
            and n_cols + n_new <= self._key_buffer.shape[-2]
        )
        if not in_buffer:
            return super().update(key_states, value_states, *args, **kwargs)
        self._key_buffer[..., n_cols:n_cols + n_new, :] = key_states
        self._value_buffer[..., n_cols:n_cols + n_new, :] = value_states
        self.keys = self._key_buffer[..., :n_cols + n_new, :]  # (B, H_kv, T', D) view
        self.values = self._value_buffer[..., :n_cols + n_new, :]  # (B, H_kv, T', D) view
        return self.keys, self.values


def _reserve_columns(cache: Any, extra: int) -> None:
    """Give every layer of ``cache`` room for ``extra`` more columns without reallocation (`_ReservedLayer`)."""
    if extra < 1 or not hasattr(cache, "layers"):
        return
    for i, layer in enumerate(cache.layers):
        if type(layer) is DynamicLayer and layer.is_initialized and layer.keys is not None:
            cache.layers[i] = _ReservedLayer(layer.keys, layer.values, extra)


def _cache_layers(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per-layer ``(keys, values)`` of a `DynamicCache`, each ``(B, H_kv, T, D)``."""
    return [(layer.keys, layer.values) for layer in cache.layers]


def _select_rows(cache: Any, index: torch.Tensor) -> None:
    """Reorder/duplicate the batch rows of every cache layer in place: ``(U, ...) -> (len(index), ...)``."""
    for layer in cache.layers:
        layer.keys = layer.keys.index_select(0, index)  # (B, H_kv, T, D)
        layer.values = layer.values.index_select(0, index)  # (B, H_kv, T, D)


def _past_cache(
    model: torch.nn.Module, entries: Sequence[KVEntry | None], lengths: Sequence[int], width: int, device: torch.device
) -> DynamicCache:
    """A `DynamicCache` holding each row's reused prefix, left-padded with zeros to ``width`` columns.

    Row u gets ``entries[u]``'s first ``lengths[u]`` positions in columns ``[width - lengths[u], width)``;
    the zero columns are masked by the caller's attention mask. Per layer keys/values ``(U, H_kv, width, D)``.
    """
    ref = next(e for e in entries if e is not None)
    data = []
    for layer in range(len(ref.keys)):
        k0, v0 = ref.keys[layer], ref.values[layer]
        keys = k0.new_zeros((len(entries), k0.shape[1], width, k0.shape[3]), device=device)  # (U, H_kv, P, D)
        values = v0.new_zeros((len(entries), v0.shape[1], width, v0.shape[3]), device=device)  # (U, H_kv, P, D)
        for u, (e, n) in enumerate(zip(entries, lengths)):
            if e is not None and n > 0:
                keys[u, :, width - n:] = e.keys[layer][0, :, :n]
                values[u, :, width - n:] = e.values[layer][0, :, :n]
        data.append((keys, values))
    return DynamicCache(ddp_cache_data=data, config=model.config)
