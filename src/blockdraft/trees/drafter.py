"""TreeDrafter: a lattice drafter whose proposals are trees built under a node budget."""

from __future__ import annotations

from ..drafters.base import DraftContext, Drafter
from ..errors import BlockdraftError
from .budget import CostCurve, keep_best, node_budget
from .builders import DEFAULT_STATIC_PATHS, best_first_tree, static_tree
from .sampled import drafting_generator, sampled_tree
from .tree import DraftTree

BUILDERS = ("static", "best")


class TreeDrafter(Drafter):
    """`builder='static'`: Medusa's fixed top-k tree; `'best'`: best-first over marginals (DDTree),
    optionally with an n-gram prior of weight `alpha`. `budget` = draft nodes, root excluded.

    With a `cost_curve` (budget 'auto', best-first only) every step builds up to the curve's
    largest budget and keeps the best B for which the expected accepted tokens per unit of
    verification time is highest (trees/budget.py).

    `sample=True` (best-first only): at T > 0 the best-first tree's nodes are refilled with children
    drawn from the depth's temperature-adjusted marginal without replacement, and their q is reported
    (trees/sampled.py); at T = 0 the tree is the deterministic one. `vocab_size` (the target's) sizes q.
    `draft_temp` scales the temperature the children are drawn at (1 = the decoder's; any q stays exact).
    """

    wraps = ("base",)

    def __init__(self, base: Drafter, builder: str = "best", budget: int = 16, prior=None, alpha: float = 0.0,
                 paths=DEFAULT_STATIC_PATHS, cost_curve: CostCurve | dict[int, float] | None = None,
                 sample: bool = False, vocab_size: int | None = None, draft_temp: float = 1.0):
        if builder not in BUILDERS:
            raise BlockdraftError(f"tree builder must be one of {', '.join(BUILDERS)}, got '{builder}'")
        if cost_curve is not None and builder != "best":
            raise BlockdraftError("budget 'auto' needs a best-first tree (its nodes come best first)")
        cost_curve = CostCurve.of(cost_curve)
        budget = node_budget(budget, cost_curve)
        if not 0.0 <= alpha <= 1.0:
            raise BlockdraftError(f"the prior weight alpha must lie in [0, 1], got {alpha}")
        if not hasattr(base, "lattice"):
            raise BlockdraftError(f"drafter '{base.name}' has no top-k lattice to build trees from")
        self.base, self.builder, self.budget, self.prior, self.alpha = base, builder, budget, prior, alpha
        if sample and (builder != "best" or vocab_size is None):
            raise BlockdraftError("sampled trees need the best-first builder (and the target's vocabulary size)")
        self.paths, self.cost_curve = paths, cost_curve
        if not draft_temp > 0:
            raise BlockdraftError(f"draft_temp must be positive, got {draft_temp}")
        self.sample, self.vocab_size, self.draft_temp = sample, vocab_size, draft_temp
        self.feature_layers = base.feature_layers

    def reset(self, prompt_ids) -> None:
        self.base.reset(prompt_ids)

    def observe(self, ctx: DraftContext) -> None:
        self.base.observe(ctx)

    def propose(self, ctx: DraftContext) -> DraftTree:
        if self.builder == "static":
            lattice = self.base.lattice(ctx)
            if lattice is None:
                return DraftTree.root_only(ctx.tokens[-1])
            return static_tree(ctx.tokens[-1], lattice, self.paths, self.budget, ctx.max_depth)
        tree, scores = self.scored_tree(ctx)
        # with a prior the scores mix in n-gram log-probs: read exp(score) as a rough acceptance estimate
        return keep_best(tree, scores, self.cost_curve, len(ctx.tokens))

    def scored_tree(self, ctx: DraftContext) -> tuple[DraftTree, list[float]]:
        """The best-first tree under the budget, and each draft node's cumulative log-prob (best first)."""
        if self.builder != "best":
            raise BlockdraftError("only a best-first tree has scores (the static builder has none)")
        root = ctx.tokens[-1]
        lattice = self.base.lattice(ctx)
        if lattice is None:
            return DraftTree.root_only(root), []
        scores: list[float] = []
        tree = best_first_tree(root, lattice, self.budget, ctx.max_depth, self.prior, self.alpha, ctx.tokens, scores)
        if self.sample and ctx.temperature > 0:
            # draw only the nodes that will be sent: the budget 'auto' cut depends on the shape's scores alone
            tree = keep_best(tree, scores, self.cost_curve, len(ctx.tokens))
            tree, scores = sampled_tree(tree, scores[: len(tree) - 1], lattice, ctx.temperature * self.draft_temp,
                                        drafting_generator(ctx), self.vocab_size)
        return tree, scores
