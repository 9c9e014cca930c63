"""Drafters: everything that proposes draft tokens for the target to verify."""

from .ar import NoDrafter
from .base import DraftContext, Drafter
from .block import BlockDrafter
from .heads import HeadsDrafter
from .lattice import DraftLattice
from .lookup import PromptLookupDrafter
from .suffix import SuffixDrafter

__all__ = ["BlockDrafter", "DraftContext", "DraftLattice", "Drafter", "HeadsDrafter", "NoDrafter",
           "PromptLookupDrafter", "SuffixDrafter"]
