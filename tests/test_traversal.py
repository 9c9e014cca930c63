"""Traversal verification keeps sampling exact on chains and trees, and accepts more than token-level rejection.

Exactness is a property of whole blocks (a path is kept by its sequence-level weight), so the toy Markov
test here scores the first three tokens, which depth-3 drafts decide together. The negative control
keeps a node's weight unchanged when a child is removed: it accepts more, and must fail.
"""

import itertools

import numpy as np
import pytest
import torch

from blockdraft import DraftContext, SamplingParams
from blockdraft.trees.drafter import TreeDrafter
from blockdraft.verify import RejectionAcceptor, TraversalAcceptor, make_acceptor
from blockdraft.verify.traversal import Residual

from drafters_for_tests import RandomTreeDrafter, SampledChainDrafter, SampledTreeDrafter
from test_sampled_trees import DRAFT_TABLE, FixedLattice, TableDrafter, marginal_tree
from test_sampling_lossless import (DEPTH, FILTERED, SCORED, TABLE, V, chi_square_p, exact_joint, loop_drafter,
                                    loop_samples)
from test_sampling_lossless import loop_target  # noqa: F401 (a fixture, used by name)

LENGTH = 3  # scored tokens of the toy target


class KeptWeight(TraversalAcceptor):
    """The bug: a node keeps its weight when a child is removed, as if the child's rejection said nothing."""

    @staticmethod
    def absorbed_weight(mass, weight):
        return weight


def toy_counts(acceptor, drafter, n, seed=0):
    """n generations of LENGTH tokens against the toy Markov target; counts and accepted drafts per step."""
    gen = torch.Generator().manual_seed(seed)
    counts, accepted, steps = {}, 0, 0
    for _ in range(n):
        tokens = [0]
        while len(tokens) <= LENGTH:
            tree = drafter.propose(DraftContext(tokens, None, 8, acceptor.params.temperature, gen))
            acc = acceptor.accept(tree, TABLE[tree.tokens], gen)
            accepted, steps = accepted + acc.accepted_drafts, steps + 1
            tokens += tree.tokens[acc.path[1:]].tolist() + [acc.bonus]
        key = tuple(tokens[1: LENGTH + 1])
        counts[key] = counts.get(key, 0) + 1
    return counts, accepted / steps


def toy_expected(params):
    p = params.probs(TABLE)
    out = {}
    for seq in itertools.product(range(V), repeat=LENGTH):
        prob, prev = 1.0, 0
        for t in seq:
            prob, prev = prob * float(p[prev, t]), t
        out[seq] = prob
    return out


DRAFTERS = {
    "sampled-tables": lambda: TableDrafter(DRAFT_TABLE),  # without replacement, rows conditioned on the parent
    "sampled-marginals": lambda: marginal_tree(),
    "sampled-chain": lambda: SampledChainDrafter(V, length=3, seed=3),
    "iid-tree": lambda: SampledTreeDrafter(torch.softmax(0.7 * TABLE[[0, 1, 2]], -1), (2, 2, 1), seed=1),
    "deterministic-tree": lambda: RandomTreeDrafter(V, max_nodes=7, seed=1),
}


@pytest.mark.parametrize("kind,params", [("sampled-tables", SamplingParams(1.0)), ("sampled-marginals", FILTERED),
                                         ("sampled-chain", SamplingParams(1.0)), ("iid-tree", SamplingParams(1.0)),
                                         ("deterministic-tree", FILTERED)])
def test_traversal_samples_the_target_distribution(kind, params):
    n = 4000
    counts, _ = toy_counts(TraversalAcceptor(params), DRAFTERS[kind](), n)
    assert chi_square_p(counts, toy_expected(params), n) > 0.01


def test_dense_residuals_sample_the_target_distribution_too(monkeypatch):
    """A q over much of the vocabulary switches a node's residual to one dense array: the same law."""
    monkeypatch.setattr(Residual, "SPARSE_UP_TO", 0)
    n, params = 4000, SamplingParams(1.0)
    counts, _ = toy_counts(TraversalAcceptor(params), DRAFTERS["sampled-tables"](), n)
    assert chi_square_p(counts, toy_expected(params), n) > 0.01


