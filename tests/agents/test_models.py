"""Model loading: tiny random models, local folders, name errors, and the SmolLM2 GGUF -> safetensors cache."""

import logging

import pytest
import torch

from agents.models import (
    DEFAULT_MODEL,
    clear_model_cache,
    ensure_smollm2_converted,
    load_model,
    load_model_and_tokenizer,
    smollm2_model_dir,
    tiny_model_and_tokenizer,
    tiny_random_model,
)

PROMPT_IDS = torch.tensor([[1, 9690, 198, 2683, 314, 253, 5356, 30, 2]])  # (1, 9)


def _same_weights(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


# --- tiny random models ---------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_tiny_model_is_deterministic_per_seed_and_differs_across_seeds(arch):
    a, b, c = tiny_random_model(arch, seed=0), tiny_random_model(arch, seed=0), tiny_random_model(arch, seed=1)
    assert _same_weights(a, b)
    assert not torch.equal(a.model.layers[0].self_attn.q_proj.weight, c.model.layers[0].self_attn.q_proj.weight)
    assert not torch.equal(a.get_input_embeddings().weight, c.get_input_embeddings().weight)


def test_tiny_model_leaves_the_global_rng_alone():
    before = torch.random.get_rng_state()
    tiny_random_model(seed=3)
    assert torch.equal(before, torch.random.get_rng_state())


@pytest.mark.parametrize(("arch", "cls"), [("llama", "LlamaForCausalLM"), ("qwen3", "Qwen3ForCausalLM")])
def test_tiny_model_shape_forward_and_generate(arch, cls):
    model = tiny_random_model(arch)
    assert type(model).__name__ == cls
    assert not model.training
    assert model.dtype == torch.float32
    assert model.config.num_hidden_layers == 2
    n_params = sum(p.numel() for p in model.parameters())
    assert 3_000_000 <= n_params <= 4_000_000, n_params
    with torch.no_grad():
        logits = model(PROMPT_IDS).logits
    assert logits.shape == (1, PROMPT_IDS.shape[1], 49152)
    assert torch.isfinite(logits).all()
    out = model.generate(PROMPT_IDS, attention_mask=torch.ones_like(PROMPT_IDS), max_new_tokens=5, do_sample=False)
    assert out.shape[0] == 1 and PROMPT_IDS.shape[1] < out.shape[1] <= PROMPT_IDS.shape[1] + 5
    assert torch.equal(out[:, : PROMPT_IDS.shape[1]], PROMPT_IDS)
    again = model.generate(PROMPT_IDS, attention_mask=torch.ones_like(PROMPT_IDS), max_new_tokens=5, do_sample=False)
    assert torch.equal(out, again)


def test_tiny_model_matches_the_tokenizer(smol_tokenizer, tiny_model):
    cfg = tiny_model.config
    assert cfg.vocab_size == len(smol_tokenizer) == 49152
    assert cfg.bos_token_id == smol_tokenizer.bos_token_id
    assert cfg.eos_token_id == smol_tokenizer.eos_token_id
    assert cfg.pad_token_id == smol_tokenizer.pad_token_id
    assert tiny_model.generation_config.eos_token_id == smol_tokenizer.eos_token_id
    ids = smol_tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )["input_ids"]
    with torch.no_grad():
        assert tiny_model(ids).logits.shape[-1] == len(smol_tokenizer)


def test_tiny_model_fixture_is_the_seed_zero_llama(tiny_model):
    assert type(tiny_model).__name__ == "LlamaForCausalLM"
    assert _same_weights(tiny_model, tiny_random_model("llama", seed=0))


def test_tiny_model_and_tokenizer_pairs_them(smol_tokenizer):
    model, tok = tiny_model_and_tokenizer("qwen3", seed=2)
    assert tok is smol_tokenizer
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert _same_weights(model, tiny_random_model("qwen3", seed=2))


@pytest.mark.parametrize(
    "kwargs",
    [{"arch": "gpt2"}, {"hidden_size": 65}, {"num_attention_heads": 4, "num_key_value_heads": 3}],
)
def test_tiny_model_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        tiny_random_model(**kwargs)


# --- local folders and errors ---------------------------------------------------------------------


