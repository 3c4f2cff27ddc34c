"""Resolving the ``"module:attr"`` entry points of the registries (suites, rehearsers, engines).

A registry maps a name to a factory or to a ``"module:attr"`` string, imported the first time the name is
used (as Gymnasium's ``register(entry_point=...)``), so that registering loads nothing heavy.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["resolve_entry_point"]


def resolve_entry_point(entry: str | Callable[..., Any]) -> Callable[..., Any]:
    """The factory `entry` names: a callable as it is, or ``"module:attr"`` imported.

    Raises:
        ValueError: a string without ``":"``.
        ImportError, AttributeError: the module or attribute does not exist.
    """
    if not isinstance(entry, str):
        return entry
    module, sep, attr = entry.partition(":")
    if not sep:
        raise ValueError(f"an entry point is 'module:attr', got {entry!r}")
    return getattr(importlib.import_module(module), attr)
