"""Greedy acceptance: keep drafts while they equal the target's argmax (exact at T = 0)."""

from __future__ import annotations

import torch

from ..trees import DraftTree
from .base import Acceptance, Acceptor, child_with_token


class GreedyAcceptor(Acceptor):
    name = "greedy"
    CONVERT_ALL = 8  # trees of at most this many nodes have all their rows converted at once

    def accept(self, tree: DraftTree, logits: torch.Tensor, gen=None) -> Acceptance:
        # Only the rows along the accepted path are read: numpy's argmax of one row is far cheaper than torch's max
        # over every row of a large tree. Converting bf16 rows costs less a row when all are converted at once, but
        # a large tree's unread rows outweigh that, so a small tree is converted whole and a large one row by row
        # (BENCHMARKS.md, "Decisions": acceptance costs). Both argmaxes return the first maximal index.
        small = len(tree) <= self.CONVERT_ALL
        rows = logits.detach().float().cpu().numpy() if small else None

        def best(node: int) -> int:
            row = rows[node] if small else logits[node].detach().float().cpu().numpy()
            return int(row.argmax())

        path, node = [0], 0
        while (child := child_with_token(tree, node, token := best(node))) is not None:
            path.append(child)
            node = child
        return Acceptance(path, token)
