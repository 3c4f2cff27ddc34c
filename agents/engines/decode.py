"""One decode step of a Llama or Qwen3 causal LM without the Transformers module stack.

A decode step feeds one id per row. At SmolLM2-135M's size on a CPU, a step's matrix products take about
84 ms at batch 8, and the Transformers forward adds ~30 ms around them: each of the 30 layers goes through
several module calls, keyword plumbing, mask construction and output records, each dispatching small
tensor ops on ``(B, 1, H)`` activations. `decode_step` computes the same function with the model's own
weights and modules' numbers (RMSNorm, rotary embedding, grouped-query SDPA, SiLU-gated MLP) in one plain
loop, writing each layer's new key and value into the generation's reserved KV buffers in place
(`agents.engines.generation._ReservedLayer`). Prefill (many ids per row) still runs through the model.

Only plain architectures take this path (`supports_decode_step`): Llama and Qwen3 with SiLU MLPs, no
biases, full attention in every layer, no tensor-parallel split, every projection a plain `torch.nn.Linear`
(not a LoRA or quantized layer, whose ``weight`` is not the whole function), and no hooks on the model (a
hook is somebody measuring or changing the forward, which this path would skip; FSDP's are such hooks, so
sharded models run their own forward). Anything else runs the model's own forward, which gives the same
numbers up to float rounding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["decode_step", "supports_decode_step"]

_ARCHITECTURES = {"LlamaForCausalLM", "Qwen3ForCausalLM"}
_PROJECTIONS = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)
# grouped-query SDPA (enable_gqa) arrived in torch 2.5
_SDPA_GQA = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 5)


def supports_decode_step(model: torch.nn.Module) -> bool:
    """True when `decode_step` computes `model`'s forward (see the module doc); else use the model's own."""
    if type(model).__name__ not in _ARCHITECTURES or model.training:
        return False
    cfg = model.config
    if (
        getattr(cfg, "hidden_act", None) != "silu"
        or getattr(cfg, "attention_bias", False)
        or getattr(cfg, "mlp_bias", False)
    ):
        return False
    if getattr(cfg, "pretraining_tp", 1) != 1 or getattr(cfg, "use_sliding_window", False):
        return False
    if not _SDPA_GQA or any(t != "full_attention" for t in (getattr(cfg, "layer_types", None) or [])):
        return False
    inner: Any = model.model  # a LlamaModel / Qwen3Model: its submodules are attributes nn.Module's stubs do not know
    linears = [model.lm_head] + [layer.get_submodule(name) for layer in inner.layers for name in _PROJECTIONS]
    if any(type(m) is not torch.nn.Linear for m in linears):
        return False
    return not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def _rms_norm(x: torch.Tensor, norm: Any) -> torch.Tensor:
    """``norm(x)`` for a Llama/Qwen3 RMSNorm module (`norm`, with ``weight`` and ``variance_epsilon``): statistics
    in float32, scaled by its weight."""
    if x.dtype == torch.float32:  # one fused kernel instead of six small ops
        return F.rms_norm(x, norm.weight.shape, norm.weight, norm.variance_epsilon)
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * h.to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin`` (Llama's rotary embedding) in three ops: rolling the last dim by half
    gives ``cat(x2, x1)``, and `signed_sin` is ``cat(-sin1, sin2)``."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, -1), signed_sin)


@torch.no_grad()
def decode_step(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    cache,
    segments: Sequence[tuple[int, int, int]] | None = None,
) -> torch.Tensor:
    """The next-token logits after feeding one id per row.

    Args:
        model: a model for which `supports_decode_step` is True.
        input_ids: ``(B, 1)`` int64, the ids to feed.
        attention_mask: ``(B, T + 1)`` int64, 1 on the real columns of the cache after this step.
        position_ids: ``(B, 1)`` int64, each row's position of the fed id.
        cache: a `transformers.DynamicCache` holding T columns per layer; each layer's ``update`` appends
            the step's key and value (in place for the generation's reserved buffers).
        segments: ``[(a, b, c), ...]`` covering the rows in order (`agents.engines.generation.attention_segments`):
            rows ``a..b-1`` attend columns ``c..T`` only, every column left of ``c`` being masked for them (the
            same numbers up to float rounding; fewer columns read). None: every row over all columns.

    Returns:
        ``(B, V)`` logits in the model's dtype.
    """
    # a LlamaForCausalLM / Qwen3ForCausalLM: its submodules and config are attributes nn.Module's stubs do not know
    inner: Any = model.model
    cfg: Any = model.config
    lm_head: Any = model.lm_head
    rows = input_ids.shape[0]
    hidden = inner.embed_tokens(input_ids).view(rows, -1)  # (B, H)
    cos, sin = inner.rotary_emb(hidden, position_ids=position_ids)  # (B, 1, D) each
    half = cos.shape[-1] // 2
    cos = cos[:, None]  # (B, 1, 1, D): broadcast over heads
    signed_sin = torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)[:, None]  # (B, 1, 1, D)
    if segments is None or len(segments) == 1:
        segments = [(0, rows, segments[0][2] if segments else 0)]
    masks = []  # per segment (b - a, 1, 1, T + 1 - c), None where nothing is masked
    for a, b, c in segments:
        part = attention_mask[a:b, c:]
        masks.append(None if bool(part.all()) else part.bool()[:, None, None, :])
    for i, layer in enumerate(inner.layers[: cfg.num_hidden_layers]):
        attn, mlp = layer.self_attn, layer.mlp
        x = _rms_norm(hidden, layer.input_layernorm)  # (B, H)
        q = F.linear(x, attn.q_proj.weight).view(rows, -1, 1, attn.head_dim)  # (B, H_q, 1, D)
        k = F.linear(x, attn.k_proj.weight).view(rows, -1, 1, attn.head_dim)  # (B, H_kv, 1, D)
        v = F.linear(x, attn.v_proj.weight).view(rows, -1, 1, attn.head_dim)  # (B, H_kv, 1, D)
        if hasattr(attn, "q_norm"):  # Qwen3 normalises each head's query and key
            q, k = _rms_norm(q, attn.q_norm), _rms_norm(k, attn.k_norm)
        q, k = _rotate(q, cos, signed_sin), _rotate(k, cos, signed_sin)  # (B, H, 1, D) each
        keys, values = cache.layers[i].update(k, v)  # (B, H_kv, T+1, D) each
        gqa = q.shape[1] != keys.shape[1]
        parts = [
            F.scaled_dot_product_attention(
                q[a:b], keys[a:b, :, c:], values[a:b, :, c:], attn_mask=m, scale=attn.scaling, enable_gqa=gqa
            )  # (b - a, H_q, 1, D)
            for (a, b, c), m in zip(segments, masks)
        ]
        out = parts[0] if len(parts) == 1 else torch.cat(parts)  # (B, H_q, 1, D)
        # the residual add rides in the GEMM (addmm's beta term) instead of a separate op
        hidden = torch.addmm(hidden, out.reshape(rows, -1), attn.o_proj.weight.t())  # (B, H)
        x = _rms_norm(hidden, layer.post_attention_layernorm)
        gate = F.silu(F.linear(x, mlp.gate_proj.weight), inplace=True).mul_(F.linear(x, mlp.up_proj.weight))
        hidden = torch.addmm(hidden, gate, mlp.down_proj.weight.t())  # (B, H)
    hidden = _rms_norm(hidden, inner.norm)
    return F.linear(hidden, lm_head.weight)  # (B, V)
