"""`smollm2-lab`: SmolLM2-135M-Instruct cut to the EnvACE-Lab world (built once into the cache)."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch

from agents.models import (
    LAB_MODEL,
    LAB_MODEL_LAYERS,
    ensure_lab_model,
    lab_model_dir,
    load_model,
    load_tokenizer,
)
from agents.training.demonstrations import build_demonstrations

pytestmark = pytest.mark.slow  # the first build converts SmolLM2 (~30 s) and cuts it (~15 s); later runs load it


@pytest.fixture(scope="module")
def lab_pair():
    return load_model(LAB_MODEL), load_tokenizer(LAB_MODEL)


def test_the_folder_is_built_once_and_is_complete(lab_pair):
    folder = ensure_lab_model()
    assert folder == lab_model_dir()
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert ensure_lab_model() == folder and (folder / "model.safetensors").stat().st_mtime_ns == stamp
    model, tokenizer = lab_pair
    assert model.config.num_hidden_layers == LAB_MODEL_LAYERS
    assert model.config.vocab_size == len(tokenizer) < 1000
    assert (tokenizer.bos_token, tokenizer.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert model.config.eos_token_id == tokenizer.eos_token_id


def test_the_cut_tokenizer_splits_unseen_lab_tasks_as_smollm2_does(lab_pair):
    _, tokenizer = lab_pair
    smollm2 = load_tokenizer()
    demos, _ = build_demonstrations(tokenizer, "lab-stated", None, "test", max_tokens=None)  # the build saw train only
    assert len(demos) > 100
    for demo in demos:
        text = tokenizer.decode(demo.token_ids)
        pieces = smollm2.convert_ids_to_tokens(smollm2.encode(text, add_special_tokens=False))
        assert tokenizer.convert_ids_to_tokens(demo.token_ids) == pieces, demo.task.id
    odd = "naïve 東京 move(item='x')\n"  # outside the lab corpus: single-byte pieces, still lossless
    assert tokenizer.decode(tokenizer.encode(odd, add_special_tokens=False)) == odd


def test_the_cut_model_gives_smollm2s_logits_on_the_kept_tokens(lab_pair):
    model, tokenizer = lab_pair
    full = load_model()
    assert LAB_MODEL_LAYERS == full.config.num_hidden_layers  # every layer kept: only the vocabulary is cut
    smollm2 = load_tokenizer()
    text = "<|im_start|>user\nShip the lamp from the north dock.<|im_end|>\n<|im_start|>assistant\n"
    cut_ids = torch.tensor([tokenizer.encode(text, add_special_tokens=False)])
    full_ids = torch.tensor([smollm2.encode(text, add_special_tokens=False)])
    kept = torch.tensor(smollm2.convert_tokens_to_ids(tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))))
    assert torch.equal(kept[cut_ids], full_ids)
    with torch.no_grad():
        expected = full(full_ids).logits[..., kept]  # (1, T, V_lab)
        logits = model(cut_ids).logits
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)


def test_lab_prompts_are_short_and_list_the_tools_as_signatures(lab_pair):
    _, tokenizer = lab_pair
    env = gym.make("EnvACE-Tool-v0", suite="lab-stated", model=LAB_MODEL, categories=["full_job"])
    env.reset(seed=0)
    trajectory = env.unwrapped.trajectory
    prompt = tokenizer.decode(trajectory.token_ids)
    assert "Tools: locate(item) list_shelf(shelf) move(item, shelf) pack(item) ship(box, dock)\n" in prompt
    assert len(trajectory.token_ids) < 400
    env.close()
