"""Where bfcl-eval writes and reads: set ``BFCL_PROJECT_ROOT`` before bfcl_eval is imported.

bfcl-eval creates result/score/lock folders under ``BFCL_PROJECT_ROOT`` when some of its modules are
imported (``constants/eval_config.py``), defaulting to a folder inside site-packages. Importing this module
sets it, if unset, to ``<cache>/bfcl`` where ``<cache>`` is ``$ENVACE_CACHE`` or ``~/.cache/envace_gym``.
Every module of `benchmarks.bfcl` imports this one first.
"""

from __future__ import annotations

import importlib.util
import os
from functools import lru_cache
from pathlib import Path

__all__ = ["cache_dir", "bfcl_data_dir"]


def cache_dir() -> Path:
    """``$ENVACE_CACHE`` if set, else ``~/.cache/envace_gym``."""
    return Path(os.environ.get("ENVACE_CACHE") or Path.home() / ".cache" / "envace_gym")


os.environ.setdefault("BFCL_PROJECT_ROOT", str(cache_dir() / "bfcl"))


@lru_cache(maxsize=None)
def bfcl_data_dir() -> Path:
    """The ``data/`` folder of the installed bfcl-eval package (found without importing it).

    Raises:
        ImportError: bfcl-eval is not installed.
    """
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("bfcl-eval is not installed; install bfcl-eval==2026.3.23 with --no-deps (DESIGN.md §4)")
    return Path(list(spec.submodule_search_locations)[0]) / "data"
