"""Sampled trees shaped by measured acceptance: Sequoia's positional model, learnt online per depth.

A sampled tree's shape must be fixed before anything is drawn (trees/sampled.py). Taking the shape
the drafter's deterministic best-first search would build ranks nodes by the drafter's own
probabilities, which at T > 0 say little about what recursive rejection will accept: there the
i-th child drawn at a node is accepted with a probability that mostly depends on i and on the
depth (Sequoia, Chen et al. 2024: the "positional acceptance" assumption). With P[d][i] = P(the
i-th child at depth d is the accepted one | its parent was accepted), a node's path is accepted with
the product of its edges' P, and the tree of n nodes that maximises the expected accepted tokens
(the sum of those products) is the top n of this product: a child never scores above its parent
and the i-th child never above the (i-1)-th (P[d] falls with i), so taking nodes best first is
Sequoia's optimum. The scores come out as log-probabilities, so `keep_best` sizes the tree with the
cost curve like any best-first tree.

P is counted from what the target accepted in earlier steps (the shape then depends on the past, never
on this step's draws: the output stays exact), starting from PRIOR: TreeFlash's root children on held-out
ShareGPT at T = 1 (benchmarks/2026-12-03-sampled/README.md: 0.30, 0.38, 0.42, 0.45 accepted with 1-4
children), worth PRIOR_WEIGHT observations.
"""

from __future__ import annotations

import heapq

import numpy as np

from .tree import DraftTree

PRIOR = (0.30, 0.075, 0.042, 0.028, 0.02, 0.015, 0.012, 0.01)
PRIOR_WEIGHT = 8.0


class PositionalAcceptance:
    """P[d][i] per depth d (1..depth) and sibling position i (1..children), counted online."""

    def __init__(self, depth: int, children: int = 8):
        self.children = children
        prior = np.array([PRIOR[min(i, len(PRIOR) - 1)] for i in range(children)])
        self.accepted = np.tile(prior * PRIOR_WEIGHT, (depth, 1))
        self.tried = np.full((depth, children), PRIOR_WEIGHT)

    def probabilities(self) -> np.ndarray:
        """[depth, children]: P, kept non-increasing along the siblings (what makes best-first optimal)."""
        p = np.clip(self.accepted / self.tried, 1e-6, 1.0)
        return np.minimum.accumulate(p, axis=1)

    def shape(self, root: int, budget: int, depth: int) -> tuple[DraftTree, list[float]]:
        """The best `budget`-node tree (parents first, best first) and each draft node's log path probability.
        Its tokens are placeholders (the root's id): the sampled tree draws them."""
        logp = np.log(self.probabilities())
        tokens, parents, depths, scores = [root], [-1], [0], []
        heap = [(-logp[0, 0], 0, 0)] if depth > 0 and budget > 0 else []  # (-score, parent, sibling index)
        while heap and len(tokens) <= budget:
            neg, parent, i = heapq.heappop(heap)
            node, d = len(tokens), depths[parent] + 1
            tokens.append(root)
            parents.append(parent)
            depths.append(d)
            scores.append(-neg)
            if i + 1 < self.children:  # the next sibling, after this one
                heapq.heappush(heap, (neg - logp[d - 1, i + 1] + logp[d - 1, i], parent, i + 1))
            if d < min(depth, len(logp)):  # this node's first child
                heapq.heappush(heap, (neg - logp[d, 0], node, 0))
        return DraftTree(np.asarray(tokens), np.asarray(parents)), scores

    def learn(self, tree: DraftTree, start: int, tokens: list[int]) -> None:
        """Count, along the accepted path of a tree sent after `start` tokens (its children in draw order), which
        sibling position the target accepted; `tokens` is the context after that step."""
        returned = tokens[start:-1]  # the last token is the target's own (the bonus), never a draft
        node, d = 0, 0
        while d < len(self.tried):
            kids = tree.children[node][: self.children]
            if not kids:
                return
            self.tried[d, : len(kids)] += 1
            nxt = returned[d] if d < len(returned) else None
            hit = next((i for i, c in enumerate(kids) if int(tree.tokens[c]) == nxt), None)
            if hit is None:
                return
            self.accepted[d, hit] += 1
            node, d = kids[hit], d + 1
