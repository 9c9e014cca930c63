"""Medusa typical acceptance: LOSSY. Keeps a draft the target finds plausible enough, not exact."""

from __future__ import annotations

import torch

from ..trees import DraftTree
from .base import Acceptor, sample


class TypicalAcceptor(Acceptor):
    """Accept child x when p(x) > min(eps, delta * exp(-H(p))) (Medusa, eps=0.09, delta=0.3).

    The output is *not* distributed as the target's: use it only when you accept that.
    At temperature 0 p is one-hot, so it reduces to greedy acceptance.
    """

    name = "typical"
    lossless = False

    def __init__(self, params=None, eps: float = 0.09, delta: float = 0.3):
        super().__init__(params)
        self.eps, self.delta = eps, delta

    def choose(self, tree: DraftTree, node: int, logits: torch.Tensor, gen):
        p = self.params.probs(logits)
        entropy = -(p * p.clamp_min(1e-30).log()).sum()
        threshold = min(self.eps, self.delta * float(torch.exp(-entropy)))
        for c in tree.children[node]:
            x = int(tree.tokens[c])
            if float(p[x]) > threshold:
                return c, x
        return None, (int(p.argmax()) if self.params.greedy else sample(p, gen))
