"""SuffixDecoding: drafts from the longest earlier occurrence of the context's suffix, ranked by frequency.

Oliveira et al., "SuffixDecoding" (Snowflake; vLLM method `suffix`). Two indexes answer each
step: one over the current request (prompt + output so far) and a global one over the outputs
of earlier requests in this process (bench turns, server requests). Each finds the longest
suffix of the context that occurred before, merges what followed its occurrences into a trie
counted per node, and keeps the most frequent nodes; the tree whose expected accepted length
(the sum of its node frequencies) is larger is proposed. Its size adapts to the match: at most
`factor` x match length nodes, so a long, confident match drafts big trees and a one-token
match drafts little.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import BlockdraftError
from ..trees import DraftTree
from .base import DraftContext, Drafter
from .suffix_index import NO_CANDIDATES, Candidates, SuffixIndex

SEPARATOR = -1  # between documents; never a token id


def candidates_tree(root: int, cand: Candidates) -> DraftTree:
    """A Candidates trie (best-first, parents first) under `root`."""
    return DraftTree([root] + cand.tokens, [-1] + [p + 1 for p in cand.parents])


class SuffixDrafter(Drafter):
    """Per-request + global suffix matching (SuffixDecoding), frequency-ranked, adaptive size.

    budget: draft nodes at most; factor: nodes per matched token (SuffixDecoding's
    max_spec_factor); min_prob: drop nodes followed by fewer than this share of the occurrences;
    depth: longest continuation; max_match: longest suffix searched; global_tree: also match the
    outputs of earlier generations of this drafter (a process-wide cache, `max_global` of them).
    """

    name = "suffix"

    def __init__(self, budget: int = 24, factor: float = 2.0, min_prob: float = 0.1, depth: int = 16,
                 max_match: int = 24, global_tree: bool = True, max_global: int = 1000):
        if budget < 1 or depth < 1 or max_match < 1 or factor <= 0 or not 0 <= min_prob <= 1:
            raise BlockdraftError("suffix needs budget, depth, max_match >= 1, factor > 0 and 0 <= min_prob <= 1")
        self.budget, self.factor, self.min_prob = budget, factor, min_prob
        self.depth, self.max_match = depth, max_match
        self.global_tree, self.max_global = global_tree, max_global
        self.outputs: list[list[int]] = []  # earlier generations' outputs, newest last
        self.global_index: SuffixIndex | None = None
        self._prompt_len, self._tokens = 0, None

    def reset(self, prompt_ids) -> None:
        self.finish()
        self._prompt_len, self._tokens = len(prompt_ids), None

    def forget(self) -> None:
        self.outputs, self.global_index, self._tokens = [], None, None

    def observe(self, ctx: DraftContext) -> None:
        self._tokens = ctx.tokens  # what finish() adds to the global index

    def finish(self) -> None:
        """Add the last generation's output to the global index (called on the next reset)."""
        if self._tokens is None or len(self._tokens) <= self._prompt_len:
            return
        self.outputs = (self.outputs + [self._tokens[self._prompt_len :]])[-self.max_global :]
        self._tokens = None
        if self.global_tree:
            self.global_index = SuffixIndex.from_documents(self.outputs, SEPARATOR)

    def sources(self, ctx: DraftContext, depth: int) -> list[Candidates]:
        """This step's candidates from the request's own tokens and from the global index."""
        self._tokens = ctx.tokens
        options = dict(max_length=self.max_match, depth=depth, min_prob=self.min_prob, max_nodes=self.budget)
        local = SuffixIndex(np.asarray(ctx.tokens, dtype=np.int64), SEPARATOR)
        found = [local.candidates(ctx.tokens, exclude_end=True, **options)]
        if self.global_index is not None:
            found.append(self.global_index.candidates(ctx.tokens, **options))
        return found

    def propose(self, ctx: DraftContext) -> DraftTree:
        root = ctx.tokens[-1]
        depth = min(self.depth, ctx.max_depth)
        if depth <= 0:
            return DraftTree.root_only(root)
        best = NO_CANDIDATES
        for cand in self.sources(ctx, depth):
            size = min(len(cand), math.ceil(self.factor * cand.match_length))
            cand = Candidates(cand.tokens[:size], cand.parents[:size], cand.prob[:size], cand.match_length)
            if sum(cand.prob) > sum(best.prob):
                best = cand
        return candidates_tree(root, best)
