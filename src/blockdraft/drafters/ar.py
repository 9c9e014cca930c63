"""The `ar` method: no drafting at all, i.e. plain autoregressive decoding through the same Target code."""

from __future__ import annotations

from ..trees import DraftTree
from .base import DraftContext, Drafter


class NoDrafter(Drafter):
    """Proposes nothing: every step verifies the root alone and emits one token (tau = 1)."""

    name = "ar"

    def propose(self, ctx: DraftContext) -> DraftTree:
        return DraftTree.root_only(ctx.tokens[-1])
