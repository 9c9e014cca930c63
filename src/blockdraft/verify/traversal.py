"""Traversal verification (Weng et al., NeurIPS 2025): a sampled tree accepted path by path, leaf to root.

Token-level recursive rejection (RejectionAcceptor) decides each node from its parent's residual alone:
a child with ratio p(x)/q(x) = 0.5 followed by one with ratio 2 is kept with probability 0.5 x 1. Block
verification (Sun et al., 2024) scores whole paths instead: each node carries a weight
    w(child) = min(w(parent) * p_parent(x) / q_child(x), 1),        w(root) = 1,
and the path to a leaf is kept with probability w(leaf) (here min(0.5 x 2, 1) = 1). Traversal
verification extends this to trees. It visits the leaves in post-order (the first child's subtree first,
siblings in the order they were drawn) and tests the first remaining leaf:
- kept: the path from the root to it is accepted, and the bonus token is drawn from its distribution;
- rejected: the leaf is removed and its parent u absorbs it as in block verification,
      p_u <- norm(max(w_u p_u - q_leaf, 0)),   w_u <- m / (m + 1 - w_u),   m = sum(max(w_u p_u - q_leaf, 0)),
  then the weights of u's remaining subtree are recomputed from the new p_u. A node whose children are all
  removed is itself a leaf, tested with its new weight; the root (weight 1) always stops the walk.

The output is distributed exactly as the target's, for children drawn one after another from any q_c
(so also without replacement, the siblings' q_c reported in `DraftTree.q`, and for deterministic
children, q_c = one-hot). We checked the update rule by exact enumeration (every draw of small trees
over a 4-token vocabulary, deviation ~1e-17) before writing it here; tests/test_traversal.py checks it
by chi-square on the toy target and on the real loop, with a broken update as the negative control.
With deterministic drafts it accepts as much as token-level rejection (which is already optimal for
one-hot q); with sampled drafts it accepts more (BENCHMARKS.md, "Decisions": acceptor at T > 0).
"""

from __future__ import annotations

import numpy as np
import torch

from ..trees import DraftTree
from .base import Acceptance, Acceptor, sample


class Residual:
    """A node's distribution as rejections reshape it, kept sparse: `scale * p(x)` for every token but the few
    that removed children's q touched (`ids`, `values`), all divided by `total`.

    A drafted child's q covers a few dozen tokens (a sampled row's support, or one token), so a removal
    changes only those; a dense update would cost several passes over the vocabulary per removed node, and
    a tree at T = 1 removes most of its nodes before the walk stops."""

    SPARSE_UP_TO = 2048  # touched tokens; past this (a q over much of the vocabulary) one dense pass is cheaper

    def __init__(self, probs: np.ndarray):
        self.probs, self.scale, self.total = probs, 1.0, 1.0
        self.ids, self.values = np.zeros(0, np.int64), np.zeros(0)

    def at(self, x: int) -> float:
        """The normalised probability of token x."""
        hit = np.searchsorted(self.ids, x)
        if hit < len(self.ids) and self.ids[hit] == x:
            return float(self.values[hit]) / self.total
        return self.scale * float(self.probs[x]) / self.total

    def remove(self, weight: float, q_ids: np.ndarray, q_values: np.ndarray) -> float:
        """Becomes norm(max(weight * self - q, 0)); returns the mass before normalising."""
        if len(self.ids) + len(q_ids) > self.SPARSE_UP_TO:
            values = weight * self.dense_np()
            values[q_ids] -= q_values
            values = np.maximum(values, 0.0)
            mass = float(values.sum())
            if mass > 0:
                self.probs, self.scale, self.total = values / mass, 1.0, 1.0
                self.ids, self.values = np.zeros(0, np.int64), np.zeros(0)
            return mass
        ids = np.union1d(self.ids, q_ids)
        current = self.scale * self.probs[ids].astype(np.float64)
        current[np.searchsorted(ids, self.ids)] = self.values
        q = np.zeros(len(ids))
        q[np.searchsorted(ids, q_ids)] = q_values
        values = np.maximum(weight * current / self.total - q, 0.0)
        scale = weight * self.scale / self.total
        untouched = max(1.0 - float(self.probs[ids].sum(dtype=np.float64)), 0.0)
        mass = scale * untouched + float(values.sum())
        if mass > 0:
            self.ids, self.values, self.scale, self.total = ids, values, scale, mass
        return mass

    def dense_np(self) -> np.ndarray:
        """The whole normalised distribution, float64."""
        p = self.scale * self.probs.astype(np.float64)
        p[self.ids] = self.values
        return p / self.total

    def dense(self) -> torch.Tensor:
        return torch.from_numpy(self.dense_np())


