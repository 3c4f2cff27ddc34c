"""Chunked selected-token logprobs (`agents.training.logprobs`) against the full-logits reference, and against
the logprobs `agents.engines.generation.generate` records (token in, token out: docs/design.md §3)."""

from __future__ import annotations

import pytest
import torch

from agents.engines.generation import generate
from agents.models import SMOLLM2_PAD_TOKEN_ID, tiny_random_model
from agents.training.logprobs import enable_gradient_checkpointing, naive_token_logprobs, token_logprobs

VOCAB = 49152


def _ragged_batch(lengths: list[int], width: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded random ids ``(N, width)`` and mask; padding holds random ids too (must be ignored)."""
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, VOCAB, (len(lengths), width), generator=g)  # (N, T)
    attention_mask = torch.zeros((len(lengths), width), dtype=torch.long)  # (N, T)
    for i, n in enumerate(lengths):
        attention_mask[i, :n] = 1
    return input_ids, attention_mask


def _right_pad(rows: list[list[int]], pad_id: int = SMOLLM2_PAD_TOKEN_ID) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)  # (N, T)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)  # (N, T)
    for i, r in enumerate(rows):
        input_ids[i, : len(r)] = torch.tensor(r)
        attention_mask[i, : len(r)] = 1
    return input_ids, attention_mask


@pytest.fixture(scope="module")
def batch():
    # N*T = 4*13 = 52 positions, 33 of which have a target: chunk sizes 1, 5, 7, 32 do not divide them.
    return _ragged_batch([13, 9, 1, 6], width=13, seed=1)


@pytest.mark.parametrize("chunk_size", [1, 5, 7, 32, 512])
def test_chunked_equals_naive_on_ragged_batch(tiny_model, batch, chunk_size):
    input_ids, attention_mask = batch
    with torch.no_grad():
        ref = naive_token_logprobs(tiny_model, input_ids, attention_mask)
        got = token_logprobs(tiny_model, input_ids, attention_mask, chunk_size=chunk_size)
    assert got.shape == input_ids.shape and got.dtype == torch.float32
    assert (got - ref).abs().max().item() < 1e-5
    # position 0 and every padding position are exactly 0; real positions are real logprobs (< 0)
    assert torch.all(got[:, 0] == 0)
    assert torch.all(got[attention_mask == 0] == 0)
    real = attention_mask.bool().clone()
    real[:, 0] = False
    assert torch.all(got[real] < 0)
    # a random-init model is near uniform: logprobs around -log(V)
    assert abs(got[real].mean().item() + torch.log(torch.tensor(float(VOCAB))).item()) < 1.0


def test_padding_content_and_batchmates_do_not_change_a_row(tiny_model, batch):
    input_ids, attention_mask = batch
    other = input_ids.clone()
    other[attention_mask == 0] = 7  # different padding ids
    with torch.no_grad():
        a = token_logprobs(tiny_model, input_ids, attention_mask, chunk_size=5)
        b = token_logprobs(tiny_model, other, attention_mask, chunk_size=5)
        alone = token_logprobs(tiny_model, input_ids[1:2, :9], attention_mask[1:2, :9])
    torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    torch.testing.assert_close(a[1:2, :9], alone, rtol=0, atol=1e-5)


@pytest.mark.parametrize("chunk_size", [3, 64])
def test_gradients_match_naive(batch, chunk_size):
    input_ids, attention_mask = batch
    grads = []
    for fn in (naive_token_logprobs, lambda *a: token_logprobs(*a, chunk_size=chunk_size)):
        model = tiny_random_model(seed=3)
        model.zero_grad()
        lp = fn(model, input_ids, attention_mask)
        (lp * attention_mask).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    naive, chunked = grads
    assert naive.keys() == chunked.keys()
    for name in naive:
        assert chunked[name] is not None
        assert naive[name].abs().sum() > 0, name  # every parameter gets gradient (else the check is vacuous)
        # atol scales with the tensor: summation order (thread count, chunking) moves near-zero entries of
        # sums over many positions (the tied embedding's gradient) by ~1e-6 of the largest entry; a mask
        # or offset error moves them by O(1) of it.
        scale = naive[name].abs().max().item()
        torch.testing.assert_close(chunked[name], naive[name], rtol=1e-4, atol=1e-5 * scale, msg=name)


def test_gradients_with_gradient_checkpointing_match(batch):
    input_ids, attention_mask = batch
    model = tiny_random_model(seed=4)
    token_logprobs(model, input_ids, attention_mask, chunk_size=4).sum().backward()
    plain = {n: p.grad.clone() for n, p in model.named_parameters()}
    model = enable_gradient_checkpointing(tiny_random_model(seed=4)).train()
    assert model.is_activation_checkpointing
    token_logprobs(model, input_ids, attention_mask, chunk_size=4).sum().backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, plain[n], rtol=1e-4, atol=1e-6, msg=n)


@pytest.mark.parametrize("temperature", [0.0, 0.5, 1.0, 2.0])
def test_temperature(tiny_model, batch, temperature):
    input_ids, attention_mask = batch
    with torch.no_grad():
        ref = naive_token_logprobs(tiny_model, input_ids, attention_mask, temperature)
        got = token_logprobs(tiny_model, input_ids, attention_mask, temperature=temperature, chunk_size=7)
        at_one = token_logprobs(tiny_model, input_ids, attention_mask, chunk_size=7)
    assert (got - ref).abs().max().item() < 1e-5
    if temperature in (0.0, 1.0):
        torch.testing.assert_close(got, at_one, rtol=0, atol=0)
    else:
        assert (got - at_one).abs().max().item() > 1e-3  # the temperature is actually applied


def test_entropy_matches_naive(tiny_model, batch):
    input_ids, attention_mask = batch
    with torch.no_grad():
        ref_lp, ref_ent = naive_token_logprobs(tiny_model, input_ids, attention_mask, 0.7, return_entropy=True)
        lp, ent = token_logprobs(
            tiny_model, input_ids, attention_mask, temperature=0.7, chunk_size=5, return_entropy=True
        )
    assert ent.shape == input_ids.shape and ent.dtype == torch.float32
    assert (lp - ref_lp).abs().max().item() < 1e-5
    assert (ent - ref_ent).abs().max().item() < 1e-4
    assert torch.all(ent[attention_mask == 0] == 0) and torch.all(ent[:, 0] == 0)
    real = attention_mask.bool().clone()
    real[:, 0] = False
    assert torch.all(ent[real] > 0) and torch.all(ent[real] <= torch.log(torch.tensor(float(VOCAB))) + 1e-4)


def test_entropy_gradient_matches_naive(batch):
    input_ids, attention_mask = batch
    grads = []
    for chunked in (False, True):
        model = tiny_random_model(seed=5)
        if chunked:
            _, ent = token_logprobs(model, input_ids, attention_mask, chunk_size=6, return_entropy=True)
        else:
            _, ent = naive_token_logprobs(model, input_ids, attention_mask, return_entropy=True)
        ent.sum().backward()
        grads.append(model.lm_head.weight.grad.clone())
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_matches_logprobs_recorded_by_generate(tiny_model, temperature):
    contexts = [[1, 520, 33, 9001, 77, 4, 12], [1, 6000, 301]]
    gens = generate(
        tiny_model,
        contexts,
        max_new_tokens=6,
        temperature=temperature,
        stop_ids=[2],
        pad_id=SMOLLM2_PAD_TOKEN_ID,
        seeds=[11, 12],
    )
    rows = [ctx + g.token_ids for ctx, g in zip(contexts, gens)]
    input_ids, attention_mask = _right_pad(rows)
    assert len(set(len(r) for r in rows)) > 1  # really ragged
    with torch.no_grad():
        lp = token_logprobs(tiny_model, input_ids, attention_mask, temperature=temperature, chunk_size=4)
    for i, (ctx, g) in enumerate(zip(contexts, gens)):
        recomputed = lp[i, len(ctx) : len(ctx) + len(g.token_ids)]
        torch.testing.assert_close(recomputed, torch.tensor(g.logprobs), rtol=0, atol=1e-4)


def test_errors(tiny_model, batch):
    input_ids, attention_mask = batch
    with pytest.raises(ValueError, match="chunk_size"):
        token_logprobs(tiny_model, input_ids, attention_mask, chunk_size=0)
    with pytest.raises(ValueError, match="attention_mask shape"):
        token_logprobs(tiny_model, input_ids, attention_mask[:, :-1])
    with pytest.raises(ValueError, match=r"\(N, T\)"):
        token_logprobs(tiny_model, input_ids[0], attention_mask[0])
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(tiny_model, input_ids, attention_mask, temperature=-1.0)
    with pytest.raises(ValueError, match="attention_mask shape"):
        naive_token_logprobs(tiny_model, input_ids, attention_mask[:2])


def test_rows_without_targets(tiny_model):
    input_ids = torch.tensor([[5, 6], [7, 8]])  # (2, 2)
    attention_mask = torch.tensor([[1, 0], [0, 0]])  # no position has a prediction
    lp, ent = token_logprobs(tiny_model, input_ids, attention_mask, return_entropy=True)
    assert torch.all(lp == 0) and torch.all(ent == 0) and lp.shape == (2, 2)
