"""Generation engines (`agents.engines.registry`): a second engine registered from a test drives training and
evaluation with no change to the trainer, and the built-in engines sample alike."""

from __future__ import annotations

import pytest

import tests.testing_env  # noqa: F401  (registers the scripted suites)
from agents.cli import main
from agents.config import TrainConfig
from agents.engines.registry import (
    VLLM_MIN_PARAMETERS,
    GenerationEngine,
    HFEngine,
    make_engine,
    register_engine,
    registered_engines,
    resolve_engine,
)
from agents.policy import load_policy
from agents.training.trainer import RoleWiseGRPOTrainer

FAST = dict(
    model="tiny-random",
    suite="scripted-length",
    categories=[],
    batch_tasks=2,
    group_size=2,
    max_new_tokens=6,
    rehearse_max_new_tokens=6,
    max_steps_per_turn=2,
    min_solvable_fraction=0.0,
    optim={"lr": 1e-3},
    tensorboard=False,
)


class RecordingEngine(HFEngine):
    """The HF engine, counting the rows it sampled and the versions it was told about."""

    instances: list[RecordingEngine] = []

    def __init__(self, model, pad_id):
        super().__init__(model, pad_id, kv_cache=False)
        self.rows = 0
        RecordingEngine.instances.append(self)

    def generate(self, contexts, **kwargs):
        self.rows += len(contexts)
        return super().generate(contexts, **kwargs)


register_engine("recording", RecordingEngine)


def test_a_registered_engine_samples_every_rollout_and_hears_of_every_update(tmp_path):
    RecordingEngine.instances.clear()
    trainer = RoleWiseGRPOTrainer(TrainConfig(run_dir=str(tmp_path), num_steps=2, engine="recording", **FAST))
    (engine,) = RecordingEngine.instances
    assert trainer.policy.engine is engine and isinstance(engine, GenerationEngine)
    trainer.train(progress=False)
    assert engine.rows >= 2 * 2 * 2  # at least one ACT row per trajectory and step (B = K = 2)
    assert engine.weight_version == 2


def test_a_built_engine_can_be_passed_to_the_trainer_and_eval_takes_an_engine_by_name(tmp_path):
    policy = load_policy("tiny-random")
    engine = RecordingEngine(policy.model, policy.pad_id)
    trainer = RoleWiseGRPOTrainer(TrainConfig(run_dir=str(tmp_path / "t"), num_steps=1, **FAST), engine=engine)
    trainer.train(progress=False)
    assert engine.rows > 0 and engine.weight_version == 1
    RecordingEngine.instances.clear()
    assert (
        main(
            [
                "eval",
                "--model",
                "tiny-random",
                "--suite",
                "scripted",
                "--split",
                "all",
                "--limit",
                "1",
                "--max-new-tokens",
                "4",
                "--max-steps-per-turn",
                "1",
                "--min-solvable-fraction",
                "0",
                "--engine",
                "recording",
                "--out",
                str(tmp_path / "ev"),
            ]
        )
        == 0
    )
    assert RecordingEngine.instances and RecordingEngine.instances[-1].rows > 0


def test_cached_and_uncached_hf_engines_sample_the_same_tokens():
    policy = load_policy("tiny-random", kv_cache=False)
    contexts = [list(range(5, 40)), list(range(5, 30)) + [7, 8]]
    cached, plain = HFEngine(policy.model, policy.pad_id), make_engine("hf-nocache", policy.model, policy.pad_id)
    for _ in range(2):  # the second round continues cached prefixes
        a = cached.generate(contexts, max_new_tokens=5, temperature=1.0, stop_ids=policy.stop_ids, seeds=[1, 2])
        b = plain.generate(contexts, max_new_tokens=5, temperature=1.0, stop_ids=policy.stop_ids, seeds=[1, 2])
        assert [g.token_ids for g in a] == [g.token_ids for g in b]


@pytest.mark.parametrize("name", ["hf", "hf-generate"])
def test_without_stop_ids_every_engine_generates_exactly_max_new_tokens(name):
    """No stop id means the full budget, even where the model's own EOS is sampled (the equal-work
    benchmarks rely on it)."""
    policy = load_policy("tiny-random")
    engine = make_engine(name, policy.model, policy.pad_id)
    context = [[1, 2, 3, 4]]
    first = engine.generate(context, max_new_tokens=1, temperature=0.0, stop_ids=[])[0].token_ids[0]
    policy.model.generation_config.eos_token_id = first  # greedy decoding now emits the model's EOS at once
    gen = engine.generate(context, max_new_tokens=5, temperature=0.0, stop_ids=[])[0]
    assert gen.token_ids[0] == first and len(gen.token_ids) == 5 and not gen.stopped
    assert len(engine.generate(context, max_new_tokens=5, temperature=0.0, stop_ids=[first])[0].token_ids) == 1


def test_an_unknown_engine_fails_fast_with_the_registered_names(tmp_path):
    assert {"hf", "hf-nocache"} <= set(registered_engines())
    with pytest.raises(ValueError, match="engine must be one of"):
        TrainConfig(run_dir=str(tmp_path), engine="vllm-not-here", **FAST)
    with pytest.raises(ValueError, match="unknown generation engine"):
        make_engine("vllm-not-here", None, 0)


def test_the_vllm_engine_is_registered_but_imports_vllm_only_when_built():
    """`--engine vllm` is a valid name everywhere; building it where vLLM is absent says what to install."""
    import importlib.util

    assert "vllm" in registered_engines()
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here: tests/agents/engines/test_vllm_engine.py covers it")
    policy = load_policy("tiny-random")
    with pytest.raises(ImportError, match="--engine vllm needs vLLM"):
        make_engine("vllm", policy.model, policy.pad_id)


def test_auto_is_vllm_where_installed_for_models_of_10m_parameters_or_more_else_hf(tmp_path):
    import importlib.util

    from agents.evaluation.evaluate import EvalConfig
    from agents.models import tiny_random_model
    from agents.policy import Policy

    policy = load_policy("tiny-random", kv_cache=False)
    small = policy.model  # 3.2M parameters
    big = tiny_random_model(hidden_size=256, num_attention_heads=4, num_key_value_heads=2)  # 12.6M in the embedding
    assert sum(p.numel() for p in small.parameters()) < VLLM_MIN_PARAMETERS <= sum(p.numel() for p in big.parameters())
    assert resolve_engine("auto", small) == "hf"
    assert resolve_engine("auto", big) == ("vllm" if importlib.util.find_spec("vllm") is not None else "hf")
    assert resolve_engine("hf-nocache", big) == "hf-nocache"
    # "auto" on the HF engine keeps the policy's cache setting
    assert Policy(small, policy.tokenizer, kv_cache=False, engine="auto").engine.kv_cache is None
    assert TrainConfig(run_dir=str(tmp_path)).engine == EvalConfig().engine == "auto"
