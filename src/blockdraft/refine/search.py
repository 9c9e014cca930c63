"""Searches over a top-k lattice: local left-to-right rescoring (one draft) and exact p-best paths.

Both score a path t_1..t_D as   sum_d (1 - a) * drafter_logp(t_d) + a * lm_logp(t_d | history, t_<d),
with any rescorer that maps (contexts, candidate tokens) to log-probabilities (`Rescorer`).
Hand-written: this is lattice search over token ids, which no library offers for our arrays
(the paper composed the lattice with a 4-gram LM in OpenFST).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ..drafters.lattice import DraftLattice


class Rescorer(Protocol):
    order: int  # how many tokens of context matter (n for an n-gram LM; its window for a neural LM)

    def score(self, contexts: np.ndarray, candidates: np.ndarray) -> np.ndarray:
        """contexts [S, m] int (-1 = no token), candidates [S, k] int -> [S, k] log-probs."""


def local_rescore(lattice: DraftLattice, history: list[int], rescorer: Rescorer, alpha: float,
                  depth: int | None = None) -> list[int]:
    """Left to right, pick at each depth the top-k token maximising the interpolated score.

    With alpha = 0 this is the drafter's own top-1 chain.
    """
    tokens = lattice.tokens.numpy()
    logp = lattice.logp.float().numpy()
    depth = lattice.depth if depth is None else min(depth, lattice.depth)
    window = max(rescorer.order - 1, 1)
    chosen: list[int] = []
    for d in range(depth):
        if alpha == 0:
            j = 0
        else:
            ctx = (list(history) + chosen)[-window:]
            lm = rescorer.score(np.asarray([ctx]), tokens[d][None])[0]
            j = int(np.argmax((1 - alpha) * logp[d] + alpha * lm))
        chosen.append(int(tokens[d, j]))
    return chosen


def pbest_paths(lattice: DraftLattice, history: list[int], rescorer: Rescorer | None, alpha: float, p: int,
                depth: int | None = None, beam: int | None = 256) -> tuple[np.ndarray, np.ndarray]:
    """The p highest-scoring paths through the lattice, best first: (tokens [P, D], scores [P]).

    Dynamic programming over the rescorer's state (the last order-1 tokens): two partial paths
    that end in the same state are scored identically from then on, so only the p best of each
    state can be among the final p best. That keeps the search exact while pruning the k^D
    paths down to at most p per state. `rescorer=None` (or alpha = 0) ranks by the lattice alone
    (the paper's "p-best 0-gram" ablation).

    `beam` caps the partial paths kept per depth (None: no cap). Deep lattices need it: 7 depths
    of k = 8 keep up to 512 states x p paths alive, and scoring them all costs more than the
    target step it is meant to speed up. Only partial paths ranked below `beam` are dropped,
    which rarely removes one of the final p best; with the cap unused the search is exact.
    """
    tokens = lattice.tokens.numpy()
    logp = lattice.logp.float().numpy()
    D = lattice.depth if depth is None else min(depth, lattice.depth)
    k = tokens.shape[1]
    use_lm = rescorer is not None and alpha != 0
    window = max(rescorer.order - 1, 1) if use_lm else 1
    hist = np.asarray(list(history)[-window:], dtype=np.int64)
    hist = np.concatenate([np.full(window - len(hist), -1, np.int64), hist])

    paths = np.zeros((1, 0), dtype=np.int64)  # token ids of the partial paths
    scores = np.zeros(1)
    for d in range(D):
        ctx = np.concatenate([np.tile(hist, (len(paths), 1)), paths], axis=1)[:, -window:]
        term = np.tile((1 - alpha if use_lm else 1.0) * logp[d], (len(paths), 1))  # [H, k]
        if use_lm:
            states, inv = np.unique(ctx, axis=0, return_inverse=True)
            lm = rescorer.score(states, np.tile(tokens[d], (len(states), 1)))  # one query per distinct state
            term = term + alpha * lm[inv.reshape(-1)]
        scores = (scores[:, None] + term).reshape(-1)
        paths = np.concatenate([np.repeat(paths, k, axis=0), np.tile(tokens[d], len(paths))[:, None]], axis=1)
        paths, scores = _best_per_state(paths, scores, p, window if use_lm else 0)
        if beam is not None and len(scores) > beam:
            keep = np.argsort(-scores, kind="stable")[:beam]
            paths, scores = paths[keep], scores[keep]
    top = np.argsort(-scores, kind="stable")[:p]
    return paths[top], scores[top]


def _best_per_state(paths: np.ndarray, scores: np.ndarray, p: int, window: int):
    """Keep the p best partial paths of every state (the last `window` tokens; 0 = one shared state)."""
    if window == 0:
        keep = np.argsort(-scores, kind="stable")[:p]
        return paths[keep], scores[keep]
    if paths.shape[1] < window:  # the state still includes the shared history: every path is its own
        return paths, scores
    state = paths[:, -window:]
    _, sid = np.unique(state, axis=0, return_inverse=True)
    sid = sid.reshape(-1)
    order = np.lexsort((-scores, sid))  # by state, best first within a state
    first = np.r_[0, np.flatnonzero(np.diff(sid[order])) + 1]
    rank = np.arange(len(order)) - np.repeat(first, np.diff(np.r_[first, len(order)]))
    keep = order[rank < p]
    return paths[keep], scores[keep]
