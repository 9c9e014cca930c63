"""Prefix caching for the batch decoder: KV entries of earlier prompts and replies, reused by prompts that start alike.

A chat request resends the whole conversation: turn 2's prompt is turn 1's prompt, its reply and a new
message, and every request starts with the same chat-template header (often a long system prompt). The batch
decoder stores each prompt's KV entries as soon as they are prefilled, and each finished sequence's (with,
for drafters that read the target's hidden states, their features) here; a new prompt that shares a prefix
with a stored sequence copies those entries into its slot and prefills only the rest, as vLLM's automatic
prefix caching and SGLang's radix cache do. A copy of a few MB costs far less than the
forward it replaces: on a 2-core CPU a prompt prefills at ~600-2,400 tokens/s.

The reused entries were computed by other forward passes (another batch, another chunking) of the same tokens
at the same positions: the same values up to the rounding of differently shaped matmuls, as in batching itself.

A shared prefix is held once: a stored sequence that starts like a stored one (by at least `MIN_SHARED` tokens)
keeps only the entries after the shared part and points to the one that holds the rest, its parent. A system
prompt of a few thousand tokens (~46 KB a token for SmolLM2-135M in float32) would otherwise fill the budget
with copies of itself. Parents are not split at the shared length (a radix tree would): a parent keeps its own
tail, which costs at most one sequence's worth per distinct shared prefix, and it stays as long as a child
needs it (only entries without children are evicted).

Hand-written: entries are whole sequences matched by their longest common prefix (a linear scan, which at a few
hundred entries costs microseconds), evicted least recently used under a memory budget; no library keeps
torch tensors this way for us.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

# Tokens a stored sequence must share with another before it keeps only its own tail. Below it, sharing saves
# little and would tie entries together by the chat template's ~30-token header alone: every entry would read
# through one old conversation, which could then never be evicted while any other is held.
MIN_SHARED = 64


@dataclass(eq=False)  # an entry is itself: the cache keys it by id and tells parents apart by identity
class CachedPrefix:
    """One stored sequence: its tokens and, per layer, the keys and values at the positions it holds, `start`
    .. n-1 (0 .. n-1 as the batch decoder hands it over; positions 0 .. start-1 are its parent's)."""

    tokens: np.ndarray  # [n] int64
    keys: list[torch.Tensor]  # per layer [kv_heads, n - start, head_dim]
    values: list[torch.Tensor]
    feature_layers: tuple[int, ...] = ()
    features: torch.Tensor | None = None  # [n - start, features] of `feature_layers`, for drafters that read them
    parent: CachedPrefix | None = None
    children: int = 0  # stored entries whose parent this is: it is not evicted before them

    @property
    def start(self) -> int:
        return len(self.tokens) - self.keys[0].shape[1]

    @property
    def nbytes(self) -> int:
        tensors = self.keys + self.values + ([self.features] if self.features is not None else [])
        return sum(t.numel() * t.element_size() for t in tensors)

    def chain(self) -> list[CachedPrefix]:
        """Its ancestors, oldest first, then itself."""
        out, entry = [], self
        while entry is not None:
            out.append(entry)
            entry = entry.parent
        return out[::-1]

    def prefix(self, n: int, with_features: bool = False):
        """Keys and values (per layer [kv_heads, n, head_dim]) and features ([n, F] or None) of positions
        0 .. n-1, gathered along the chain: each entry gives its positions up to where its child's start."""
        chain = self.chain()
        spans = [(e, e.start, min(n, nxt.start if nxt is not None else n))
                 for e, nxt in zip(chain, chain[1:] + [None], strict=True)]
        spans = [(e, lo - e.start, hi - e.start) for e, lo, hi in spans if hi > lo]
        keys = [torch.cat([e.keys[i][:, a:b] for e, a, b in spans], 1) for i in range(len(self.keys))]
        values = [torch.cat([e.values[i][:, a:b] for e, a, b in spans], 1) for i in range(len(self.values))]
        features = torch.cat([e.features[a:b] for e, a, b in spans]) if with_features else None
        return keys, values, features


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading tokens a and b share."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


class PrefixCache:
    """Stored sequences under a budget of `max_bytes`, least recently used evicted first."""

    def __init__(self, max_bytes: int):
        if max_bytes < 0:
            raise ValueError(f"the prefix cache's budget must be >= 0 bytes, got {max_bytes}")
        self.max_bytes = max_bytes
        self.entries: OrderedDict[int, CachedPrefix] = OrderedDict()  # id(entry) -> entry, least recent first
        self.nbytes = 0
        self.hits = self.lookups = self.reused_tokens = 0  # for metrics and tests

    def _longest(self, tokens: np.ndarray, feature_layers: tuple[int, ...], same_layers: bool = False):
        """The entry sharing the longest prefix with `tokens` among those that can give `feature_layers`."""
        best, length = None, 0
        for entry in self.entries.values():
            if (feature_layers or same_layers) and entry.feature_layers != tuple(feature_layers):
                continue
            m = common_prefix(entry.tokens, tokens)
            if m > length:
                best, length = entry, m
        return best, length

    def _touch(self, entry: CachedPrefix) -> None:
        for e in entry.chain():
            self.entries.move_to_end(id(e))

    def lookup(self, tokens: list[int], feature_layers: tuple[int, ...] = ()) -> tuple[CachedPrefix | None, int]:
        """The stored sequence sharing the longest prefix with `tokens`, and that length (0: none); its
        `prefix(length)` gives the entries. An entry serves a drafter that reads features only if it holds the
        same layers."""
        self.lookups += 1
        best, length = self._longest(np.asarray(tokens, dtype=np.int64), tuple(feature_layers))
        if best is not None:
            self._touch(best)
            self.hits += 1
            self.reused_tokens += length
        return best, length

    def store(self, entry: CachedPrefix) -> None:
        """Keep a copy of `entry` (holding all its positions; its tensors may be views of buffers that will be
        overwritten). It is not kept when a stored entry already extends it (that one counts as used); when it
        shares at least MIN_SHARED tokens with a stored entry of the same feature layers, it keeps only its
        positions after the shared part, the rest read through its parent.
        Stored entries without children that it extends are dropped; then the least recently used entries
        without children go until the budget holds."""
        if len(entry.tokens) == 0:
            return
        for old in self.entries.values():
            if common_prefix(old.tokens, entry.tokens) == len(entry.tokens) and (
                    old.feature_layers == entry.feature_layers or not entry.feature_layers):
                self._touch(old)
                return
        parent, m = self._longest(entry.tokens, entry.feature_layers, same_layers=True)
        if parent is not None and m >= MIN_SHARED:
            while parent.parent is not None and parent.start >= m:  # the oldest entry that holds all m
                parent = parent.parent
        else:
            parent, m = None, 0
        entry = CachedPrefix(entry.tokens, [k[:, m:].clone() for k in entry.keys],
                             [v[:, m:].clone() for v in entry.values], entry.feature_layers,
                             entry.features[m:].clone() if entry.features is not None else None, parent)
        if entry.nbytes > self.max_bytes:
            return
        for old in list(self.entries.values()):
            covered = common_prefix(old.tokens, entry.tokens) == len(old.tokens)  # old is a prefix of the new one
            if covered and old is not entry.parent and not old.children and (
                    old.feature_layers == entry.feature_layers or not old.feature_layers):
                self._drop(old)
        if entry.parent is not None:
            entry.parent.children += 1
        self.entries[id(entry)] = entry
        self.nbytes += entry.nbytes
        while self.nbytes > self.max_bytes:
            self._drop(next(e for e in self.entries.values() if not e.children))

    def _drop(self, entry: CachedPrefix) -> None:
        del self.entries[id(entry)]
        self.nbytes -= entry.nbytes
        if entry.parent is not None:
            entry.parent.children -= 1
