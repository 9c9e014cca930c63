"""Drafters: everything that proposes draft tokens for the target to verify."""

from .ar import NoDrafter
from .base import DraftContext, Drafter
from .lookup import PromptLookupDrafter

__all__ = ["DraftContext", "Drafter", "NoDrafter", "PromptLookupDrafter"]
