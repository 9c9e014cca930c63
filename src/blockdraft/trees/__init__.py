"""Draft trees: the token trees the target verifies in one forward pass."""

from .tree import DraftTree

__all__ = ["DraftTree"]
