"""The acceptor protocol: walk the verified tree from the root, keep a path, add a bonus token."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..trees import DraftTree
from .sampling import SamplingParams


@dataclass
class Acceptance:
    path: list[int]  # accepted node indices, root (0) first
    bonus: int  # the target's own token after the last accepted node

    @property
    def accepted_drafts(self) -> int:
        """Drafted tokens the target kept (the root and the bonus are not drafts)."""
        return len(self.path) - 1


class Acceptor:
    """Decides, node by node from the root, whether the target keeps one of the node's children.

    Subclasses implement `choose`: given the target's logits at a node, return the accepted
    child (or None) and the token to emit if the walk stops here. Every step of the walk emits
    exactly one token, so each verification pass yields at least one.
    """

    lossless = True
    name = "base"

    def __init__(self, params: SamplingParams | None = None):
        self.params = params or SamplingParams()

    def choose(self, tree: DraftTree, node: int, logits: torch.Tensor, gen: torch.Generator | None):
        raise NotImplementedError

    def accept(self, tree: DraftTree, logits: torch.Tensor, gen: torch.Generator | None = None) -> Acceptance:
        path, node = [0], 0
        while True:
            child, token = self.choose(tree, node, logits[node], gen)
            if child is None:
                return Acceptance(path, token)
            path.append(child)
            node = child


def sample(p: torch.Tensor, gen: torch.Generator | None) -> int:
    """One draw from p (unnormalised is fine) with `gen`, on the generator's device (the decoder's is a CPU
    generator, so a run's samples depend on its seed, not on where the target runs).

    By inverting the float64 CDF: torch.multinomial over a 49k vocabulary is ~20x dearer on one CPU core, and
    every step at T > 0 draws at least once (BENCHMARKS.md, "Decisions": acceptance costs)."""
    if gen is not None and p.device != gen.device:
        p = p.to(gen.device)
    cdf = p.double().cumsum(-1)
    u = torch.rand((), generator=gen, dtype=torch.float64, device=cdf.device) * cdf[-1]
    return min(int(torch.searchsorted(cdf, u, right=True)), len(cdf) - 1)


def child_with_token(tree: DraftTree, node: int, token: int) -> int | None:
    tokens = tree.tokens
    for c in tree.children[node]:
        if int(tokens[c]) == token:
            return c
    return None