def test_local_folder_round_trip_and_memo(tmp_path, smol_tokenizer):
    model = tiny_random_model("qwen3", seed=5)
    model.save_pretrained(tmp_path, safe_serialization=True)
    smol_tokenizer.save_pretrained(tmp_path)

    loaded = load_model(str(tmp_path))
    assert type(loaded).__name__ == "Qwen3ForCausalLM"
    assert not loaded.training
    with torch.no_grad():
        assert torch.equal(model(PROMPT_IDS).logits, loaded(PROMPT_IDS).logits)

    assert load_model(str(tmp_path)) is loaded  # memoised per (folder, dtype, device)
    assert load_model(str(tmp_path / ".." / tmp_path.name)) is loaded  # same folder, other spelling
    fresh = load_model(str(tmp_path), shared=False)
    assert fresh is not loaded and _same_weights(fresh, loaded)
    bf16 = load_model(str(tmp_path), dtype=torch.bfloat16)
    assert bf16 is not loaded and bf16.dtype == torch.bfloat16

    clear_model_cache()
    reloaded, tok = load_model_and_tokenizer(str(tmp_path))
    assert reloaded is not loaded and _same_weights(reloaded, loaded)
    assert tok.encode("hello world") == smol_tokenizer.encode("hello world")


def test_a_training_run_folder_is_refused_naming_its_newest_checkpoints_model(tmp_path, smol_tokenizer):
    """``--model runs/lab/sft``: a run folder holds a config.json of its own but no weights; the error names the
    model folder of its newest complete checkpoint (an incomplete one, without trainer_state.json, is skipped),
    which then loads."""
    run = tmp_path / "sft"
    (run / "checkpoints").mkdir(parents=True)  # a run that has not finished its first checkpoint
    (run / "config.json").write_text("{}")  # the run's own config, not a model's
    with pytest.raises(ValueError, match="no complete checkpoint yet"):
        load_model(str(run))
    for step, seed in ((10, 1), (20, 2), (30, 3)):
        folder = run / "checkpoints" / f"step_{step:06d}"
        tiny_random_model("llama", seed=seed).save_pretrained(folder / "model", safe_serialization=True)
        smol_tokenizer.save_pretrained(folder / "model")
        if step != 30:
            (folder / "trainer_state.json").write_text("{}")
    newest = run / "checkpoints" / "step_000020" / "model"
    for load in (load_model, load_model_and_tokenizer):
        with pytest.raises(ValueError, match=f"training run folder, not a model folder; .* its newest: '{newest}'"):
            load(str(run))
    loaded, tok = load_model_and_tokenizer(str(newest))
    assert _same_weights(loaded, tiny_random_model("llama", seed=2))


def test_unknown_bare_name_is_a_value_error_naming_the_known_ones():
    with pytest.raises(ValueError, match="smollm2-135m"):
        load_model("gpt-17-ultra")


def test_missing_path_is_a_file_not_found_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no model folder"):
        load_model(str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="offline"):
        load_model("HuggingFaceTB/SmolLM2-135M-Instruct")


def test_folder_without_config_or_a_file_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="config.json"):
        load_model(str(tmp_path))
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"")
    with pytest.raises(ValueError, match="not a model folder"):
        load_model(str(weights))


# --- the real SmolLM2-135M-Instruct (GGUF converted once into the cache) ---------------------------


@pytest.mark.slow  # the first conversion of the GGUF takes ~30 s; later runs load the cache in ~1 s
def test_smollm2_converts_once_then_loads_from_cache_and_answers(smol_tokenizer, caplog):
    folder = ensure_smollm2_converted()
    assert folder == smollm2_model_dir()
    for name in (
        "model.safetensors",
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ):
        assert (folder / name).is_file(), name
    assert "quantization_config" not in (folder / "config.json").read_text()
    stamp = (folder / "model.safetensors").stat().st_mtime_ns

    clear_model_cache()
    with caplog.at_level(logging.INFO, logger="agents.models"):
        model = load_model(DEFAULT_MODEL)
    assert not any("converting" in r.getMessage() for r in caplog.records)  # came from the cache
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp
    assert load_model(DEFAULT_MODEL) is model
    assert type(model).__name__ == "LlamaForCausalLM" and model.dtype == torch.float32
    assert sum(p.numel() for p in model.parameters()) == 134_515_008

    ids = smol_tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )["input_ids"]
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False)
    answer = smol_tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer, answer


def test_envace_cache_moves_the_default_cache_root_of_scripts_and_tests_too(tmp_path):
    """A store built without a root lives under $ENVACE_CACHE where it is set, in a fresh process as a user's
    script starts (the default store is built at import), else under ~/.cache/envace_gym."""
    import os
    import subprocess
    import sys

    probe = "from agents.models import cache_dir; print(cache_dir())"
    env = {k: v for k, v in os.environ.items() if k != "ENVACE_CACHE"}
    moved = subprocess.run(
        [sys.executable, "-c", probe], env={**env, "ENVACE_CACHE": str(tmp_path)}, capture_output=True, text=True
    )
    assert moved.returncode == 0, moved.stderr
    assert moved.stdout.strip() == str(tmp_path)
    home = subprocess.run(
        [sys.executable, "-c", probe], env={**env, "HOME": str(tmp_path / "home")}, capture_output=True, text=True
    )
    assert home.stdout.strip() == str(tmp_path / "home" / ".cache" / "envace_gym")
