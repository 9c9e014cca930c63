"""Sampled draft trees (children drawn without replacement, q reported) keep sampling exact and accept more.

The toy Markov target of test_sampling_lossless gives exact probabilities for many samples; the tiny
Llama runs the real loop (the decoder hands its temperature and generator to the drafter). A variant
that reports each child's q *without* removing its earlier siblings (the with-replacement formula on
draws made without replacement) must fail the same test.
"""

import pytest
import torch

from blockdraft import DraftContext, SamplingParams
from blockdraft.errors import BlockdraftError
from blockdraft.drafters.base import Drafter, LatticeDrafter
from blockdraft.drafters.lattice import DraftLattice
from blockdraft.trees import DraftTree
from blockdraft.trees.builders import best_first_transition_tree
from blockdraft.trees.drafter import TreeDrafter
from blockdraft.trees.sampled import sampled_tree, tempered
from blockdraft.verify import RejectionAcceptor

from test_sampling_lossless import (DEPTH, PROMPT, SCORED, TABLE, V, chi_square_p, exact_joint, loop_samples,
                                    markov_expected)
from test_sampling_lossless import loop_target  # noqa: F401, F811 (a fixture, used by name)


class FixedLattice(LatticeDrafter):
    """The same marginal lattice at every step: every token at every depth, random log-probs."""

    name = "fixed-lattice"

    def __init__(self, logp: torch.Tensor):
        self.logp = torch.log_softmax(logp, -1)

    def lattice(self, ctx):
        top = self.logp.topk(self.logp.shape[-1], -1)
        return DraftLattice(top.indices, top.values)


class TableDrafter(Drafter):
    """Transition tables that are the Markov target's own rows (q = p when sampled at the same T)."""

    name = "table"

    def __init__(self, logits: torch.Tensor, depth: int = 3, budget: int = 6, sample: bool = True,
                 parents: int = V, more_rows: bool = False):
        self.logp = torch.log_softmax(logits, -1)
        self.depth, self.budget, self.sample = depth, budget, sample
        self.parents, self.more_rows = parents, more_rows  # tables for the first `parents` tokens only

    def rows(self, tokens, depth):
        top = self.logp[tokens].topk(V, -1)
        return top.indices.numpy(), top.values.numpy()

    def propose(self, ctx):
        root = ctx.tokens[-1]
        marg = self.logp[[root] * self.depth].topk(V, -1)  # fallback rows, for tokens without a table row
        lattice = DraftLattice(marg.indices, marg.values)
        parents = torch.arange(self.parents).repeat(self.depth, 1)  # [D, M]
        parents[0] = root
        top = self.logp[parents].topk(V, -1)  # row (d, m): the target's distribution after token parents[d, m]
        scores = []
        tree = best_first_transition_tree(root, lattice, parents, top.indices[..., :3], top.values[..., :3],
                                          self.budget, scores=scores)
        if not self.sample:
            return tree
        return sampled_tree(tree, scores, lattice, ctx.temperature, ctx.generator, V, parents, top.indices,
                            top.values, self.rows if self.more_rows else None)[0]


# a drafter that is close to the target but not equal to it: children get rejected, so siblings matter
DRAFT_TABLE = TABLE + torch.randn(V, V, generator=torch.Generator().manual_seed(11))


class WithReplacementQ(Drafter):
    """The bug: each child reports the full q of its node, as if siblings had been drawn independently."""

    name = "with-replacement-q"

    def __init__(self, inner):
        self.inner = inner

    def propose(self, ctx):
        tree = self.inner.propose(ctx)
        q = tree.q.clone()
        for kids in tree.children:
            for c in kids[1:]:
                q[c] = q[kids[0]]
        return DraftTree(tree.tokens, tree.parents, q)


def markov_counts(drafter, params, n, seed=0):
    """Like test_sampling_lossless.markov_samples, with the temperature and generator in the context."""
    gen = torch.Generator().manual_seed(seed)
    acceptor = RejectionAcceptor(params)
    counts, accepted = {}, 0
    for _ in range(n):
        tokens = [0]
        while len(tokens) < 3:
            tree = drafter.propose(DraftContext(tokens, None, 8, params.temperature, gen))
            acc = acceptor.accept(tree, TABLE[tree.tokens], gen)
            accepted += acc.accepted_drafts
            tokens += tree.tokens[acc.path[1:]].tolist() + [acc.bonus]
        key = tuple(tokens[1:3])
        counts[key] = counts.get(key, 0) + 1
    return counts, accepted


def marginal_tree(seed=0, budget=7, draft_temp=1.0):
    logp = torch.randn(4, V, generator=torch.Generator().manual_seed(seed))
    return TreeDrafter(FixedLattice(logp), "best", budget, sample=True, vocab_size=V, draft_temp=draft_temp)


def test_sampled_tree_rows_are_the_draw_sequence():
    """Each child's q is its node's tempered row minus the earlier siblings' tokens, renormalised; the
    children of a node are distinct and were drawn from inside the row's support."""
    drafter = marginal_tree(budget=12)
    gen = torch.Generator().manual_seed(3)
    tree = drafter.propose(DraftContext([0], None, 8, 0.8, gen))
    assert len(tree) == 13 and torch.isnan(tree.q[0]).all()
    plain = TreeDrafter(drafter.base, "best", 12).propose(DraftContext([0], None, 8))
    assert tree.parents.tolist() == plain.parents.tolist()  # the deterministic tree's shape, fixed before drawing
    assert tree.tokens.tolist() != plain.tokens.tolist()
    full = torch.from_numpy(tempered(drafter.base.logp.numpy(), 0.8)).float()
    for node, kids in enumerate(tree.children):
        tokens = tree.tokens[kids].tolist()
        assert len(set(tokens)) == len(tokens)
        d = int(tree.depth[node])
        for i, c in enumerate(kids):
            expected = full[d].clone()
            expected[tokens[:i]] = 0
            assert torch.allclose(tree.q[c], expected / expected.sum(), atol=1e-6)
            assert tree.q[c, tokens[i]] > 0


