"""Batched sampling with per-token logprobs, for both roles (ACT and REHEARSE).

One call serves a batch of token contexts of different lengths (left padding with explicit position ids),
decodes with the model's KV cache, computes logits for the last position only (``logits_to_keep=1``: a
full-vocabulary logit tensor over a 6k-token BFCL prompt would take gigabytes), samples each row with its
own seeded `torch.Generator` (so a rollout is reproducible from its seeds whatever the batch), stops a row
on any end-of-message id, and records each sampled token's logprob from the same logits it was sampled from.

Recorded logprobs are ``log_softmax(logits / temperature)`` at the sampled id (temperature 0: greedy, and
the logprob of ``log_softmax(logits)``), which is what the trainer's recomputation uses (same temperature).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

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


def _left_pad(contexts: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(c) for c in contexts)
    input_ids = torch.full((len(contexts), width), pad_id, dtype=torch.long)  # (B, L)
    attention_mask = torch.zeros((len(contexts), width), dtype=torch.long)  # (B, L)
    for i, ctx in enumerate(contexts):
        if ctx:
            input_ids[i, width - len(ctx):] = torch.tensor(ctx, dtype=torch.long)
            attention_mask[i, width - len(ctx):] = 1
    return input_ids, attention_mask


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
) -> list[Generation]:
    """Sample a continuation of every context in one batched decode.

    Args:
        model: a Transformers causal LM (accepts ``attention_mask``, ``position_ids``, ``past_key_values``,
            ``logits_to_keep``).
        contexts: B token-id lists, each non-empty, of any lengths.
        max_new_tokens: cap on generated tokens per row (>= 1).
        temperature: > 0 samples from ``softmax(logits / temperature)``; 0 is greedy.
        stop_ids: ids that end a row (the template's end-of-message ids); the stop id is kept.
        pad_id: id used for left padding (masked out).
        seeds: one seed per row (None: unseeded); same seed and context give the same sample.

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
    input_ids, attention_mask = _left_pad(contexts, pad_id)  # (B, L), (B, L)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # (B, L)
    input_ids, attention_mask, position_ids = input_ids.to(device), attention_mask.to(device), position_ids.to(device)
    out_ids: list[list[int]] = [[] for _ in range(batch)]
    out_lps: list[list[float]] = [[] for _ in range(batch)]
    finished = torch.zeros(batch, dtype=torch.bool)
    stopped = torch.zeros(batch, dtype=torch.bool)
    past = None
    for _ in range(max_new_tokens):
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=past,
            use_cache=True,
            logits_to_keep=1,
        )
        past = out.cache
        logits = out.logits[:, -1, :].float()  # (B, V)
        if temperature > 0:
            logprobs = torch.log_softmax(logits / temperature, dim=-1)  # (B, V)
        else:
            logprobs = torch.log_softmax(logits, dim=-1)  # (B, V)
        if temperature > 0:
            # Inverse-CDF sampling, batched: one uniform per row from that row's own generator keeps every
            # row reproducible from its seed whatever the batch it is in.
            u = torch.stack([torch.rand((), generator=g) for g in generators])  # (B,)
            cdf = logprobs.exp().cumsum(dim=-1)  # (B, V)
            next_ids = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(-1)).squeeze(-1)  # (B,)
            next_ids = next_ids.clamp_(max=logits.shape[-1] - 1)
        else:
            next_ids = logits.argmax(dim=-1)  # (B,)
        next_ids = torch.where(finished, torch.full_like(next_ids, pad_id), next_ids)  # (B,)
        chosen = logprobs.gather(-1, next_ids.view(batch, 1)).squeeze(-1)  # (B,)
        ids_list, lps_list, done_list = next_ids.tolist(), chosen.tolist(), finished.tolist()
        for i in range(batch):
            if not done_list[i]:
                out_ids[i].append(ids_list[i])
                out_lps[i].append(lps_list[i])
        is_stop = torch.isin(next_ids, stop) & ~finished  # (B,)
        stopped |= is_stop
        finished |= is_stop
        if bool(finished.all()):
            break
        input_ids = next_ids.view(batch, 1).to(device)  # (B, 1)
        attention_mask = torch.cat([attention_mask, torch.ones((batch, 1), dtype=torch.long, device=device)], dim=1)  # (B, L+1)
        position_ids = position_ids[:, -1:] + 1  # (B, 1)
    return [Generation(out_ids[i], out_lps[i], bool(stopped[i])) for i in range(batch)]
