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

Hand-written: entries are whole sequences matched by their longest common prefix (a linear scan, which at a few
hundred entries costs microseconds), evicted least recently used under a memory budget; no library keeps
torch tensors this way for us.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class CachedPrefix:
    """One stored sequence: its tokens and, per layer, the keys and values at positions 0 .. n-1."""

    tokens: np.ndarray  # [n] int64
    keys: list[torch.Tensor]  # per layer [kv_heads, n, head_dim]
    values: list[torch.Tensor]
    feature_layers: tuple[int, ...] = ()
    features: torch.Tensor | None = None  # [n, features] of `feature_layers`, for drafters that read them

    @property
    def nbytes(self) -> int:
        tensors = self.keys + self.values + ([self.features] if self.features is not None else [])
        return sum(t.numel() * t.element_size() for t in tensors)


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
        self.entries: OrderedDict[int, CachedPrefix] = OrderedDict()
        self.nbytes = 0
        self._next_id = 0
        self.hits = self.lookups = self.reused_tokens = 0  # for metrics and tests

    def lookup(self, tokens: list[int], feature_layers: tuple[int, ...] = ()) -> tuple[CachedPrefix | None, int]:
        """The stored sequence sharing the longest prefix with `tokens`, and that length (0: none). An entry
        serves a drafter that reads features only if it holds the same layers."""
        self.lookups += 1
        want = np.asarray(tokens, dtype=np.int64)
        best, best_id, length = None, None, 0
        for key, entry in self.entries.items():
            if feature_layers and entry.feature_layers != tuple(feature_layers):
                continue
            m = common_prefix(entry.tokens, want)
            if m > length:
                best, best_id, length = entry, key, m
        if best is not None:
            self.entries.move_to_end(best_id)
            self.hits += 1
            self.reused_tokens += length
        return best, length

    def store(self, entry: CachedPrefix) -> None:
        """Keep `entry`; stored entries it extends (their tokens are a prefix of its own, with the same
        features) are dropped, and the least recently used go until the budget holds. An entry that a stored
        one already extends is not kept twice (the stored one counts as used)."""
        if entry.nbytes > self.max_bytes or len(entry.tokens) == 0:
            return
        for key, old in self.entries.items():
            if common_prefix(old.tokens, entry.tokens) == len(entry.tokens) and (
                    old.feature_layers == entry.feature_layers or not entry.feature_layers):
                self.entries.move_to_end(key)
                return
        for key, old in list(self.entries.items()):
            covered = common_prefix(old.tokens, entry.tokens) == len(old.tokens)  # old is a prefix of the new one
            if covered and (old.feature_layers == entry.feature_layers or not old.feature_layers):
                self._drop(key)
        self.entries[self._next_id] = entry
        self._next_id += 1
        self.nbytes += entry.nbytes
        while self.nbytes > self.max_bytes:
            self._drop(next(iter(self.entries)))

    def _drop(self, key: int) -> None:
        self.nbytes -= self.entries.pop(key).nbytes
