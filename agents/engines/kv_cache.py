"""Per-trajectory prefix KV cache: each inline trajectory's keys/values survive between its generation calls.

In the ``inline`` prompt mode (docs/design.md §1) ACT and REHEARSE continue ONE token sequence per trajectory:
the context of every generation call is the previous context + the ids generated then + a few template
ids. Re-encoding that whole context at every call costs O(turns × context) model tokens; with a cache the
model only processes the new tokens. `PrefixKVCache` stores, per trajectory, the ids the model has
processed so far with their per-layer keys and values; `agents.engines.generation.generate` looks up the longest
stored prefix of each context, prefills only the suffix, decodes, and stores the extended entry.

Matching is by token ids only (exact check, never by trajectory identity), so a wrong hit is impossible:
an entry is used for exactly the ids it was computed from. Two things can still make an entry stale, and
both are handled:

1. The weights changed (an optimizer step, ``load_state_dict``, ``.to(...)``). `PrefixKVCache.sync`
   fingerprints the parameters by ``(id(p), p._version)`` (every in-place update bumps ``_version``) and
   drops every entry when the fingerprint moved. `agents.engines.generation.generate` calls it at each call.
2. Memory. The cache is bounded (documented trade-off, defaults fit SmolLM2-135M rollouts of 16 trajectories
   of 8k tokens in about 6 GB):

   * ``replace``: an entry is dropped when a row that continued ALL of it stores its extension (the
     next turn matches the extension, which contains it); an entry that only shares a prefix with a
     row (another trajectory of the same prompt, another task with the same tool schemas) stays;
   * ``max_idle_calls``: an entry not used by the last that many `generate` calls is evicted (a trajectory
     that finished, or was reset, stops being looked up and disappears after a few calls);
   * ``max_tokens``: total stored tokens over all entries; the least recently used entries go first.

Memory per stored token is ``2 × layers × kv_heads × head_dim × 4`` bytes in float32 (SmolLM2-135M:
30 × 3 × 64 → 46 KB/token).

Stored prefixes are shared, not copied (``share_prefixes``, on by default). An entry may hold only the KV
of its own tokens after a ``parent`` entry's first ``prefix_tokens`` tokens, so the K trajectories of a
group keep one copy of their common prompt after their first turn (they diverge from there), and their
later turns keep pointing at it. A row that continued an entry in part links to that entry; a row that
continued all of it links to that entry's own parent, since the entry itself is replaced (so a chain
grows with the points where trajectories diverged, not with turns). An evicted entry that is still some
entry's parent stays in memory until no entry points to it; `PrefixKVCache.num_tokens` counts what is
held, parents included.

Shared prefixes within one call: `agents.engines.generation.generate` prefills a prefix of at least
``min_shared_prefix`` tokens that several rows of the call share (and the cache does not hold yet) once,
stores it as an entry, and lets every row continue from it. Tasks of a suite with the same tools share
almost their whole prompt (8 BFCL multi_turn_base train tasks: 33.7k prompt tokens, 12.6k distinct).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

__all__ = ["KVEntry", "PrefixKVCache", "common_prefix_length"]


@dataclass(eq=False)
class KVEntry:
    """One trajectory's processed prefix.

    Attributes:
        ids: the token ids the model processed, ``(L,)`` int64 numpy array.
        keys: one tensor per layer, ``(1, H_kv, L - prefix_tokens, D)`` in the model's dtype: the keys of
            ``ids[prefix_tokens:]`` (all of them without a parent).
        values: one tensor per layer, ``(1, H_kv, L - prefix_tokens, D)``.
        last_used: value of the cache's call counter when it was stored or last matched.
        parent: the entry holding the KV of ``ids[:prefix_tokens]`` (its first ``prefix_tokens`` ids are
            those), or None.
        prefix_tokens: how many leading ids `parent` holds (0 without a parent).
        num_tokens: ``L``.
        own_tokens: ``L - prefix_tokens``, the tokens whose KV this entry itself stores.

    Raises:
        ValueError: the KV length is not ``L - prefix_tokens``, or `parent` and ``prefix_tokens`` do not fit
            (a parent without prefix tokens, more prefix tokens than the parent or the entry has, or a
            parent whose ids differ on the prefix).
    """

    ids: np.ndarray
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    last_used: int = 0
    parent: KVEntry | None = None
    prefix_tokens: int = 0
    num_tokens: int = field(init=False)
    own_tokens: int = field(init=False)

    def __post_init__(self) -> None:
        self.num_tokens = int(self.ids.shape[0])
        p = self.prefix_tokens = int(self.prefix_tokens)
        if (
            (self.parent is None) != (p == 0)
            or p > self.num_tokens
            or (
                self.parent is not None
                and (p > self.parent.num_tokens or common_prefix_length(self.parent.ids[:p], self.ids[:p]) < p)
            )
        ):
            raise ValueError(
                f"parent of {self.parent.num_tokens if self.parent else 0} tokens cannot hold the first "
                f"{p} of {self.num_tokens} ids"
            )
        self.own_tokens = self.num_tokens - p
        for k, v in zip(self.keys, self.values):
            if k.shape[2] != self.own_tokens or v.shape[2] != self.own_tokens:
                raise ValueError(f"KV length {k.shape[2]}/{v.shape[2]} != {self.own_tokens} own ids")

    def copy_into(
        self, key_buffers: Sequence[torch.Tensor], value_buffers: Sequence[torch.Tensor], row: int, start: int, n: int
    ) -> None:
        """Write the KV of ``ids[:n]`` into columns ``[start, start + n)`` of row `row` of each layer's
        buffers ``(B, H_kv, C, D)``, the parents' part from the parents."""
        p = min(n, self.prefix_tokens)
        if p > 0 and self.parent is not None:  # (p > 0 implies a parent: __post_init__)
            self.parent.copy_into(key_buffers, value_buffers, row, start, p)
        if n > p:
            for layer, (k, v) in enumerate(zip(self.keys, self.values)):
                key_buffers[layer][row, :, start + p : start + n] = k[0, :, : n - p]
                value_buffers[layer][row, :, start + p : start + n] = v[0, :, : n - p]


