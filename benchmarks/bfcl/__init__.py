"""BFCL v4 (bfcl-eval 2026.3.23) as an envace-gym suite: tasks, real multi-turn backends, BFCL's checkers.

Importing this package sets ``BFCL_PROJECT_ROOT`` (if unset) to ``<cache>/bfcl`` before bfcl_eval is ever
imported (`benchmarks.bfcl._env`). Modules: `data` (tasks, split), `schema` (types to JSON Schema, tool
names), `backend` (`BFCLBackend`), `verify` (replay and AST verifiers), `suite` (`BFCLSuite`).
"""

from benchmarks.bfcl import _env  # noqa: F401  (must run before any bfcl_eval import)
from benchmarks.bfcl.backend import BFCLBackend, SingleTurnBackend
from benchmarks.bfcl.data import ALL_CATEGORIES, MULTI_TURN_CATEGORIES, SINGLE_TURN_CATEGORIES, split_of
from benchmarks.bfcl.suite import BFCLSuite

__all__ = [
    "BFCLSuite",
    "BFCLBackend",
    "SingleTurnBackend",
    "ALL_CATEGORIES",
    "MULTI_TURN_CATEGORIES",
    "SINGLE_TURN_CATEGORIES",
    "split_of",
]
