"""`--engine vllm` (`agents.engines.vllm_engine.VLLMEngine`) against the HF engine on the same weights: greedy ids,
logprobs, seeds, stop ids, prefix caching, the weight sync after an optimizer step and a role-wise GRPO run on the
lab world. vLLM is an optional dependency with its own environment: these tests run there (``make test-vllm``)
and are skipped where ``import vllm`` fails (``make test``).

Models: SmolLM2-135M (fp32), tiny Llama and Qwen3 models built from a config (head_dim 32: vLLM's CPU attention
takes head sizes 32 to 512, `agents.models.tiny_random_model`'s default 16 is below it) and lab-tiny.
"""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed here (make venv-vllm; make test-vllm)")

from agents.cli import main  # noqa: E402
from agents.engines.registry import HFEngine, make_engine, resolve_engine  # noqa: E402
from agents.engines.vllm_engine import VLLMEngine  # noqa: E402
from agents.models import LAB_TINY_MODEL, default_store, load_tokenizer, tiny_random_model  # noqa: E402
from agents.training.logprobs import token_logprobs  # noqa: E402

LOGPROB_ATOL = 1e-4
"""Largest |log π_vLLM − log π_HF| allowed per token, fp32 on a CPU (measured: 2.6e-5 on SmolLM2-135M over 24
tokens, 1e-6 on the tiny models): vLLM's fused kernels (oneDNN GEMMs, its own RMSNorm, rotary and paged attention)
round differently from Transformers' modules."""
EOS = 2  # SmolLM2's <|im_end|>, the tiny models' eos


def _tiny(arch: str, seed: int = 0, **config: int) -> torch.nn.Module:
    return tiny_random_model(arch, seed=seed, hidden_size=64, num_attention_heads=2, num_key_value_heads=1, **config)


def _model(name: str) -> torch.nn.Module:
    """A fresh (unshared: the tests train it) fp32 model."""
    if name == "smollm2-135m":
        return default_store().model(name, shared=False)
    return _tiny(name.removeprefix("tiny-"))


def _prompts() -> list[list[int]]:
    """Chat-rendered SmolLM2 prompts of different lengths (one over 500 tokens)."""
    tok = load_tokenizer()
    texts = [
        "What is the capital of France?",
        "Write a haiku about the sea.",
        "List three prime numbers and explain why each is prime. " * 40,
    ]
    rendered = [
        tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=False)
        for t in texts
    ]
    return [tok.encode(r, add_special_tokens=False) for r in rendered]


def _engines(model: torch.nn.Module) -> tuple[VLLMEngine, HFEngine]:
    """A vLLM engine (a small KV cache: 0.5 GiB) and the HF engine over the same model."""
    engine = make_engine("vllm", model, EOS, kv_cache_gib=0.5)
    assert isinstance(engine, VLLMEngine)
    return engine, HFEngine(model, EOS, kv_cache=False)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3", "smollm2-135m"])
def test_greedy_ids_equal_the_hf_engines_and_sampled_logprobs_are_the_trainers(name):
    model = _model(name)
    assert resolve_engine("auto", model) == ("vllm" if name == "smollm2-135m" else "hf")  # the default's choice
    vllm_engine, hf_engine = _engines(model)
    prompts = _prompts()
    a = vllm_engine.generate(prompts, max_new_tokens=32, temperature=0.0, stop_ids=[EOS])
    b = hf_engine.generate(prompts, max_new_tokens=32, temperature=0.0, stop_ids=[EOS])
    for x, y in zip(a, b):
        assert x.token_ids == y.token_ids and x.stopped == y.stopped
        assert len(x.logprobs) == len(x.token_ids)
        assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=LOGPROB_ATOL, rtol=0)

    kw = dict(max_new_tokens=12, temperature=0.7, stop_ids=[EOS])
    sampled = vllm_engine.generate(prompts, seeds=[1, 2, 3], **kw)
    for context, gen in zip(prompts, sampled):  # logprobs after temperature: the trainer's recompute at 0.7
        ids = torch.tensor([context + gen.token_ids])
        expected = token_logprobs(model, ids, torch.ones_like(ids), temperature=0.7)[0, len(context) :]
        assert torch.allclose(torch.tensor(gen.logprobs), expected, atol=LOGPROB_ATOL, rtol=0)
    # a row's sample depends on its seed and context only, not on the batch around it
    alone = vllm_engine.generate([prompts[1]], seeds=[2], **kw)[0]
    reordered = vllm_engine.generate([prompts[2], prompts[1]], seeds=[9, 2], **kw)[1]
    assert alone.token_ids == reordered.token_ids == sampled[1].token_ids
    others = vllm_engine.generate([prompts[1]] * 4, seeds=[10, 11, 12, 13], **kw)
    assert len({tuple(g.token_ids) for g in others}) > 1


