"""Acceptance rules: which drafted tokens the target keeps after one verification pass."""

from .base import Acceptance, Acceptor
from .greedy import GreedyAcceptor
from .rejection import RejectionAcceptor, SampleAndWalkAcceptor
from .sampling import SamplingParams
from .traversal import TraversalAcceptor
from .typical import TypicalAcceptor
from ..errors import BlockdraftError

ACCEPTORS = {
    "greedy": GreedyAcceptor,
    "rejection": RejectionAcceptor,
    "traversal": TraversalAcceptor,
    "walk": SampleAndWalkAcceptor,
    "typical": TypicalAcceptor,
}


def make_acceptor(name: str | None, params: SamplingParams) -> Acceptor:
    """`None` picks the lossless default: greedy at T = 0, recursive rejection sampling at T > 0.

    'traversal' accepts more sampled drafts (and as many deterministic ones) but is not the default yet: the
    batch decoder caps each sequence's tree by the batch's row budget, and traversal's random draws depend on
    the whole tree, so a seeded sampled run would no longer write the same text batched as one at a time."""
    if name is None:
        name = "greedy" if params.greedy else "rejection"
    if name not in ACCEPTORS:
        raise BlockdraftError(f"unknown acceptor '{name}': choose one of {', '.join(ACCEPTORS)}")
    if name == "greedy" and not params.greedy:
        raise BlockdraftError("the greedy acceptor needs temperature 0; use 'rejection' or 'walk' to sample")
    return ACCEPTORS[name](params)


__all__ = [
    "ACCEPTORS",
    "Acceptance",
    "Acceptor",
    "GreedyAcceptor",
    "RejectionAcceptor",
    "SampleAndWalkAcceptor",
    "SamplingParams",
    "TraversalAcceptor",
    "TypicalAcceptor",
    "make_acceptor",
]
