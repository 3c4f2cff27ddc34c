"""Selected-token logprobs (and entropies) of given token ids, computed in chunks through the LM head.

The trainer recomputes ``log p(y_t | y_<t)`` for the exact ids of a rollout (docs/design.md §3, token in,
token out) to form the PPO ratio against the logprobs recorded at generation (`agents.engines.generation`), and
optionally the entropy for the entropy bonus (docs/design.md §1). Doing that with ``model(input_ids).logits``
materialises an ``(N, T, V)`` float tensor (V = 49152 for SmolLM2: 8 rows × 512 tokens is 0.8 GB per
copy), and the log-softmax and its backward hold several such copies at once. `token_logprobs` never
builds it.

Implementation details:

1. The decoder alone (``model.get_decoder()``) gives the final hidden states ``(N, T, H)``; the LM head
   (``model.get_output_embeddings()``) is applied to the positions that have a target only, in chunks of
   ``chunk_size`` flattened positions: ``(chunk, H) -> (chunk, V)`` logits, log-softmax in float32, gather
   of the target id, and (optionally) the entropy, all inside one function.
2. Each chunk runs under ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``: the forward keeps
   only the chunk's inputs ``(chunk, H)`` and outputs ``(chunk,)``, and the backward recomputes one
   chunk's logits at a time. Peak extra memory for the head is therefore about
   ``chunk_size × V × 4`` bytes times a small constant (logits, log-softmax, their gradients), instead of
   the same constant times ``N × T × V × 4``. The price is one extra LM-head matmul per chunk in the
   backward.
3. Position ids are ``cumsum(attention_mask) - 1`` (as in `agents.engines.generation`), so a row's logprobs do
   not depend on how much padding the batch gave it. The layout is right padding; a position gets a
   logprob only when it and the position before it are both real tokens (``mask[t] = mask[t-1] = 1``),
   so position 0, the padding, and (were a row left-padded) its first real token hold 0.0.
4. ``temperature`` scales the logits exactly as generation does (``logits / temperature``; 0 means
   greedy there, and its recorded logprobs are ``log_softmax(logits)``, so 0 is treated as 1 here).
5. The decoder's own activations are not chunked: for long batches they dominate once the logits are
   gone; `enable_gradient_checkpointing` trades them for recomputation.

`naive_token_logprobs` is the full-logits reference, kept for tests and ``benchmarks/perf/logprob_memory.py``.
"""

from __future__ import annotations

from typing import Any, Literal, overload

import torch
from torch.utils.checkpoint import checkpoint

__all__ = ["token_logprobs", "TokenLogprobs", "naive_token_logprobs", "enable_gradient_checkpointing"]


def _check_inputs(input_ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float) -> float:
    """Validate the batch and return the effective temperature (0 becomes 1)."""
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be (N, T), got shape {tuple(input_ids.shape)}")
    if attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask shape {tuple(attention_mask.shape)} != input_ids shape {tuple(input_ids.shape)}"
        )
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 is treated as 1), got {temperature}")
    return 1.0 if temperature == 0 else float(temperature)


def _position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # (N, T)


def _target_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """``(N, T)`` bool: True where position t has a prediction (mask[t] and mask[t-1] both 1, t >= 1)."""
    mask = attention_mask.bool()  # (N, T)
    valid = torch.zeros_like(mask)  # (N, T)
    valid[:, 1:] = mask[:, 1:] & mask[:, :-1]
    return valid


