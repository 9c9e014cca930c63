"""RescoredDrafter: any lattice drafter (BPD heads, block drafter) with its drafts refined by an LM."""

from __future__ import annotations

from ..drafters.base import DraftContext, Drafter
from ..errors import BlockdraftError
from ..trees import DraftTree
from .search import Rescorer, local_rescore, pbest_paths

MODES = ("local", "global")


class RescoredDrafter(Drafter):
    """Replaces the base drafter's Predict step; the target still verifies, so output is unchanged.

    mode 'local':  one draft, chosen left to right by (1-a) * drafter + a * rescorer (Kim et al. 4.1)
    mode 'global': the p best lattice paths under the same score, merged into a trie and verified
                   in one target call ("p-best n-gram BPD", Kim et al. 4.2)
    """

    wraps = ("base",)

    def __init__(self, base: Drafter, rescorer: Rescorer | None, mode: str = "global", alpha: float = 0.3,
                 p: int = 16, beam: int = 256):
        if mode not in MODES:
            raise BlockdraftError(f"rescoring mode must be one of {', '.join(MODES)}, got '{mode}'")
        if not 0.0 <= alpha <= 1.0:
            raise BlockdraftError(f"the rescoring weight alpha must lie in [0, 1], got {alpha}")
        if p < 1:
            raise BlockdraftError(f"p (paths to verify) must be at least 1, got {p}")
        if not hasattr(base, "lattice"):
            raise BlockdraftError(f"drafter '{base.name}' has no top-k lattice to rescore")
        self.base, self.rescorer, self.mode, self.alpha, self.p, self.beam = base, rescorer, mode, alpha, p, beam
        self.feature_layers = base.feature_layers
        self.last_lattice = None
        self.last_paths: list[list[int]] = []

    def reset(self, prompt_ids) -> None:
        self.base.reset(prompt_ids)

    def observe(self, ctx: DraftContext) -> None:
        self.base.observe(ctx)

    def propose(self, ctx: DraftContext) -> DraftTree:
        root = ctx.tokens[-1]
        lattice = self.base.lattice(ctx)
        self.last_lattice = lattice
        if lattice is None:
            return DraftTree.root_only(root)
        depth = min(lattice.depth, ctx.max_depth)
        if self.mode == "local":
            path = local_rescore(lattice, ctx.tokens, self.rescorer, self.alpha, depth)
            self.last_paths = [path]
            return DraftTree.chain(root, path)
        paths, _ = pbest_paths(lattice, ctx.tokens, self.rescorer, self.alpha, self.p, depth, self.beam)
        self.last_paths = paths.tolist()
        return DraftTree.from_paths(root, self.last_paths)