class PrefixKVCache:
    """Token-id-keyed store of per-trajectory KV prefixes, shared by a `Policy` and its `PolicyRehearser`.

    Args:
        max_tokens: cap on the total tokens stored over all entries (>= 1); LRU eviction beyond it.
        max_idle_calls: entries not used during this many consecutive `begin_call`s are evicted (>= 1).
        replace: drop an entry once a row that continued all of it stored its extension (True by default).
        share_prefixes: new entries link to the entry they continue instead of copying its KV (True by
            default; see the module doc). False stores every entry whole (the measured alternative).
        min_shared_prefix: shortest prefix shared by several rows of one `generate` call that is prefilled
            once for all of them (>= 1; the default 128 skips the short common system-prompt start).

    Attributes:
        stats: counters since creation: ``calls``, ``hits`` (rows that reused > 0 tokens), ``reused_tokens``,
            ``fed_tokens`` (tokens whose KV the cache did not hold, which the model processed; a padded prefill
            also recomputes a few cached tokens of a row to align it with its bucket, not counted),
            ``evicted``, ``invalidations``,
            ``shared_prefixes`` (prefixes prefilled once for several rows of a call).

    Raises:
        ValueError: ``max_tokens < 1``, ``max_idle_calls < 1`` or ``min_shared_prefix < 1``.
    """

    def __init__(
        self,
        max_tokens: int = 131_072,
        max_idle_calls: int = 4,
        replace: bool = True,
        min_shared_prefix: int = 128,
        share_prefixes: bool = True,
    ) -> None:
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        if max_idle_calls < 1:
            raise ValueError(f"max_idle_calls must be >= 1, got {max_idle_calls}")
        if min_shared_prefix < 1:
            raise ValueError(f"min_shared_prefix must be >= 1, got {min_shared_prefix}")
        self.max_tokens = int(max_tokens)
        self.max_idle_calls = int(max_idle_calls)
        self.replace = bool(replace)
        self.min_shared_prefix = int(min_shared_prefix)
        self.share_prefixes = bool(share_prefixes)
        self._entries: list[KVEntry] = []
        self._packed: tuple[np.ndarray, int] | None = None  # `_packed_ids`, rebuilt after the entries change
        self._clock = 0
        self._fingerprint: tuple | None = None
        self.stats = {
            "calls": 0,
            "hits": 0,
            "reused_tokens": 0,
            "fed_tokens": 0,
            "evicted": 0,
            "invalidations": 0,
            "shared_prefixes": 0,
        }

    # ------------------------------------------------------------------ bookkeeping
    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[KVEntry]:
        return iter(self._entries)

    @property
    def num_tokens(self) -> int:
        """Tokens whose KV the cache holds: the own tokens of every entry and of every parent they point to,
        each entry counted once (what its memory is, in tokens)."""
        seen: set[int] = set()
        total = 0
        for e in self._entries:
            node: KVEntry | None = e
            while node is not None and id(node) not in seen:
                seen.add(id(node))
                total += node.own_tokens
                node = node.parent
        return total

    def clear(self) -> None:
        """Drop every entry (e.g. after changing the model outside an in-place parameter update)."""
        self._entries.clear()
        self._packed = None

    def sync(self, model: torch.nn.Module) -> None:
        """Drop every entry when the model's weights changed since the last call (see the module doc)."""
        fp = tuple((id(p), p._version, p.dtype, p.device) for p in model.parameters())
        if fp != self._fingerprint:
            if self._entries:
                self.stats["invalidations"] += 1
            self.clear()
            self._fingerprint = fp

    def begin_call(self) -> None:
        """Advance the call clock and evict entries idle for ``max_idle_calls`` calls."""
        self._clock += 1
        self.stats["calls"] += 1
        keep = [e for e in self._entries if self._clock - e.last_used <= self.max_idle_calls]
        self.stats["evicted"] += len(self._entries) - len(keep)
        if len(keep) != len(self._entries):
            self._entries, self._packed = keep, None

    # ------------------------------------------------------------------ lookup / store
    def lookup(self, context: Sequence[int]) -> tuple[KVEntry | None, int]:
        """The entry sharing the longest common prefix with `context`, and that prefix length.

        The length is capped at ``len(context) - 1``: the last context token must be fed to the model to
        get the next-token logits. Exact id comparison against every entry at once (numpy, O(entries × L));
        of entries sharing the longest prefix, the first in the cache's order (`__iter__`) is returned: the
        order they were stored in, until a `store` over ``max_tokens`` re-sorts them by last use.

        Returns:
            ``(entry, n)`` with ``entry.ids[:n] == context[:n]``; ``(None, 0)`` when nothing matches.
        """
        if not self._entries or len(context) < 2:
            return None, 0
        packed, width = self._packed_ids()
        ctx = np.asarray(context[: min(len(context) - 1, width)], dtype=np.int64)  # the last id is always fed
        eq = packed[:, : ctx.shape[0]] == ctx  # (E, n); the padding (-1) never equals an id
        shared = np.where(eq.all(axis=1), ctx.shape[0], eq.argmin(axis=1))  # (E,) common prefix lengths
        best = int(shared.argmax())  # the first of the longest: the entries' order decides ties
        if shared[best] == 0:
            return None, 0
        entry = self._entries[best]
        self._touch(entry)
        return entry, int(shared[best])

    def _packed_ids(self) -> tuple[np.ndarray, int]:
        """Every entry's ids in one ``(E, L_max)`` int64 array, right-padded with -1, and ``L_max``: one
        vectorised comparison per lookup instead of a Python loop over the entries."""
        if self._packed is None:
            width = max(e.num_tokens for e in self._entries)
            packed = np.full((len(self._entries), width), -1, dtype=np.int64)
            for row, e in enumerate(self._entries):
                packed[row, : e.num_tokens] = e.ids
            self._packed = (packed, width)
        return self._packed

    def _touch(self, entry: KVEntry | None) -> None:
        """Stamp `entry` and its parents as used now: a parent stays as long as an entry built on it does, so
        the oldest entries, which eviction drops first, are ones whose memory dropping them frees."""
        while entry is not None:
            entry.last_used = self._clock
            entry = entry.parent

    def store(self, entries: Sequence[KVEntry], sources: Sequence[KVEntry | None] = ()) -> None:
        """Add `entries` (stamped with the current call); drop `sources` when ``replace``; enforce ``max_tokens``.

        `sources` are the entries the new ones continue in full (the caller passes only those; an entry
        a row matched only partly is still useful to others and is not passed).
        """
        self._packed = None
        if self.replace:
            gone = {id(s) for s in sources if s is not None}
            self._entries = [e for e in self._entries if id(e) not in gone]
        for e in entries:
            self._touch(e)
            self._entries.append(e)
        if self.num_tokens > self.max_tokens:
            self._entries.sort(key=lambda e: e.last_used)  # oldest first
            while self._entries and self.num_tokens > self.max_tokens:
                self._entries.pop(0)
                self.stats["evicted"] += 1


def common_prefix_length(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two 1-D int64 id arrays (exact comparison, O(min length))."""
    n = min(a.shape[0], b.shape[0])
    eq = a[:n] == b[:n]  # (n,)
    return n if bool(eq.all()) else int(eq.argmin())
