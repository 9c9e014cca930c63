"""SuffixIndex: where the context's longest suffix occurs in a token corpus, and what followed it.

REST, SuffixDecoding and the hybrid drafter all ask the same question at every step: which
earlier token sequences end with the longest suffix of the current context, and which tokens
came next, how often? A suffix array answers it in O(L log N) for a suffix of L tokens. The
array is built (by `pydivsufsort`, C, linear time) over the *reversed* corpus, so that a
context suffix read backwards is a prefix query: the range of matching rows narrows one token
at a time, and the first token that empties it gives the longest match in a single pass.

SuffixDecoding uses a suffix tree instead; a suffix array over the same tokens finds exactly
the same occurrences and continuations, and needs no hand-written tree (the one library that
ships SuffixDecoding's tree, arctic-inference, is a source-only build that pulls torch, CMake
and gRPC at install time, too heavy a dependency for this package).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np


@dataclass
class Candidates:
    """A frequency trie of continuations: node i has token tokens[i], parent parents[i] (-1 = the
    match itself), and prob[i] = the share of the match's occurrences whose continuation starts
    with node i's path. Nodes are best first (prob descending), so parents precede children."""

    tokens: list[int]
    parents: list[int]
    prob: list[float]
    match_length: int

    def __len__(self) -> int:
        return len(self.tokens)


NO_CANDIDATES = Candidates([], [], [], 0)


class SuffixIndex:
    """A read-only corpus of token ids (documents separated by `separator`) with its suffix array."""

    def __init__(self, tokens: np.ndarray, separator: int, suffix_array: np.ndarray | None = None):
        self.tokens = np.ascontiguousarray(tokens)
        self.separator = int(separator)
        self.reversed = np.ascontiguousarray(self.tokens[::-1]).astype(np.int32, copy=False)
        if suffix_array is None:
            from pydivsufsort import divsufsort  # imported where used: only a suffix index needs it

            suffix_array = divsufsort(self.reversed)
        self.sa = suffix_array
        if len(self.sa) != len(self.tokens):
            raise ValueError("the suffix array does not match the tokens")

    def __len__(self) -> int:
        return len(self.tokens)

    @classmethod
    def from_documents(cls, documents, separator: int) -> "SuffixIndex":
        parts = []
        for doc in documents:
            parts += [np.asarray(doc, dtype=np.int64), np.array([separator])]
        return cls(np.concatenate(parts) if parts else np.array([separator]), separator)

    def match(self, context, max_length: int = 16, exclude_end: bool = False) -> tuple[int, int, int]:
        """(L, lo, hi): the longest suffix of `context` (up to max_length tokens) that occurs in the
        corpus, and its suffix-array rows sa[lo:hi]. With exclude_end, the corpus is the context
        itself and its own end (which trivially matches) does not count as an occurrence."""
        rev, sa, n = self.reversed, self.sa, len(self.reversed)
        lo, hi, length = 0, n, 0
        query = list(context[-max_length:])[::-1]
        for j, tok in enumerate(query):
            def key(s, j=j):  # token j of the reversed suffix starting at s; past the end sorts first
                return int(rev[s + j]) if s + j < n else -1
            new_lo = bisect.bisect_left(sa, tok, lo, hi, key=key)
            new_hi = bisect.bisect_right(sa, tok, new_lo, hi, key=key)
            count = new_hi - new_lo - (exclude_end and self._holds_end(new_lo, new_hi))
            if count <= 0:
                break
            lo, hi, length = new_lo, new_hi, j + 1
        return length, lo, hi

    def _holds_end(self, lo: int, hi: int) -> bool:
        # The reversed suffix starting at 0 is the corpus end: it has no continuation.
        return bool((self.sa[lo:hi] == 0).any())

    def candidates(self, context, max_length: int = 16, depth: int = 8, max_occurrences: int = 64,
                   min_prob: float = 0.0, max_nodes: int = 64, exclude_end: bool = False) -> Candidates:
        """The longest match's continuations (up to `depth` tokens each, from at most `max_occurrences`
        occurrences, evenly spread over the match's rows) merged into a frequency trie of at most
        `max_nodes` nodes whose prob is at least `min_prob`."""
        length, lo, hi = self.match(context, max_length, exclude_end)
        if length == 0 or depth <= 0:
            return NO_CANDIDATES
        rows = np.unique(np.linspace(lo, hi - 1, min(hi - lo, max_occurrences)).astype(np.int64))
        starts = len(self.tokens) - self.sa[rows]  # forward position right after each occurrence
        starts = starts[starts < len(self.tokens)]
        conts = []
        for s in starts.tolist():
            cont = self.tokens[s : s + depth].tolist()
            if self.separator in cont:
                cont = cont[: cont.index(self.separator)]
            if cont:
                conts.append(cont)
        return frequency_trie(conts, max(len(starts), 1), length, min_prob, max_nodes)


def frequency_trie(continuations: list[list[int]], occurrences: int, match_length: int, min_prob: float,
                   max_nodes: int) -> Candidates:
    """Merge continuations into a trie counted per node; keep the `max_nodes` most frequent nodes."""
    count: dict[tuple[int, ...], int] = {}
    for cont in continuations:
        for d in range(1, len(cont) + 1):
            key = tuple(cont[:d])
            count[key] = count.get(key, 0) + 1
    # A child never outnumbers its parent, and ties go to the shallower node: the kept set is
    # prefix-closed and parents come first.
    ranked = sorted(count.items(), key=lambda kv: (-kv[1], len(kv[0])))
    index: dict[tuple[int, ...], int] = {}
    tokens, parents, prob = [], [], []
    for path, c in ranked:
        p = c / occurrences
        if len(tokens) >= max_nodes or p < min_prob:
            break
        index[path] = len(tokens)
        tokens.append(path[-1])
        parents.append(index[path[:-1]] if len(path) > 1 else -1)
        prob.append(p)
    return Candidates(tokens, parents, prob, match_length)
