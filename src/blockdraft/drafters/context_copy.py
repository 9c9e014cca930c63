"""Context copy: the token that followed a token's last occurrence in the context, an input of the AR module.

Why: a model's replies repeat their context (what `lookup` and `suffix` exploit), which a drafter that sees the
context only through the target's last state cannot copy. On a held-out store the token after the parent's last
occurrence was the target's top-1 more often, at every depth, than the module's own guess given the true parent
(`benchmarks/copy_potential.py`; BENCHMARKS.md, "Decisions": treeflash --copy). The module reads it as one more
embedding beside the parent's (drafters/treeflash.py), so it learns when to trust it.

The same rule at both ends, tested equal: decoding keeps a table over the request's tokens (`extend_table`),
training reads it from a feature store's token array (`copy_tokens`). The context ends at the root, the last
token known before a step; a parent deeper in the tree is looked up by its token alone, so the transition
tables stay one row per (depth, parent token).
"""

from __future__ import annotations

import numpy as np

NO_COPY = -1  # the parent has not occurred in the context: the module reads a zero embedding


def extend_table(table: dict[int, int], tokens: list[int], seen: int) -> dict[int, int]:
    """`table` (token -> the token after its last occurrence in tokens[:seen]) brought up to all of `tokens`.
    A new dict: a forked drafter may still hold the old one (Drafter.fork's contract)."""
    if seen >= len(tokens):
        return table
    table = dict(table)
    for q in range(max(seen - 1, 0), len(tokens) - 1):
        table[tokens[q]] = tokens[q + 1]
    return table


def previous_same(tokens: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """For each position, the previous position of its sequence (`starts`: where each begins, and the end)
    holding the same token, or -1."""
    n = len(tokens)
    positions = np.arange(n)
    order = np.lexsort((positions, tokens))  # by token, then position
    same = tokens[order[1:]] == tokens[order[:-1]]
    prev = np.full(n, -1, dtype=np.int64)
    prev[order[1:][same]] = order[:-1][same]
    sequence = np.searchsorted(starts, positions, side="right")
    prev[(prev >= 0) & (sequence[np.maximum(prev, 0)] != sequence)] = -1
    return prev


def copy_tokens(tokens: np.ndarray, prev: np.ndarray, roots: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The copy input of the parent tokens[rows] (rows [B, k]) when the context ends at roots [B] (the root's
    position): the token after the parent's last occurrence q with q + 1 <= root in its sequence, else NO_COPY."""
    end = np.broadcast_to(np.asarray(roots)[:, None], rows.shape)
    q = prev[rows]
    while (late := q >= end).any():  # occurrences inside the drafted span are not context yet: step back
        q = np.where(late, prev[np.maximum(q, 0)], q)
    return np.where(q >= 0, tokens[q + 1], NO_COPY)
