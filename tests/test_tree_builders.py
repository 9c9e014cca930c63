"""Tree builders: budget, prefix closure, the B best nodes (brute force), and lossless tree methods."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from test_refine import eos_free_target, heads_drafter, random_lattice, toy_corpus

from blockdraft import NoDrafter, SpeculativeDecoder
from blockdraft.errors import BlockdraftError
from blockdraft.refine.ngram import NGramLM
from blockdraft.trees import DraftTree
from blockdraft.trees.builders import best_first_transition_tree, best_first_tree, static_tree
from blockdraft.trees.drafter import TreeDrafter


def node_scores(tree, lattice, prior=None, alpha=0.0, history=()):
    """Cumulative score of every non-root node, recomputed from its path."""
    toks = lattice.tokens.tolist()
    out = []
    for i in range(1, len(tree)):
        path = tree.tokens[tree.path_to(i)[1:]].tolist()
        out.append(path_score(path, toks, lattice, prior, alpha, list(history)))
    return out


def path_score(path, toks, lattice, prior, alpha, history):
    s = 0.0
    for d, tok in enumerate(path):
        j = toks[d].index(tok)
        term = float(lattice.logp[d, j])
        if prior is not None and alpha > 0:
            ctx = (history + path[:d])[-(prior.order - 1):]
            term = (1 - alpha) * term + alpha * float(prior.logprob(np.array([ctx]), np.array([tok]))[0])
        s += term
    return s


@pytest.mark.parametrize("budget,alpha", [(1, 0.0), (7, 0.0), (16, 0.0), (16, 0.4), (40, 0.7)])
def test_best_first_tree_holds_the_budget_best_prefixes(budget, alpha):
    lattice = random_lattice(4, 3, 20, seed=budget)
    prior = NGramLM.fit(toy_corpus(), 20, 3) if alpha else None
    history = [1, 2]
    tree = best_first_tree(5, lattice, budget, prior=prior, alpha=alpha, history=history)
    assert len(tree) == min(budget, 3 + 9 + 27 + 81) + 1  # budget respected (and used)
    assert int(tree.tokens[0]) == 5
    assert all(0 <= p < i for i, p in enumerate(tree.parents.tolist()[1:], start=1))  # prefix-closed
    assert len({tuple(tree.path_to(i)) for i in range(len(tree))}) == len(tree)
    toks = lattice.tokens.tolist()
    every = [path_score([toks[d][j] for d, j in enumerate(idx)], toks, lattice, prior, alpha, history)
             for n in range(1, 5) for idx in itertools.product(range(3), repeat=n)]
    best = sorted(every, reverse=True)[:budget]
    assert sorted(node_scores(tree, lattice, prior, alpha, history), reverse=True) == pytest.approx(best)
    mask = tree.ancestor_mask()  # the verification mask: each node sees exactly its ancestors
    for i in range(len(tree)):
        assert set(np.flatnonzero(mask[i].numpy())) == set(tree.path_to(i))


def random_transitions(lattice, root: int, m: int, k: int, vocab: int, seed: int):
    """TreeFlash-shaped tables: parents [D, M] (depth 0: the root), children tokens/log-probs [D, M, K]."""
    g = torch.Generator().manual_seed(seed)
    D = lattice.depth
    parents = torch.cat([torch.full((1, m), root), lattice.tokens[: D - 1, :m]])
    tokens = torch.stack([torch.stack([torch.randperm(vocab, generator=g)[:k] for _ in range(m)]) for _ in range(D)])
    logp = torch.log_softmax(torch.randn(D, m, k, generator=g), -1).sort(descending=True).values
    return parents, tokens, logp


@pytest.mark.parametrize("budget", [1, 9, 30])
def test_transition_tree_holds_the_budget_best_prefixes(budget):
    lattice = random_lattice(3, 3, 12, seed=budget)
    root = 11
    parents, tokens, logp = random_transitions(lattice, root, 2, 3, 12, seed=budget)
    scores = []
    tree = best_first_transition_tree(root, lattice, parents, tokens, logp, budget, scores=scores)
    assert len(tree) == budget + 1 and int(tree.tokens[0]) == root
    assert all(0 <= p < i for i, p in enumerate(tree.parents.tolist()[1:], start=1))  # prefix-closed
    assert scores == sorted(scores, reverse=True)  # best first: any prefix of the nodes is a valid tree

    def children(token, d):  # a tabled parent uses its row, any other token the marginals
        row = parents[d].tolist()
        if token in row:
            return list(zip(tokens[d, row.index(token)].tolist(), logp[d, row.index(token)].tolist(), strict=True))
        return list(zip(lattice.tokens[d].tolist(), lattice.logp[d].tolist(), strict=True))

    every, frontier = [], [((), root, 0.0)]
    for d in range(lattice.depth):  # brute force: every path, scored by the tables
        frontier = [(path + (t,), t, s + lp) for path, last, s in frontier for t, lp in children(last, d)]
        every += [s for _, _, s in frontier]
    assert scores == pytest.approx(sorted(every, reverse=True)[:budget])
    got = [sum(dict(children(int(tree.tokens[a]), d))[int(tree.tokens[b])]
               for d, (a, b) in enumerate(itertools.pairwise(tree.path_to(i)))) for i in range(1, len(tree))]
    assert got == pytest.approx(scores)  # each node's score is its path's log-probability under the tables


def test_static_tree_follows_its_index_paths():
    lattice = random_lattice(3, 2, 20, seed=0)
    toks = lattice.tokens.tolist()
    tree = static_tree(9, lattice, paths=((0,), (1,), (0, 0), (0, 1), (0, 0, 0), (5,), (0, 0, 0, 0)))
    got = {tuple(tree.tokens[tree.path_to(i)[1:]].tolist()) for i in range(1, len(tree))}
    want = {(toks[0][0],), (toks[0][1],), (toks[0][0], toks[1][0]), (toks[0][0], toks[1][1]),
            (toks[0][0], toks[1][0], toks[2][0])}  # (5,) is outside the top-2, depth 4 beyond the lattice
    assert got == want
    assert len(static_tree(9, lattice, budget=3)) == 4


@pytest.mark.parametrize("builder,budget,alpha", [("static", 16, 0.0), ("best", 6, 0.0), ("best", 12, 0.5)])
def test_tree_methods_are_lossless_under_greedy(builder, budget, alpha):
    for seed in (0, 3):
        target = eos_free_target(seed)
        prompt = [3, 4, 5, 6, 3, 4, 5, 7, 8, 3, 4]
        ref = SpeculativeDecoder(target, NoDrafter()).generate(prompt, max_new_tokens=30).tokens
        prior = NGramLM.fit([ref + prompt], 24, 3) if alpha else None
        drafter = TreeDrafter(heads_drafter(target, seed), builder, budget, prior, alpha)
        res = SpeculativeDecoder(target, drafter).generate(prompt, max_new_tokens=30)
        assert res.tokens == ref
        assert res.stats.target_calls < 30
        assert res.stats.tree_nodes <= res.stats.target_calls * (budget + 1)


def test_bad_tree_options_are_refused():
    target = eos_free_target(0)
    with pytest.raises(BlockdraftError, match="budget must be a positive"):
        TreeDrafter(heads_drafter(target), "best", 0)
    with pytest.raises(BlockdraftError, match="builder must be one of"):
        TreeDrafter(heads_drafter(target), "random", 8)
    with pytest.raises(BlockdraftError, match="no top-k lattice"):
        TreeDrafter(NoDrafter(), "best", 8)


def test_auto_budget_trades_expected_gain_against_cost(tmp_path, monkeypatch):
    from blockdraft.methods import with_budget
    from blockdraft.trees.budget import best_budget, cost_curve

    flat = {0: 1.0, 64: 1.0}  # verification is free: take every node
    assert best_budget([-0.1] * 10, flat) == 10
    steep = {0: 1.0, 1: 1.5, 64: 50.0}  # a weak draft (P = 0.3) is not worth 1.5x
    assert best_budget([np.log(0.3)], steep) == 0
    assert best_budget([np.log(0.9), np.log(0.8)], {0: 1.0, 1: 1.5, 2: 2.5}) == 1
    monkeypatch.setenv("BLOCKDRAFT_CACHE", str(tmp_path))
    target = eos_free_target(0)
    curve = cost_curve(target)
    at = curve.at(100)
    assert list(curve.by_context) == [128]  # 1,024 tokens and a 64-node tree do not fit its 256 positions
    assert at[0] == 1.0 and max(at) == 64 and curve.max_nodes == 64 and at[64] > 1.0
    assert (tmp_path / "cost").is_dir() and cost_curve(target) == curve  # cached
    drafter = TreeDrafter(heads_drafter(target), "best", cost_curve=curve)
    prompt = [3, 4, 5, 6, 3, 4]
    ref = SpeculativeDecoder(target, NoDrafter()).generate(prompt, max_new_tokens=20).tokens
    assert SpeculativeDecoder(target, drafter).generate(prompt, max_new_tokens=20).tokens == ref
    assert with_budget("ddtree", 32) == "ddtree:budget=32"
    assert with_budget("ddtree:budget=8", 32) == "ddtree:budget=8"
    assert with_budget("bpd", 32) == "bpd"


def test_auto_budget_shrinks_the_tree_as_the_context_makes_nodes_dearer():
    from blockdraft.trees.budget import CostCurve, keep_best

    # measured shape: the same tree costs more steps' worth after a long context
    curve = CostCurve({128: {0: 1.0, 4: 1.05, 16: 1.2}, 4096: {0: 1.0, 4: 1.3, 16: 4.0}})
    assert curve.at(128)[16] == 1.2 and curve.at(9000)[16] == 4.0 and abs(curve.at(2112)[16] - 2.6) < 1e-9
    tree = DraftTree(list(range(17)), [-1] + list(range(16)))  # a chain of 16 likely drafts
    scores = list(np.log(np.linspace(0.9, 0.5, 16)))
    short, long = keep_best(tree, scores, curve, 100), keep_best(tree, scores, curve, 5000)
    assert len(short) == 17 and 1 < len(long) < len(short)
    assert CostCurve.of({0: 1.0, 8: 1.1}).at(5000) == {0: 1.0, 8: 1.1}  # a plain dict ignores the context
