"""Token recycling: draft from the candidates the target itself ranked in earlier verification passes.

Luo et al., "Turning Trash into Treasure: Accelerating Inference of Large Language Models with
Token Recycling". Every verification pass computes the target's next-token distribution at
every tree node, and all but the accepted path's are thrown away. Recycling keeps, per token,
the top-k next tokens (and their probabilities) from the latest pass in which that token was a
node: an adjacency table V x k, refreshed after every step (`on_step`) and kept across generations. Drafting is a
best-first walk through it from the root, a tree of the `budget` most probable paths. It costs
no model call and needs no training.
"""

from __future__ import annotations

import heapq

import torch

from ..errors import BlockdraftError
from ..trees import DraftTree
from .base import DraftContext, Drafter
from .suffix_index import Candidates


class RecycleDrafter(Drafter):
    """Best-first trees over an adjacency table of the target's own recent top-k predictions."""

    name = "recycle"

    def __init__(self, vocab_size: int, k: int = 8, budget: int = 16, depth: int = 8, min_prob: float = 0.02):
        if k < 1 or budget < 1 or depth < 1:
            raise BlockdraftError("recycle needs k, budget and depth >= 1")
        self.k, self.budget, self.depth, self.min_prob = k, budget, depth, min_prob
        self.vocab_size = vocab_size
        # the table, shared by this drafter's forks (every sequence of a batch writes to it, as in one sequence)
        self.next_tokens = torch.zeros(self.vocab_size, self.k, dtype=torch.long)
        self.next_probs = torch.zeros(self.vocab_size, self.k)  # 0: nothing seen after this token yet

    def forget(self) -> None:
        self.next_tokens.zero_()  # in place: the forks hold the same tensors
        self.next_probs.zero_()

    @torch.inference_mode()
    def on_step(self, tree: DraftTree, logits: torch.Tensor, path: list[int]) -> None:
        """Row t of the table <- the target's top-k after the latest node holding token t."""
        logits = logits.float()  # the target's dtype (bf16) would round the log-normaliser
        top = logits.topk(self.k, -1)
        probs = torch.exp(top.values - torch.logsumexp(logits, -1, keepdim=True))
        self.next_tokens[tree.tokens] = top.indices  # on repeated tokens the later (deeper) node wins
        self.next_probs[tree.tokens] = probs

    def candidates(self, root: int, depth: int) -> tuple[list[int], list[int], list[float]]:
        """(tokens, parents, path probabilities) of the best-first tree under the root, best first."""
        tokens, parents, probs = [], [], []
        rows: dict[int, tuple[list[int], list[float]]] = {}

        def row(tok):
            if tok not in rows:
                rows[tok] = (self.next_tokens[tok].tolist(), self.next_probs[tok].tolist())
            return rows[tok]

        heap = [(-p, -1, t, 1) for t, p in zip(*row(root), strict=True) if p > 0 and p >= self.min_prob]  # 0: no entry
        heapq.heapify(heap)
        while heap and len(tokens) < self.budget:
            neg, parent, tok, d = heapq.heappop(heap)
            node = len(tokens)
            tokens.append(tok)
            parents.append(parent)
            probs.append(-neg)
            if d < depth:
                for t, p in zip(*row(tok), strict=True):
                    if p > 0 and -neg * p >= self.min_prob:
                        heapq.heappush(heap, (neg * p, node, t, d + 1))
        return tokens, parents, probs

    def retrieve(self, ctx: DraftContext, depth: int) -> list[tuple[str | None, Candidates]]:
        """The best-first tree under the root as hybrid's candidates (no match length: calibrated as one bin)."""
        return [(None, Candidates(*self.candidates(ctx.tokens[-1], depth), 0))]

    def propose(self, ctx: DraftContext) -> DraftTree:
        root = ctx.tokens[-1]
        depth = min(self.depth, ctx.max_depth)
        if depth <= 0:
            return DraftTree.root_only(root)
        tokens, parents, _ = self.candidates(root, depth)
        return DraftTree([root] + tokens, [-1] + [p + 1 for p in parents])
