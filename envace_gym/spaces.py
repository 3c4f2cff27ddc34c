"""Text spaces for tool-use environments.

Gymnasium's default `Text` charset is alphanumeric only; tool calls need JSON punctuation, quotes, newlines
and any printable Unicode a user or a tool may produce. `printable_text(...)` builds a `spaces.Text` whose
charset is every printable character of the Basic Multilingual Plane plus ``\\n``, ``\\t`` and ``\\r``
(about 50k characters, built once per process). `sanitize(text)` maps anything outside it to U+FFFD so that
every observation the environments emit is inside their observation space.
"""

from __future__ import annotations

import functools
import re

from gymnasium import spaces

__all__ = ["PRINTABLE_CHARSET", "printable_text", "sanitize", "MAX_TEXT_LENGTH"]

MAX_TEXT_LENGTH = 1_000_000
"""Upper bound, in characters, on observations and actions (a BFCL long_context result is ~100k)."""


@functools.lru_cache(maxsize=1)
def _charset() -> frozenset[str]:
    chars = {chr(c) for c in range(0x10000) if chr(c).isprintable()}
    chars.update("\n\t\r")
    return frozenset(chars)


PRINTABLE_CHARSET: frozenset[str] = _charset()


def printable_text(min_length: int = 0, max_length: int = MAX_TEXT_LENGTH) -> spaces.Text:
    """A `gymnasium.spaces.Text` over `PRINTABLE_CHARSET` (lengths in characters)."""
    return spaces.Text(max_length=max_length, min_length=min_length, charset=PRINTABLE_CHARSET)


_SURROGATES = re.compile("[\ud800-\udfff]")


def replace_surrogates(text: str) -> str:
    """`text` with every lone surrogate code point (U+D800-U+DFFF, not encodable as UTF-8; what a byte-level
    decode can produce) replaced by U+FFFD; other text unchanged (the same object when there is none)."""
    return _SURROGATES.sub("\ufffd", text) if _SURROGATES.search(text) else text


def sanitize(text: str, max_length: int = MAX_TEXT_LENGTH) -> str:
    """Replace characters outside `PRINTABLE_CHARSET` with U+FFFD and cut to `max_length` characters."""
    if all(c in PRINTABLE_CHARSET for c in text):
        out = text
    else:
        out = "".join(c if c in PRINTABLE_CHARSET else "\ufffd" for c in text)
    return out[:max_length]
