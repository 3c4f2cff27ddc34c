"""Where bfcl-eval writes and reads: set ``BFCL_PROJECT_ROOT`` before bfcl_eval is imported.

bfcl-eval creates result/score/lock folders under ``BFCL_PROJECT_ROOT`` when some of its modules are
imported (``constants/eval_config.py``), defaulting to a folder inside site-packages, and it has no other
way to be told. Importing this module sets it, if unset, to ``bfcl/`` under the model cache root
(`agents.models.default_cache_root`: ``$ENVACE_CACHE`` or ``~/.cache/envace_gym``). This is the one variable
the library writes, because a third-party package reads it at import. Every module of `benchmarks.bfcl`
imports this one first.
"""

from __future__ import annotations

import importlib.util
import os
from functools import cache
from pathlib import Path

__all__ = ["bfcl_data_dir"]

os.environ.setdefault(
    "BFCL_PROJECT_ROOT",
    str(Path(os.environ.get("ENVACE_CACHE") or Path.home() / ".cache" / "envace_gym").expanduser() / "bfcl"),
)


@cache
def bfcl_data_dir() -> Path:
    """The ``data/`` folder of the installed bfcl-eval package (found without importing it).

    Raises:
        ImportError: bfcl-eval is not installed.
    """
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("bfcl-eval is not installed; install bfcl-eval==2026.3.23 with --no-deps (docs/design.md §4)")
    return Path(list(spec.submodule_search_locations)[0]) / "data"
