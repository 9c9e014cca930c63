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
    """`None` picks the lossless default: greedy at T = 0, traversal verification at T > 0 (it accepts as
    much as token-level rejection on deterministic drafts and more on sampled ones)."""
    if name is None:
        name = "greedy" if params.greedy else "traversal"
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
