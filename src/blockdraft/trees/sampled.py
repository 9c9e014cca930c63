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
                 generator: torch.Generator, vocab_size: int, parents=None, tokens=None, logp=None
                 ) -> tuple[DraftTree, list[float]]:
    """`shape`'s nodes refilled with sampled drafts, with q filled in; returns it and the shape scores of
    the nodes it kept (best first, for `keep_best`).

    The shape is the deterministic tree the same drafter builds (best first over its marginals or its
    transition tables): it is fixed before anything is drawn, which exactness needs. Keeping a draw
    only when it came out likely (a best-first tree over the drawn tokens' q) would select the draws
    and bias the output. Parents first, a node at depth d-1 then draws as many children as the shape
    gives it, in order, from row (d, m) of the transition tables (parents [D, M], tokens/logp [D, M, K])
    when its token is parent m, else from the lattice's marginal top-k of depth d (always, without
    tables). A row with fewer tokens than the shape asks for drops the rest of that node's subtree.
    """
    marg_tok, marg_q = lattice.tokens.numpy(), tempered(lattice.logp.float().numpy(), temperature)
    if parents is not None:
        par = parents.tolist()
        tab_tok, tab_q = tokens.numpy(), tempered(logp.float().numpy(), temperature)

    def row(token: int, d: int) -> tuple[np.ndarray, np.ndarray]:
        """Support (token ids) and q of the children at depth d of a node holding `token`."""
        if parents is not None and token in par[d]:
            m = par[d].index(token)
            return tab_tok[d, m], tab_q[d, m]
        return marg_tok[d], marg_q[d]

    shape_parents, wanted = shape.parents.tolist(), [len(c) for c in shape.children]
    out_tokens, out_parents, node_depth, sibling_index = [int(shape.tokens[0])], [-1], [0], [0]
    new_index: list[int | None] = [0]  # shape node -> tree node (None: dropped)
    draws: dict[int, tuple] = {}  # tree node -> (support, q, draw order)
    taken: dict[int, int] = {}  # tree node -> children placed so far
    kept_scores = []
    for s in range(1, len(shape)):
        p = shape_parents[s]
        v = new_index[p]
        if v is not None and v not in draws:
            support, q = row(out_tokens[v], node_depth[v])
            draws[v], taken[v] = (support, q, draw_order(q, wanted[p], generator)), 0
        if v is None or taken[v] >= len(draws[v][2]):
            new_index.append(None)
            continue
        support, _, order = draws[v]
        i = taken[v]
        taken[v] += 1
        kept_scores.append(shape_scores[s - 1])
        new_index.append(len(out_tokens))
        out_tokens.append(int(support[order[i]]))
        out_parents.append(v)
        node_depth.append(node_depth[v] + 1)
        sibling_index.append(i)
    tree = DraftTree(np.asarray(out_tokens), np.asarray(out_parents),
                     _q_rows(out_parents, sibling_index, draws, vocab_size))
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
