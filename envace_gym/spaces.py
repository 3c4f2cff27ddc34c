"""Text spaces for tool-use environments.

Gymnasium's default `Text` charset is alphanumeric only; tool calls need JSON punctuation, quotes, newlines
and any printable Unicode a user or a tool may produce. `printable_text(...)` builds a `spaces.Text` whose
charset is every printable character of the Basic Multilingual Plane plus ``\\n``, ``\\t`` and ``\\r``
(about 50k characters, built once per process; each space is a shallow copy of one prototype, so its
lookup tables are shared read-only and only its random generator is its own). `sanitize(text)` maps anything outside it
to U+FFFD so that every observation the environments emit is inside their observation space.
"""

from __future__ import annotations

import copy
import functools
import re

from gymnasium import spaces

__all__ = ["PRINTABLE_CHARSET", "printable_text", "batch_text_space", "sanitize", "MAX_TEXT_LENGTH"]

MAX_TEXT_LENGTH = 1_000_000
"""Upper bound, in characters, on observations and actions (a BFCL long_context result is ~100k)."""


@functools.lru_cache(maxsize=1)
def _charset() -> frozenset[str]:
    chars = {chr(c) for c in range(0x10000) if chr(c).isprintable()}
    chars.update("\n\t\r")
    return frozenset(chars)


PRINTABLE_CHARSET: frozenset[str] = _charset()


@functools.lru_cache(maxsize=8)
def _printable_prototype(min_length: int, max_length: int) -> spaces.Text:
    return spaces.Text(max_length=max_length, min_length=min_length, charset=PRINTABLE_CHARSET)


def _own_copy(space: spaces.Text) -> spaces.Text:
    # Text.__init__ sorts and indexes the 50k-character charset (~50 ms); its tables are never mutated, so
    # copies share them; the random generator is not shared (seeding one space must not move another)
    out = copy.copy(space)
    out._np_random = None  # type: ignore[assignment]  # None: gymnasium's 'not seeded yet', typed Generator
    return out


def printable_text(min_length: int = 0, max_length: int = MAX_TEXT_LENGTH) -> spaces.Text:
    """A `gymnasium.spaces.Text` over `PRINTABLE_CHARSET` (lengths in characters), with its own generator."""
    return _own_copy(_printable_prototype(min_length, max_length))


def batch_text_space(space: spaces.Text, n: int) -> spaces.Tuple:
    """The batched space of `n` copies of `space`, as `gymnasium.vector.utils.batch_space` gives for `Text`
    (a `Tuple` of `n` `Text` spaces), without its `n` deep copies of the charset (seconds for 128 envs at
    50k characters). Each copy has its own generator, seeded from `space`'s when `space` was seeded."""
    batched = spaces.Tuple(tuple(_own_copy(space) for _ in range(n)))
    if space._np_random is not None:
        rng = copy.deepcopy(space._np_random)  # as Gymnasium: drawing the seeds does not move `space`'s generator
        batched.seed([int(x) for x in rng.integers(0, int(1e8), n)])
    return batched


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