def test_rows_stop_on_the_given_ids_only():
    """The model's own EOS does not end a row (equal-work benchmarks rely on it); a stop id does, and is kept."""
    model = _tiny("llama")
    engine, _ = _engines(model)
    context = [_prompts()[0]]
    first = engine.generate(context, max_new_tokens=1, temperature=0.0, stop_ids=[])[0].token_ids[0]
    model.config.eos_token_id = first  # a greedy row now emits the model's EOS at once
    model.generation_config.eos_token_id = first
    engine, _ = _engines(model)
    gen = engine.generate(context, max_new_tokens=5, temperature=0.0, stop_ids=[])[0]
    assert gen.token_ids[0] == first and len(gen.token_ids) == 5 and not gen.stopped
    stopped = engine.generate(context, max_new_tokens=5, temperature=0.0, stop_ids=[first])[0]
    assert stopped.token_ids == [first] and stopped.stopped
    with pytest.raises(ValueError, match="at least one token"):
        engine.generate([[]], max_new_tokens=5, temperature=0.0, stop_ids=[])
    with pytest.raises(ValueError, match="seeds"):
        engine.generate(context, max_new_tokens=5, temperature=1.0, stop_ids=[], seeds=[1, 2])


def test_seeded_rows_whose_prompts_exceed_one_engine_step_are_all_sampled_and_the_context_limit_binds():
    """More prompt tokens than one vLLM step takes (4096 with a 1024-token context limit): vLLM schedules them
    over several steps. Splitting a seeded row's prompt there would rewind its CPU generator, which CPU generators
    cannot do; the engine keeps every prompt whole, and the rows stay reproducible from their seeds."""
    engine, _ = _engines(_tiny("llama", max_position_embeddings=1024))
    contexts = [[1] + [100 + (7 * i + j) % 40000 for j in range(299)] for i in range(16)]  # 4800 tokens
    kw = dict(max_new_tokens=4, temperature=1.0, stop_ids=[])
    gens = engine.generate(contexts, seeds=list(range(16)), **kw)
    assert [len(g.token_ids) for g in gens] == [4] * 16
    assert engine.generate(contexts[5:6], seeds=[5], **kw)[0].token_ids == gens[5].token_ids
    # the context limit binds: a longer context is refused, a row that reaches it ends there
    assert engine.max_model_len == 1024
    with pytest.raises(ValueError, match="max_model_len=1024"):
        engine.generate([[1] * 1100], max_new_tokens=4, temperature=0.0, stop_ids=[])
    (cut,) = engine.generate([[1] * 1020], max_new_tokens=8, temperature=0.0, stop_ids=[])
    assert len(cut.token_ids) == 4 and not cut.stopped


