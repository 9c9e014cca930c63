"""Drafters: everything that proposes draft tokens for the target to verify."""

from .ar import NoDrafter
from .base import DraftContext, Drafter
from .bpd import BPDDrafter
from .dflash import DFlashDrafter
from .lattice import DraftLattice
from .lookup import PromptLookupDrafter
from .suffix import SuffixDrafter

__all__ = ["BPDDrafter", "DFlashDrafter", "DraftContext", "DraftLattice", "Drafter", "NoDrafter",
           "PromptLookupDrafter", "SuffixDrafter"]