class TraversalAcceptor(Acceptor):
    """Traversal verification: post-order over the tree's leaves, sequence-level acceptance (see module doc)."""

    name = "traversal"

    @staticmethod
    def absorbed_weight(mass: float, weight: float) -> float:
        """A node's weight once a child is removed: the chance that its path, not an ancestor's, is where the
        target's sample leaves the drafts (block verification's h = m / (m + 1 - w))."""
        return mass / (mass + 1.0 - weight)

    def accept(self, tree: DraftTree, logits: torch.Tensor, gen: torch.Generator | None = None) -> Acceptance:
        parents, tokens = tree.parents.tolist(), tree.tokens.tolist()
        alive = [list(kids) for kids in tree.children]  # remaining children, in the order they were drawn
        holders = [v for v, kids in enumerate(alive) if kids]
        probs = self.params.probs(logits[holders]).cpu().numpy() if holders else None
        dist = {v: Residual(probs[i]) for i, v in enumerate(holders)}
        q_rows = None if tree.q is None else tree.q.float().cpu().numpy()
        drawn = [False] * len(tokens) if q_rows is None else (~np.isnan(q_rows[:, 0])).tolist()  # sampled, with q
        weight, ratio = [1.0] * len(tokens), [0.0] * len(tokens)

        def draw_q(c: int) -> tuple[np.ndarray, np.ndarray]:
            """(token ids, probabilities) of the distribution child c was drawn from (one-hot if deterministic)."""
            if not drawn[c]:
                return np.array([tokens[c]]), np.ones(1)
            ids = np.nonzero(q_rows[c] > 0)[0]  # (np.flatnonzero is ten times slower on float rows)
            return ids, q_rows[c, ids].astype(np.float64)

        def rate(c: int) -> None:
            """ratio[c] = p_u(x) / q_c(x) under the current distribution of c's parent u."""
            q_x = float(q_rows[c, tokens[c]]) if drawn[c] else 1.0
            ratio[c] = dist[parents[c]].at(tokens[c]) / q_x if q_x > 0 else 0.0

        def reweigh(u: int) -> None:
            """Weights down u's remaining subtree (after u's distribution or weight changed)."""
            stack = [u]
            while stack:
                v = stack.pop()
                for c in alive[v]:
                    weight[c] = min(weight[v] * ratio[c], 1.0)
                    stack.append(c)

        for c in range(1, len(tokens)):
            rate(c)
        reweigh(0)
        while True:
            path = [0]
            while alive[path[-1]]:
                path.append(alive[path[-1]][0])
            leaf = path[-1]
            if leaf == 0 or float(torch.rand((), generator=gen)) < weight[leaf]:
                bonus = dist[leaf].dense() if leaf in dist else self.params.probs(logits[leaf])
                return Acceptance(path, sample(bonus, gen))
            u = parents[leaf]
            mass = dist[u].remove(weight[u], *draw_q(leaf))
            if mass > 0:
                weight[u] = self.absorbed_weight(mass, weight[u])
            elif weight[u] < 1.0:
                weight[u] = 0.0  # nothing left for u: the walk must end above it
            # (mass 0 at weight 1 has probability zero, as in RejectionAcceptor: u keeps its distribution)
            alive[u].remove(leaf)
            for c in alive[u]:
                rate(c)
            reweigh(u)