def test_a_context_that_extends_the_last_one_reads_its_prefix_from_the_cache_until_the_weights_change():
    engine, _ = _engines(_tiny("llama"))
    block = engine.llm.llm_engine.vllm_config.cache_config.block_size
    turn1 = _prompts()[2]
    assert len(turn1) > 2 * block
    gen = engine.generate([turn1], max_new_tokens=8, temperature=0.0, stop_ids=[])[0]
    before = dict(engine.stats)
    turn2 = turn1 + gen.token_ids + [EOS, 1, 9, 10, 11]  # the next turn's context extends the last one
    engine.generate([turn2], max_new_tokens=4, temperature=0.0, stop_ids=[])
    hit = engine.stats["cached_prompt_tokens"] - before["cached_prompt_tokens"]
    assert hit >= (len(turn1) // block) * block and hit < len(turn2)
    engine.weights_updated()  # the cached keys and values belong to the old weights
    before = dict(engine.stats)
    engine.generate([turn2], max_new_tokens=4, temperature=0.0, stop_ids=[])
    assert engine.stats["cached_prompt_tokens"] == before["cached_prompt_tokens"]


@pytest.mark.parametrize("name", ["tiny-llama", "smollm2-135m"])
def test_after_an_optimizer_step_and_a_sync_vllm_samples_from_the_new_weights(name):
    """One AdamW step on the trained model, `weights_updated`, and vLLM's greedy ids and logprobs equal the HF
    engine's on the new weights (both tied-embedding models: the LM head is the embedding matrix)."""
    model = _model(name)
    vllm_engine, hf_engine = _engines(model)
    prompts = _prompts()
    kw = dict(max_new_tokens=16, temperature=0.0, stop_ids=[EOS])
    old = vllm_engine.generate(prompts, **kw)
    target = torch.tensor([prompts[0] + [504, 3458, 282, 4649, 314] * 4])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3 if name == "smollm2-135m" else 1e-2)
    model.train()
    loss = -token_logprobs(model, target, torch.ones_like(target)).sum()
    loss.backward()
    optimizer.step()
    model.eval()
    vllm_engine.weights_updated()
    assert vllm_engine.weight_version == 1
    new, expected = vllm_engine.generate(prompts, **kw), hf_engine.generate(prompts, **kw)
    # the step moved the model: some row's first token (sampled from the same context) changed, or its logprob did
    assert any(
        o.token_ids[0] != n.token_ids[0] or abs(o.logprobs[0] - n.logprobs[0]) > 100 * LOGPROB_ATOL
        for o, n in zip(old, new)
    )
    for x, y in zip(new, expected):
        assert x.token_ids == y.token_ids
        assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=LOGPROB_ATOL, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["shared", "per_role"])
def test_envace_train_on_the_lab_with_engine_vllm(tmp_path, policy):
    """Two role-wise GRPO steps of `envace train --engine vllm` on EnvACE-Lab with lab-tiny: the rollouts sample
    with vLLM, every update is pushed to it, and the trainer's recompute agrees with vLLM's logprobs at both steps.

    The untrained lab-tiny earns no reward (all advantages 0), so an entropy bonus and a large learning rate make
    the update move the weights: step 2's rollouts then come from the synced weights, and a missed sync would
    show as a mismatch far above the tolerance."""
    run = tmp_path / "run"
    args = ["train", "--run-dir", str(run), "--engine", "vllm", "--model", LAB_TINY_MODEL, "--suite", "lab"]
    args += ["--categories", "relocate", "ship", "--num-steps", "2", "--batch-tasks", "2", "--group-size", "4"]
    args += ["--max-new-tokens", "40", "--rehearse-max-new-tokens", "40", "--max-steps-per-turn", "4"]
    args += ["--entropy-coef", "0.01", "--optim.lr", "1e-2"]
    args += ["--policy", policy, "--run.threads", "1", "--tensorboard", "false"]
    assert main(args) == 0
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert m["rollout/generated_tokens"] > 0 and m["train/skipped_update"] == 0.0
        assert 0.0 <= m["train/logprob_mismatch"] < LOGPROB_ATOL


def test_the_equal_work_benchmark_runs_both_engines_and_its_result_is_rendered(tmp_path):
    """`benchmarks.perf.engines_equal_work` on lab-tiny: both engines generate exactly `--new` tokens per row (the
    script raises otherwise), and its results.json is stored and rendered by `benchmarks.results`."""
    from benchmarks import results
    from benchmarks.perf import engines_equal_work

    out = tmp_path / "run"
    args = ["--workloads", "lab-tiny", "--batches", "8", "--new", "4", "--repeats", "1", "--kv-cache-gib", "1"]
    args += ["--out", str(out)]
    result = engines_equal_work.main(args)
    (row,) = result["rows"]
    assert row["batch"] == 8 and row["model"] == LAB_TINY_MODEL
    assert row["hf"]["tokens_per_s"] > 0 and row["vllm"]["tokens_per_s"] > 0
    store = tmp_path / "docs" / "results"
    results.store(out, store)
    page = results.render(store, tmp_path / "results.md").read_text()
    assert f"| lab-tiny ({LAB_TINY_MODEL}, {row['prompt_tokens']:.0f}) | 8 | {row['hf']['tokens_per_s']:.0f} |" in page
