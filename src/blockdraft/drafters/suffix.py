"""SuffixDecoding: drafts from the longest earlier occurrence of the context's suffix, ranked by frequency.

Oliveira et al., "SuffixDecoding" (Snowflake; vLLM method `suffix`). Two indexes answer each
step: one over the current request (prompt + output so far) and a global one over the outputs
of earlier requests in this process (bench turns, server requests, every sequence of a batch). Each finds the longest
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


class EarlierOutputs:
    """The outputs of earlier generations, newest last, and their suffix index: what SuffixDecoding's global tree
    matches. One object, shared by a drafter and all its forks (every sequence of a batch, every server request),
    filled by `on_finish` as each generation ends."""

    def __init__(self, max_outputs: int):
        self.max_outputs = max_outputs
        self.clear()

    def clear(self) -> None:
        self.outputs: list[list[int]] = []
        self.index: SuffixIndex | None = None

    def add(self, output: list[int]) -> None:
        self.outputs = (self.outputs + [list(output)])[-self.max_outputs :]
        self.index = SuffixIndex.from_documents(self.outputs, SEPARATOR)


class SuffixDrafter(Drafter):
    """Per-request + global suffix matching (SuffixDecoding), frequency-ranked, adaptive size.

    budget: draft nodes at most; factor: nodes per matched token (SuffixDecoding's
    max_spec_factor); min_prob: drop nodes followed by fewer than this share of the occurrences;
    depth: longest continuation; max_match: longest suffix searched; global_tree: also match the
    outputs of earlier generations of this drafter and its forks (`max_global` of them).
    """

    name = "suffix"

    def __init__(self, budget: int = 24, factor: float = 2.0, min_prob: float = 0.1, depth: int = 16,
                 max_match: int = 24, global_tree: bool = True, max_global: int = 1000):
        if budget < 1 or depth < 1 or max_match < 1 or factor <= 0 or not 0 <= min_prob <= 1:
            raise BlockdraftError("suffix needs budget, depth, max_match >= 1, factor > 0 and 0 <= min_prob <= 1")
        self.budget, self.factor, self.min_prob = budget, factor, min_prob
        self.depth, self.max_match = depth, max_match
        self.earlier = EarlierOutputs(max_global) if global_tree else None  # shared with every fork

    def forget(self) -> None:
        if self.earlier is not None:
            self.earlier.clear()

    def on_finish(self, prompt_ids, output) -> None:
        if self.earlier is not None and output:
            self.earlier.add(output)

    def sources(self, ctx: DraftContext, depth: int) -> list[Candidates]:
        """This step's candidates from the request's own tokens and from the global index."""
        options = dict(max_length=self.max_match, depth=depth, min_prob=self.min_prob, max_nodes=self.budget)
        local = SuffixIndex(np.asarray(ctx.tokens, dtype=np.int64), SEPARATOR)
        found = [local.candidates(ctx.tokens, exclude_end=True, **options)]
        if self.earlier is not None and self.earlier.index is not None:
            found.append(self.earlier.index.candidates(ctx.tokens, **options))
        return found

    def retrieve(self, ctx: DraftContext, depth: int) -> list[tuple[str | None, Candidates]]:
        """The request's own matches and earlier outputs' (when there are any), calibrated apart by hybrid."""
        return list(zip((None, "global"), self.sources(ctx, depth), strict=False))

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