def _chunk_logprobs(
    lm_head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logprob of ``targets`` and entropy for one chunk: hidden ``(C, H)``, targets ``(C,)`` -> ``(C,)``, ``(C,)``.

    The entropy is an empty tensor when ``with_entropy`` is False (checkpoint needs tensor outputs).
    """
    logits = lm_head(hidden).float()  # (C, V)
    if temperature != 1.0:
        logits = logits / temperature  # (C, V)
    logp = torch.log_softmax(logits, dim=-1)  # (C, V)
    selected = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (C,)
    if with_entropy:
        entropy = -(logp.exp() * logp).sum(-1)  # (C,)
    else:
        entropy = selected.new_empty(0)  # (0,)
    return selected, entropy


@overload
def token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    temperature: float = ...,
    chunk_size: int = ...,
    return_entropy: Literal[False] = ...,
) -> torch.Tensor: ...


@overload
def token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    temperature: float = ...,
    chunk_size: int = ...,
    return_entropy: Literal[True],
) -> tuple[torch.Tensor, torch.Tensor]: ...


@overload
def token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    temperature: float = ...,
    chunk_size: int = ...,
    return_entropy: bool = ...,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]: ...


def token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = 512,
    return_entropy: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Logprob of every given token under the model, without materialising the ``(N, T, V)`` logits.

    Position ``t`` holds ``log softmax(logits_{t-1} / temperature)[input_ids[:, t]]``, i.e.
    ``log p(input_ids[:, t] | input_ids[:, :t])``: the same quantity `agents.engines.generation.generate` records
    for the ids it samples (with the same temperature). Differentiable: gradients flow to every model
    parameter (decoder and LM head), e.g. ``(token_logprobs(...) * loss_mask).sum().backward()``.

    Memory: the model's decoder runs once over ``(N, T)`` (its activations are kept for the backward
    unless `enable_gradient_checkpointing` is on); the LM head runs over at most ``chunk_size`` positions
    at a time under non-reentrant activation checkpointing, so the extra memory for logits is about
    ``chunk_size × V × 4`` bytes (times a small constant for the log-softmax and the gradients) instead of
    ``N × T × V × 4`` (0.8 GB per copy for 8 × 512 tokens at V = 49152). Padding positions are skipped,
    not computed and discarded.

    Args:
        model: a Transformers causal LM with ``get_decoder()`` (returning a module whose output has
            ``last_hidden_state``) and ``get_output_embeddings()`` (the LM head), e.g. Llama or Qwen3.
            Models that post-process logits (final logit soft-capping) are not supported.
        input_ids: ``(N, T)`` int64 token ids, right-padded (any id at padding).
        attention_mask: ``(N, T)`` int64 (or bool), 1 for real tokens, 0 for the padding at the end of a row.
        temperature: the sampling temperature the tokens were drawn at; logits are divided by it.
            0 (greedy) is treated as 1, matching the logprobs `generate` records for greedy rows.
        chunk_size: how many flattened positions go through the LM head at once (>= 1). Smaller saves
            memory; larger amortises per-call overhead. It does not change the result beyond float
            rounding.
        return_entropy: also return the entropy of ``softmax(logits_{t-1} / temperature)`` at each
            position (the predictive distribution of token t), computed in the same chunks.

    Returns:
        ``(N, T)`` float32 logprobs on the model's device; 0.0 at position 0 (no prediction) and wherever
        ``attention_mask`` is 0 (more precisely: wherever ``mask[t]`` or ``mask[t-1]`` is 0). With
        ``return_entropy`` a tuple ``(logprobs, entropy)``, both ``(N, T)`` float32, entropy 0.0 at the
        same positions.

    Raises:
        ValueError: ``input_ids`` is not 2-D, ``attention_mask`` has a different shape, ``chunk_size < 1``,
            or ``temperature < 0``.
    """
    temperature = _check_inputs(input_ids, attention_mask, temperature)
    if isinstance(chunk_size, bool) or int(chunk_size) != chunk_size or chunk_size < 1:
        raise ValueError(f"chunk_size must be an integer >= 1, got {chunk_size!r}")
    chunk_size = int(chunk_size)
    device = next(model.parameters()).device
    input_ids = input_ids.to(device)  # (N, T)
    attention_mask = attention_mask.to(device)  # (N, T)
    n_rows, length = input_ids.shape
    logprobs = torch.zeros((n_rows, length), dtype=torch.float32, device=device)  # (N, T)
    entropy = torch.zeros((n_rows, length), dtype=torch.float32, device=device) if return_entropy else None  # (N, T)
    valid = _target_mask(attention_mask)  # (N, T)
    if n_rows == 0 or length == 0 or not bool(valid.any()):
        return (logprobs, entropy) if entropy is not None else logprobs  # (entropy is None unless return_entropy)

    hf_model: Any = model  # a Transformers causal LM: get_decoder / get_output_embeddings are not on nn.Module
    hidden = hf_model.get_decoder()(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=_position_ids(attention_mask),
        use_cache=False,
    ).last_hidden_state  # (N, T, H)
    # The hidden state at t-1 predicts the id at t: select the M positions t that have a prediction.
    predictors = hidden[:, :-1][valid[:, 1:]]  # (M, H)
    targets = input_ids[valid]  # (M,)
    lm_head = hf_model.get_output_embeddings()
    use_checkpoint = torch.is_grad_enabled() and (
        predictors.requires_grad or any(p.requires_grad for p in lm_head.parameters())
    )
    lp_chunks, ent_chunks = [], []
    for start in range(0, predictors.shape[0], chunk_size):
        h_chunk = predictors[start : start + chunk_size]  # (C, H)
        t_chunk = targets[start : start + chunk_size]  # (C,)
        if use_checkpoint:
            lp, ent = checkpoint(
                _chunk_logprobs, lm_head, h_chunk, t_chunk, temperature, return_entropy, use_reentrant=False
            )
        else:
            lp, ent = _chunk_logprobs(lm_head, h_chunk, t_chunk, temperature, return_entropy)
        lp_chunks.append(lp)  # (C,)
        ent_chunks.append(ent)  # (C,) or (0,)
    logprobs = logprobs.masked_scatter(valid, torch.cat(lp_chunks))  # (N, T)
    if entropy is not None:  # return_entropy
        entropy = entropy.masked_scatter(valid, torch.cat(ent_chunks))  # (N, T)
        return logprobs, entropy
    return logprobs


def naive_token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float = 1.0,
    *,
    return_entropy: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Reference for `token_logprobs`: full ``(N, T, V)`` logits and a full-vocabulary log-softmax.

    Same contract, positions and padding rule as `token_logprobs` (with the same position ids), but peak
    memory grows with ``N × T × V``. For tests and ``benchmarks/perf/logprob_memory.py`` only.

    Args:
        model, input_ids, attention_mask, temperature, return_entropy: as in `token_logprobs`.

    Returns:
        ``(N, T)`` float32 logprobs, or ``(logprobs, entropy)`` with ``return_entropy``.

    Raises:
        ValueError: bad shapes or ``temperature < 0`` (as in `token_logprobs`).
    """
    temperature = _check_inputs(input_ids, attention_mask, temperature)
    device = next(model.parameters()).device
    input_ids = input_ids.to(device)  # (N, T)
    attention_mask = attention_mask.to(device)  # (N, T)
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=_position_ids(attention_mask), use_cache=False
    ).logits.float()  # (N, T, V)
    logp = torch.log_softmax(logits[:, :-1] / temperature, dim=-1)  # (N, T-1, V)
    selected = logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)  # (N, T-1)
    valid = _target_mask(attention_mask)  # (N, T)
    zero_col = selected.new_zeros((input_ids.shape[0], 1))  # (N, 1)
    logprobs = torch.cat([zero_col, selected], dim=1) * valid  # (N, T)
    if not return_entropy:
        return logprobs
    ent = -(logp.exp() * logp).sum(-1)  # (N, T-1)
    return logprobs, torch.cat([zero_col, ent], dim=1) * valid  # (N, T)


class TokenLogprobs(torch.nn.Module):
    """`token_logprobs` of a causal LM as a module's ``forward``, so that a wrapper that hooks ``forward``
    (DistributedDataParallel through `agents.training.distributed.DataParallel.wrap`) sees the whole computation,
    whose decoder and LM head `token_logprobs` calls separately. ``self.model`` is the LM itself (same
    parameters).
    """

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    @staticmethod
    def example_inputs(pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The smallest positional inputs of `forward`: ``(input_ids, attention_mask)``, each ``(1, 1)``
        int64 (one `pad_id`), e.g. the first forward a sharding wrapper needs (`DataParallel.wrap`)."""
        return (torch.tensor([[int(pad_id)]], device=device), torch.ones(1, 1, dtype=torch.long, device=device))

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        temperature: float = 1.0,
        chunk_size: int = 512,
        return_entropy: bool = False,
    ):
        """`token_logprobs(self.model, ...)`: ``(N, T)`` float32 logprobs (and entropies)."""
        return token_logprobs(
            self.model,
            input_ids,
            attention_mask,
            temperature=temperature,
            chunk_size=chunk_size,
            return_entropy=return_entropy,
        )