def test_at_temperature_zero_the_tree_is_the_deterministic_one():
    drafter = marginal_tree()
    plain = TreeDrafter(drafter.base, "best", 7)
    ctx = DraftContext([0], None, 8)
    a, b = drafter.propose(ctx), plain.propose(ctx)
    assert a.q is None and a.tokens.tolist() == b.tokens.tolist() and a.parents.tolist() == b.parents.tolist()


@pytest.mark.parametrize("params", [SamplingParams(1.0), SamplingParams(0.7, top_k=4, top_p=0.9)])
@pytest.mark.parametrize("kind", ["marginal", "tables", "marginal-drawn-sharper", "tables-rows-on-demand"])
def test_sampled_trees_sample_the_target_distribution(kind, params):
    """Exact for any q, so also for children drawn at half the decoder's temperature (draft_temp=0.5), and
    for rows computed on demand for drawn tokens that have no table row (their q depends on the draws above)."""
    n = 12000
    drafter = {"marginal": lambda: marginal_tree(), "tables": lambda: TableDrafter(DRAFT_TABLE),
               "marginal-drawn-sharper": lambda: marginal_tree(draft_temp=0.5),
               "tables-rows-on-demand": lambda: TableDrafter(DRAFT_TABLE, parents=2, more_rows=True)}[kind]()
    counts, _ = markov_counts(drafter, params, n)
    assert chi_square_p(counts, markov_expected(params, TABLE), n) > 0.01


def test_draft_temp_changes_the_draws_and_is_checked():
    sharp = marginal_tree(draft_temp=0.05).propose(DraftContext([0], None, 8, 1.0, torch.Generator()))
    flat = marginal_tree().propose(DraftContext([0], None, 8, 1.0, torch.Generator()))
    assert sharp.q[1].max() > 0.9 and flat.q[1].max() < 0.5  # drawn (and reported) at 0.05 x T: nearly one-hot
    with pytest.raises(BlockdraftError, match="draft_temp must be positive"):
        marginal_tree(draft_temp=0.0)


def test_with_replacement_q_on_draws_without_replacement_fails_the_same_test():
    n = 12000
    params = SamplingParams(1.0)
    counts, _ = markov_counts(WithReplacementQ(TableDrafter(DRAFT_TABLE)), params, n)
    assert chi_square_p(counts, markov_expected(params, TABLE), n) < 1e-4


def test_sampled_children_accept_more_than_deterministic_ones():
    """Same tables and budget: drafts drawn from q (= the target here) with their q reported, against the
    top-K children verified as one-hot drafts."""
    params = SamplingParams(1.0)
    _, sampled = markov_counts(TableDrafter(TABLE), params, 3000)
    _, top = markov_counts(TableDrafter(TABLE, sample=False), params, 3000)
    assert sampled > 1.15 * top


def test_decoder_hands_temperature_and_generator_to_a_sampled_tree(loop_target):  # noqa: F811
    """The real loop on a tiny Llama: marginals of the exact joint as the lattice, children sampled."""
    params = SamplingParams(1.0)
    joint = exact_joint(loop_target.model, params, SCORED)
    q = torch.zeros(DEPTH, V)
    for key, prob in joint.items():
        for d in range(DEPTH):
            q[d, key[d]] += prob
    drafter = TreeDrafter(FixedLattice(q.log()), "best", 6, sample=True, vocab_size=V)
    n = 1500
    counts, steps = loop_samples(loop_target, RejectionAcceptor(params), drafter, n)
    assert chi_square_p(counts, joint, n) > 0.01
    assert sum(lengths[0] == DEPTH + 1 for lengths in steps) > 0.05 * n  # whole sampled paths accepted
    tree = drafter.propose(DraftContext(PROMPT, None, 8, 1.0, torch.Generator().manual_seed(0)))
    assert tree.q is not None and len(tree) == 7


@pytest.mark.parametrize("more_rows", [True, False])
def test_a_drawn_token_without_a_table_row_gets_its_own_row_on_demand(more_rows):
    """Tables for tokens 0 and 1 only: a child of any other drawn token is drawn from that token's own row when
    the drafter can compute it (`more_rows`), else from the depth's marginal row."""
    drafter = TableDrafter(DRAFT_TABLE, budget=12, parents=2, more_rows=more_rows)
    gen = torch.Generator().manual_seed(5)
    conditioned = marginal = 0
    for _ in range(20):
        tree = drafter.propose(DraftContext([0], None, 8, 1.0, gen))
        for node, kids in enumerate(tree.children):
            token = int(tree.tokens[node])
            if not kids or node == 0 or token < 2:
                continue
            own = torch.from_numpy(tempered(drafter.logp[token].numpy(), 1.0)).float()
            fallback = torch.from_numpy(tempered(drafter.logp[0].numpy(), 1.0)).float()  # the root's: the lattice
            first = tree.q[kids[0]]
            conditioned += torch.allclose(first, own, atol=1e-5)
            marginal += torch.allclose(first, fallback, atol=1e-5)
    if more_rows:
        assert conditioned > 0 and marginal == 0
    else:
        assert conditioned == 0 and marginal > 0
