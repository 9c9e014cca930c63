"""Tree builders: turn a drafter's top-k lattice into a DraftTree under a node budget.

- `static_tree`: a fixed list of top-k index paths (Medusa): cheap, shape chosen offline.
- `best_first_tree`: a heap over partial paths scored by the sum of per-depth marginal
  log-probabilities (DDTree): the B most likely prefixes, which is the tree that maximises the
  expected accepted length when depths are independent. An optional n-gram prior adds
  a * log P_ngram(token | path so far) to every node's score (beyond Kim et al.: their n-gram
  rescoring applied to trees instead of p separate paths).

Hand-written: the heap over token-id paths is a few lines and no library does it for us.
"""

from __future__ import annotations

import heapq

import numpy as np

from ..drafters.lattice import DraftLattice
from .tree import DraftTree

# Medusa-style default: 16 nodes (root excluded) for 4 heads, most probability mass first.
DEFAULT_STATIC_PATHS = (
    (0,), (1,), (2,), (3,),
    (0, 0), (0, 1), (1, 0), (0, 2), (2, 0),
    (0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 0),
    (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 1, 0),
)


def static_tree(root: int, lattice: DraftLattice, paths=DEFAULT_STATIC_PATHS, budget: int | None = None,
                max_depth: int | None = None) -> DraftTree:
    """Instantiate index paths (j_1, ..., j_d) as tokens lattice[d, j_d]; paths outside the lattice are skipped.

    Paths must be prefix-closed (every prefix listed before the path) for the shape to be what it says.
    """
    k, depth = lattice.tokens.shape[1], lattice.depth if max_depth is None else min(max_depth, lattice.depth)
    toks = lattice.tokens.tolist()
    token_paths = [[toks[d][j] for d, j in enumerate(p)] for p in paths
                   if len(p) <= depth and all(j < k for j in p)]
    return DraftTree.from_paths(root, token_paths, max_nodes=None if budget is None else budget + 1)


def best_first_tree(root: int, lattice: DraftLattice, budget: int, max_depth: int | None = None,
                    prior=None, alpha: float = 0.0, history: list[int] | None = None,
                    scores: list[float] | None = None) -> DraftTree:
    """The `budget` best nodes (root excluded) by cumulative score, grown from the root.

    A node's score is its parent's plus (1 - a) * logp[d, j] + a * log P_prior(token | history, path);
    with alpha = 0 it is the plain sum of marginal log-probs. Scores only fall along a path, so a
    popped node's parent was popped before it: the result is prefix-closed by construction.
    Nodes come out best first; a list passed as `scores` receives each non-root node's score.
    """
    depth = lattice.depth if max_depth is None else min(max_depth, lattice.depth)
    if budget <= 0 or depth <= 0:
        return DraftTree.root_only(root)
    toks = lattice.tokens.numpy()
    logp = lattice.logp.float().numpy()
    use_prior = prior is not None and alpha > 0
    window = max(prior.order - 1, 1) if use_prior else 0
    history = list(history or [root])

    def child_scores(path_tokens: list[int], d: int) -> np.ndarray:
        s = logp[d].astype(np.float64)
        if not use_prior:
            return s
        ctx = (history + path_tokens)[-window:]
        ctx = [-1] * (window - len(ctx)) + ctx
        return (1 - alpha) * s + alpha * prior.score(np.asarray([ctx]), toks[d][None])[0]

    tokens, parents, paths = [root], [-1], {0: []}
    heap: list[tuple[float, int, int, int]] = []  # (-score, tie-breaker, parent node, lattice column)
    counter = 0

    def push_children(node: int, score: float) -> None:
        nonlocal counter
        d = len(paths[node])
        if d >= depth:
            return
        for j, s in enumerate(child_scores(paths[node], d)):
            heapq.heappush(heap, (-(score + s), counter, node, j))
            counter += 1

    push_children(0, 0.0)
    while heap and len(tokens) <= budget:
        neg, _, parent, j = heapq.heappop(heap)
        d = len(paths[parent])
        node = len(tokens)
        tokens.append(int(toks[d, j]))
        parents.append(parent)
        paths[node] = paths[parent] + [int(toks[d, j])]
        if scores is not None:
            scores.append(-neg)
        push_children(node, -neg)
    return DraftTree(np.asarray(tokens), np.asarray(parents))


def best_first_transition_tree(root: int, lattice: DraftLattice, parents, tokens, logp, budget: int,
                               max_depth: int | None = None, scores: list | None = None) -> DraftTree:
    """Best-first over transition tables (TreeFlash): a node at depth d whose token is one of the
    table's parents for depth d+1 gets that parent's top-K children and log-probs; any other node
    falls back to the marginal top-k of depth d+1. parents [D, M], tokens/logp [D, M, K], each row
    sorted best first (as top-k returns them).
    `scores`, if given, receives each added node's path log-probability, in order (best first).

    Rows are sorted, so a node's k-th child never beats its (k-1)-th: the heap holds each node's best
    child not yet taken, and taking a child queues its next sibling and its own first child. Two
    pushes per node instead of K keep wide rows (K = 16) cheap in Python."""
    depth = lattice.depth if max_depth is None else min(max_depth, lattice.depth)
    if budget <= 0 or depth <= 0:
        return DraftTree.root_only(root)
    par = [{int(t): m for m, t in reversed(list(enumerate(row)))} for row in parents.tolist()]  # first wins
    tok, lp = tokens.tolist(), logp.float().tolist()
    marg_tok, marg_lp = lattice.tokens.tolist(), lattice.logp.float().tolist()

    def children(token: int, d: int) -> tuple[list, list]:
        """Candidate children at depth d of a node holding `token` at depth d-1 (the root at d = 0), best first."""
        m = par[d].get(token)
        return (tok[d][m], lp[d][m]) if m is not None else (marg_tok[d], marg_lp[d])

    out_tokens, out_parents, node_depth = [root], [-1], [0]
    rows = [children(root, 0)]  # each node's candidate children (tokens, log-probs)
    # (-score, tie-breaker, parent node, rank of the child in the parent's row, parent's score)
    heap: list[tuple[float, int, int, int, float]] = [(-rows[0][1][0], 0, 0, 0, 0.0)]
    counter = 1
    while heap and len(out_tokens) <= budget:
        neg, _, parent, k, base = heapq.heappop(heap)
        row_tokens, row_logp = rows[parent]
        if k + 1 < len(row_tokens):  # the next sibling
            heapq.heappush(heap, (-(base + row_logp[k + 1]), counter, parent, k + 1, base))
            counter += 1
        node = len(out_tokens)
        out_tokens.append(int(row_tokens[k]))
        out_parents.append(parent)
        node_depth.append(node_depth[parent] + 1)
        if scores is not None:
            scores.append(-neg)
        if node_depth[node] < depth:  # its first child
            rows.append(children(out_tokens[node], node_depth[node]))
            heapq.heappush(heap, (neg - rows[node][1][0], counter, node, 0, -neg))
            counter += 1
        else:
            rows.append(None)
    return DraftTree(np.asarray(out_tokens), np.asarray(out_parents))
