"""Lossless sampling on trees: sample-and-walk (TreeFlash) and recursive rejection sampling (SpecInfer)."""

from __future__ import annotations

import torch

from ..trees import DraftTree
from .base import Acceptor, child_with_token, sample


class SampleAndWalkAcceptor(Acceptor):
    """Sample one target token at the node; follow the child that drafted it, else emit it.

    Each emitted token is a fresh sample from the target's distribution given the accepted
    prefix, so the output is distributed exactly as plain sampling. Ignores draft probabilities.
    """

    name = "walk"

    def choose(self, tree: DraftTree, node: int, logits: torch.Tensor, gen):
        token = sample(self.params.probs(logits), gen)
        return child_with_token(tree, node, token), token


class RejectionAcceptor(Acceptor):
    """Recursive rejection sampling over the children of each node (Leviathan et al.; SpecInfer).

    Child c with token x, drawn from q_c, is accepted with probability min(1, r(x) / q_c(x)),
    where r starts as the target distribution p; after a rejection r <- norm(max(r - q_c, 0)).
    If no child is accepted the bonus token is drawn from the final r. This is exact whenever
    each child was drawn from its q_c independently of its earlier siblings; a child chosen
    deterministically (argmax, lookup, top-k) has q_c = one-hot(x). With one-hot q this has the
    same acceptance probability as sample-and-walk; with real draft probabilities (a sampling
    drafter) it accepts more.
    """

    name = "rejection"

    def choose(self, tree: DraftTree, node: int, logits: torch.Tensor, gen):
        r = self.params.probs(logits)
        for c in tree.children[node]:
            x = int(tree.tokens[c])
            q = None if tree.q is None or torch.isnan(tree.q[c, 0]) else tree.q[c].to(r.device, torch.float32)
            q_x = 1.0 if q is None else float(q[x])
            if q_x > 0 and float(torch.rand((), generator=gen)) * q_x < float(r[x]):
                return c, x
            if q is None:
                r = r.clone()
                r[x] = 0.0
            else:
                r = (r - q).clamp_min(0.0)
            total = r.sum()
            if total <= 0:  # r was entirely covered by the drafts; cannot happen for a valid q
                r = self.params.probs(logits)
            else:
                r = r / total
        return None, sample(r, gen)
