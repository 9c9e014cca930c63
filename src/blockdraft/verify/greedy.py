"""Greedy acceptance: keep drafts while they equal the target's argmax (exact at T = 0)."""

from __future__ import annotations

import torch

from ..trees import DraftTree
from .base import Acceptance, Acceptor, child_with_token


class GreedyAcceptor(Acceptor):
    name = "greedy"

    def accept(self, tree: DraftTree, logits: torch.Tensor, gen=None) -> Acceptance:
        # Only the rows along the accepted path are read and converted: numpy's argmax of one row of the target's
        # vocabulary takes ~15 us with the conversion from bf16, while torch's max over all rows of a 32-node tree
        # takes ~0.4 ms and converting them all ~0.16 ms. Both argmaxes return the first maximal index.
        def best(node: int) -> int:
            return int(logits[node].detach().float().cpu().numpy().argmax())

        path, node = [0], 0
        while (child := child_with_token(tree, node, token := best(node))) is not None:
            path.append(child)
            node = child
        return Acceptance(path, token)
