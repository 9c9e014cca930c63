"""Greedy acceptance: keep drafts while they equal the target's argmax (exact at T = 0)."""

from __future__ import annotations

import torch

from ..trees import DraftTree
from .base import Acceptance, Acceptor, child_with_token


class GreedyAcceptor(Acceptor):
    name = "greedy"

    def accept(self, tree: DraftTree, logits: torch.Tensor, gen=None) -> Acceptance:
        best = logits.argmax(-1).tolist()  # one op for all nodes instead of one per visited node
        path, node = [0], 0
        while (child := child_with_token(tree, node, best[node])) is not None:
            path.append(child)
            node = child
        return Acceptance(path, best[node])