def enable_gradient_checkpointing(model: torch.nn.Module) -> torch.nn.Module:
    """Turn on Transformers gradient checkpointing (non-reentrant) for the decoder layers; returns ``model``.

    Uses ``model.activation_checkpointing_enable`` (the Transformers 5 name) when the model has it, else
    ``model.gradient_checkpointing_enable``; both with ``use_reentrant=False``.

    Trade-off: without it, the backward of `token_logprobs` keeps every decoder layer's activations
    (for SmolLM2-135M roughly 40 KB per token per layer in float32, i.e. about 5 GB for 8 × 512 tokens
    over 30 layers), which dominates once the logits are chunked. With it only each layer's input
    ``(N, T, H)`` is kept and the layer is re-run during the backward: memory drops to about one layer's
    activations plus ``L × N × T × H`` floats, and a training step costs about one extra forward pass
    (roughly 30% more time). Non-reentrant checkpointing (``use_reentrant=False``) is used because it
    works when the inputs do not require grad and composes with the chunked LM head.

    Transformers only checkpoints a layer while the model is in training mode (``model.train()``); models
    from `agents.models.load_model` start in evaluation mode, so call ``model.train()`` before the update (for
    Llama/Qwen3 without dropout this changes no numbers). It also sets ``model.config.use_cache = False``
    (a KV cache is useless in a training forward and Transformers warns about it).
    ``model.activation_checkpointing_disable()`` (older: ``gradient_checkpointing_disable``) undoes it; generation
    under ``torch.no_grad`` is unaffected either way.

    Raises:
        ValueError: the model does not support gradient checkpointing
            (``supports_gradient_checkpointing`` is False).
    """
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ValueError(f"{type(model).__name__} does not support gradient checkpointing")
    kwargs = {"use_reentrant": False}
    hf_model: Any = model  # a Transformers model: these methods and its config are not on nn.Module
    if hasattr(model, "activation_checkpointing_enable"):  # Transformers >= 5.x name; the old one warns
        hf_model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        hf_model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if getattr(model, "config", None) is not None:
        hf_model.config.use_cache = False
    return model
