"""Sampled draft trees: each node's children drawn from the drafter's distribution without replacement.

At T > 0 a deterministic tree (argmax, top-k) is verified as if each child had q = one-hot: the
target keeps child x with probability p(x) at best. Drawing the children from the drafter's own
temperature-adjusted distribution q instead, and telling the verifier q, lets multi-draft recursive
rejection sampling (SpecInfer; Sequoia for draws without replacement) accept child i with
probability min(1, r_i(x_i) / q_i(x_i)), which is larger whenever q resembles the target.

The draws at a node x_1, x_2, ... are sequential without replacement: x_i ~ q_i, where q_i is q with
x_1 .. x_{i-1} removed and renormalised (Gumbel-top-k draws exactly this sequence). Child i records
q_i as its row of `DraftTree.q`; RejectionAcceptor then visits the children in order and needs
nothing else. The output distribution stays the target's for any q_i, provided which children exist
does not depend on their own drawn values: the tree's shape is therefore the deterministic tree the
drafter would build (fixed before drawing), and only its tokens are drawn. (A first version grew the
tree best first over the drawn tokens' q, which keeps unlikely draws less often than likely ones: the
chi-square test caught the bias at p = 1e-72.)

The support of q is what the drafter hands over: a depth's top-k (marginal lattices) or a parent's
top-K children (TreeFlash's transition tables), renormalised. A smaller support only lowers
acceptance; it never makes the output inexact.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from ..drafters.lattice import DraftLattice
from .tree import DraftTree


def drafting_generator(ctx) -> torch.Generator:
    """The decoder's generator (so a seeded run drafts reproducibly), or torch's default one."""
    return ctx.generator if ctx.generator is not None else torch.default_generator


def tempered(logp: np.ndarray, temperature: float) -> np.ndarray:
    """softmax(logp / T) along the last axis (entries at -inf get probability 0)."""
    z = logp / temperature
    z = z - z.max(-1, keepdims=True)
    p = np.exp(z)
    return p / p.sum(-1, keepdims=True)


def draw_order(prob: np.ndarray, count: int, generator: torch.Generator) -> list[int]:
    """`count` support indices drawn one after another without replacement from `prob` (Gumbel-top-k:
    the order of log p + Gumbel noise is the order of sequential draws)."""
    count = min(count, int((prob > 0).sum()))
    u = torch.rand(len(prob), generator=generator, dtype=torch.float64).numpy()
    with np.errstate(divide="ignore"):
        keys = np.log(prob) - np.log(-np.log(np.clip(u, 1e-300, 1.0)))
    return np.argsort(-keys, kind="stable")[:count].tolist()


def sampled_tree(shape: DraftTree, shape_scores: list[float], lattice: DraftLattice, temperature: float,
                 generator: torch.Generator, vocab_size: int, parents=None, tokens=None, logp=None,
                 more_rows: Callable | None = None) -> tuple[DraftTree, list[float]]:
    """`shape`'s nodes refilled with sampled drafts, with q filled in; returns it and the shape scores of
    the nodes it kept (best first, for `keep_best`).

    The shape is the deterministic tree the same drafter builds (best first over its marginals or its
    transition tables): it is fixed before anything is drawn, which exactness needs. Keeping a draw
    only when it came out likely (a best-first tree over the drawn tokens' q) would select the draws
    and bias the output. The draws go one depth at a time: a node at depth d-1 draws as many children
    as the shape gives it, in order, from row (d, m) of the transition tables (parents [D, M],
    tokens/logp [D, M, K]) when its token is parent m. A drawn token is often none of the M parents
    (at T = 1, 57% of TreeFlash's depth-1 nodes with children on held-out ShareGPT), so `more_rows(tokens,
    d)` -> (token ids [n, K], log-probs [n, K]) computes the missing rows of a depth in one call; without it,
    or without tables, the lattice's marginal top-k of depth d is the row. A row with fewer tokens than the
    shape asks for drops the rest of that node's subtree.
    """
    marg_tok, marg_q = lattice.tokens.numpy(), tempered(lattice.logp.float().numpy(), temperature)
    par = parents.tolist() if parents is not None else None
    if par is not None:
        tab_tok, tab_q = tokens.numpy(), tempered(logp.float().numpy(), temperature)

    shape_parents, depth = shape.parents.tolist(), shape.depth.tolist()
    drawn: list[int | None] = [int(shape.tokens[0])] + [None] * (len(shape) - 1)  # shape node -> token or None
    draws: dict[int, tuple] = {}  # shape node -> (support, q, draw order) of its children
    for d in range(1, max(depth) + 1):
        holders = [v for v, kids in enumerate(shape.children) if kids and depth[v] == d - 1 and drawn[v] is not None]
        rows = {}
        for v in holders:
            if par is not None and drawn[v] in par[d - 1]:
                m = par[d - 1].index(drawn[v])
                rows[v] = tab_tok[d - 1, m], tab_q[d - 1, m]
        missing = [v for v in holders if v not in rows]
        if missing and par is not None and more_rows is not None:
            ids, row_logp = more_rows([drawn[v] for v in missing], d - 1)
            rows.update(zip(missing, zip(ids, tempered(row_logp, temperature), strict=True), strict=True))
        for v in holders:
            support, q = rows.get(v, (marg_tok[d - 1], marg_q[d - 1]))
            order = draw_order(q, len(shape.children[v]), generator)
            draws[v] = support, q, order
            for i, c in enumerate(shape.children[v][: len(order)]):
                drawn[c] = int(support[order[i]])

    # the kept nodes in the shape's (best-first) order, so that keep_best may cut the tree at any length
    new_index: dict[int, int] = {0: 0}
    out_tokens, out_parents, sibling_index, kept_scores = [drawn[0]], [-1], [0], []
    for c in range(1, len(shape)):
        if drawn[c] is None:
            continue
        v = shape_parents[c]
        new_index[c] = len(out_tokens)
        out_tokens.append(drawn[c])
        out_parents.append(new_index[v])
        sibling_index.append(shape.children[v].index(c))
        kept_scores.append(shape_scores[c - 1])
    tree_draws = {new_index[v]: draw for v, draw in draws.items() if v in new_index}
    tree = DraftTree(np.asarray(out_tokens), np.asarray(out_parents),
                     _q_rows(out_parents, sibling_index, tree_draws, vocab_size))
    return tree, kept_scores


def _q_rows(parents: list[int], sibling_index: list[int], draws: dict, vocab_size: int) -> torch.Tensor:
    """[n, V] rows: child i of a node gets q with the node's earlier draws removed, renormalised; the
    root's row is NaN (it is not a draft)."""
    q = torch.zeros(len(parents), vocab_size)
    q[0] = float("nan")
    for c in range(1, len(parents)):
        support, prob, order = draws[parents[c]]
        p = prob.copy()
        p[order[: sibling_index[c]]] = 0.0
        q[c, torch.from_numpy(support.astype(np.int64))] = torch.from_numpy((p / p.sum()).astype(np.float32))
    return q