def test_sparse_residual_matches_the_dense_update():
    """Three removals touching a few tokens of a 1000-token distribution, against norm(max(w p - q, 0)) in full."""
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(1000)).astype(np.float32)
    sparse, dense = Residual(p), p.astype(np.float64)
    for weight, size in [(0.9, 20), (0.6, 5), (1.0, 1)]:
        ids = np.sort(rng.choice(1000, size, replace=False))
        q = rng.dirichlet(np.ones(size))
        mass = sparse.remove(weight, ids, q)
        full = weight * dense
        full[ids] -= q
        full = np.maximum(full, 0.0)
        assert mass == pytest.approx(full.sum(), rel=1e-6)
        dense = full / full.sum()
        assert np.allclose(sparse.dense().numpy(), dense, atol=1e-9)
        assert sparse.at(int(ids[0])) == pytest.approx(dense[ids[0]], abs=1e-9)


@pytest.mark.parametrize("kind", ["sampled-tables", "sampled-chain"])
def test_a_node_that_keeps_its_weight_fails_the_same_test(kind):
    n = 4000
    params = SamplingParams(1.0)
    counts, _ = toy_counts(KeptWeight(params), DRAFTERS[kind](), n)
    assert chi_square_p(counts, toy_expected(params), n) < 1e-4


def test_traversal_accepts_more_sampled_drafts_and_as_many_deterministic_ones():
    """Sequence-level weights gain on sampled drafts (13% on this chain, 7% on the marginal tree); on
    deterministic drafts token-level rejection is already optimal and the two accept alike."""
    params = SamplingParams(1.0)

    def rate(acceptor, kind):
        return toy_counts(acceptor(params), DRAFTERS[kind](), 2500, seed=1)[1]

    assert rate(TraversalAcceptor, "sampled-chain") > 1.05 * rate(RejectionAcceptor, "sampled-chain")
    assert rate(TraversalAcceptor, "sampled-marginals") > 1.03 * rate(RejectionAcceptor, "sampled-marginals")
    deterministic = rate(TraversalAcceptor, "deterministic-tree") / rate(RejectionAcceptor, "deterministic-tree")
    assert 0.93 < deterministic < 1.07


def test_root_only_tree_emits_one_target_sample():
    params = SamplingParams(1.0)
    gen = torch.Generator().manual_seed(0)
    tree = RandomTreeDrafter(V, max_nodes=1).propose(DraftContext([2], None, 8))
    draws = [TraversalAcceptor(params).accept(tree, TABLE[tree.tokens], gen) for _ in range(3000)]
    assert all(d.path == [0] for d in draws)
    freq = torch.bincount(torch.tensor([d.bonus for d in draws]), minlength=V) / len(draws)
    assert torch.allclose(freq, params.probs(TABLE[2]), atol=0.03)


def test_traversal_is_chosen_by_name():
    assert make_acceptor("traversal", SamplingParams(0.8)).name == "traversal"
    assert make_acceptor(None, SamplingParams(0.8)).name == "rejection"  # the default (see make_acceptor)


def uniform_tree():
    """i.i.d. children from the uniform distribution: far from the target, so many paths end in rejections."""
    return SampledTreeDrafter(torch.full((DEPTH, V), 1.0 / V), (2, 2, 1), seed=1)


@pytest.mark.parametrize("drafter,params", [("iid", SamplingParams(1.0)), ("uniform", SamplingParams(1.0)),
                                            ("without-replacement", FILTERED)])
def test_decoder_with_traversal_on_tiny_llama_samples_the_target_distribution(loop_target, drafter,  # noqa: F811
                                                                              params):
    """The real loop: prefill, tree verification, traversal acceptance and KV commits of the accepted path."""
    joint = exact_joint(loop_target.model, params, SCORED)
    if drafter == "iid":
        tree_drafter = loop_drafter(joint, seed=1)
    elif drafter == "uniform":
        tree_drafter = uniform_tree()
    else:
        q = torch.zeros(DEPTH, V)
        for key, prob in joint.items():
            for d in range(DEPTH):
                q[d, key[d]] += prob
        tree_drafter = TreeDrafter(FixedLattice(q.clamp_min(1e-9).log()), "best", 6, sample=True, vocab_size=V)
    n = 1500
    counts, steps = loop_samples(loop_target, TraversalAcceptor(params), tree_drafter, n)
    assert chi_square_p(counts, joint, n) > 0.01
    assert sum(lengths[0] == DEPTH + 1 for lengths in steps) > 0.05 * n  # whole paths accepted


def test_kept_weight_fails_the_tiny_llama_test(loop_target):  # noqa: F811
    params = SamplingParams(1.0)
    joint = exact_joint(loop_target.model, params, SCORED)
    counts, _ = loop_samples(loop_target, KeptWeight(params), uniform_tree(), 1500)
    assert chi_square_p(counts, joint, 1500) < 1e-4
