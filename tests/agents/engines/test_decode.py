"""The lean decode step (`agents.engines.decode`) computes what the model's own forward computes."""

from __future__ import annotations

import pytest
import torch

from agents.engines.decode import supports_decode_step
from agents.engines.generation import generate
from agents.models import tiny_random_model


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_lean_decode_steps_give_the_model_forwards_ids_and_logprobs(arch):
    # initializer_range 0.2: attention then depends strongly on positions and padding, so a wrong rotary
    # position, mask column or KV write moves the logprobs far beyond the tolerance
    model = tiny_random_model(arch, seed=1, initializer_range=0.2)
    assert supports_decode_step(model)
    contexts = [[5, 9, 17, 33, 8], [40, 41], [7, 7, 7, 7, 7, 7, 7, 7, 7], [40, 41]]  # ragged: padded columns
    for temperature in (0.0, 1.0):
        runs = [
            generate(
                model,
                contexts,
                max_new_tokens=12,
                temperature=temperature,
                stop_ids=[],
                pad_id=0,
                seeds=[3, 4, 5, 6],
                fast_decode=fast,
            )
            for fast in (True, False)
        ]
        for lean, plain in zip(*runs):
            assert lean.token_ids == plain.token_ids
            torch.testing.assert_close(torch.tensor(lean.logprobs), torch.tensor(plain.logprobs), atol=1e-5, rtol=0)


def test_models_the_lean_step_does_not_cover_run_their_own_forward():
    model = tiny_random_model("llama")
    handle = model.model.layers[0].register_forward_hook(lambda *args: None)  # somebody measures the forward
    assert not supports_decode_step(model)
    handle.remove()
    assert supports_decode_step(model)
    model.train()
    assert not supports_decode_step(model)
    model.eval()
    model.config.hidden_act = "gelu"
    assert not supports_decode_step(model)
    model.config.hidden_act = "silu"
    plain = model.model.layers[1].mlp.up_proj
    model.model.layers[1].mlp.up_proj = torch.nn.Sequential(plain)  # a wrapped projection (LoRA, quantized, ...)
    assert not supports_decode_step(model)
    model.model.layers[1].mlp.up_proj = plain
    assert supports_decode_step(model)
