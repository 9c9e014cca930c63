"""Exact check of traversal verification's update rule (verify/traversal.py) by enumeration.

Every draw of a small tree (children drawn one after another without replacement from random q's over a 4-token
vocabulary) and every outcome of the rule's coin flips, weighted by their probabilities: the emitted block,
completed by the target, must have the target's joint law. Prints the largest deviation, and the expected emitted
tokens against token-level recursive rejection on the same trees.

    python benchmarks/2026-12-06-traversal-enumeration.py SEED [block|ratio|none] [a|b|chain]

`block` is the rule we ship (w_u <- m / (m + 1 - w_u)); `ratio` (w_u <- m / (1 - q(x))) and `none` (w_u kept)
are two other readings of the rule, which deviate.
"""

import itertools
import sys

import numpy as np

V = 4
SHAPES = {"a": [-1, 0, 0, 1, 1, 3, 2], "b": [-1, 0, 0, 0, 1, 2, 4, 4], "chain": [-1, 0, 1, 2]}
seed = int(sys.argv[1]) if len(sys.argv) > 1 else 0
RULE = sys.argv[2] if len(sys.argv) > 2 else "block"
SHAPE = SHAPES[sys.argv[3] if len(sys.argv) > 3 else "a"]
N_NODES = len(SHAPE)
CHILDREN = [[c for c in range(N_NODES) if SHAPE[c] == v] for v in range(N_NODES)]
rng = np.random.default_rng(seed)
_tables: dict = {}


def dist(which: str, prefix: tuple) -> np.ndarray:
    """A random distribution per (model, prefix), drawn once."""
    if (which, prefix) not in _tables:
        _tables[which, prefix] = rng.dirichlet([0.7] * V)
    return _tables[which, prefix]


def target(prefix):
    return dist("p", prefix)


def draft(prefix):
    return dist("q", prefix)


def prefix_of(tokens: dict, v: int) -> tuple:
    out = []
    while v > 0:
        out.append(tokens[v])
        v = SHAPE[v]
    return tuple(reversed(out))


def draws():
    """Every tree the drafter can draw: (tokens {node: token}, q {node: the distribution it was drawn from}, prob)."""
    holders = [v for v in range(N_NODES) if CHILDREN[v]]

    def rec(k, tokens, rows, prob):
        if k == len(holders):
            yield dict(tokens), dict(rows), prob
            return
        v = holders[k]
        q = draft(prefix_of(tokens, v))
        for picks in itertools.permutations(range(V), len(CHILDREN[v])):
            pr, rest, qs = 1.0, q.copy(), []
            for x in picks:
                qs.append(rest / rest.sum())
                pr *= qs[-1][x]
                rest = rest.copy()
                rest[x] = 0.0
            if pr == 0:
                continue
            t2, r2 = dict(tokens), dict(rows)
            for c, x, qi in zip(CHILDREN[v], picks, qs, strict=True):
                t2[c], r2[c] = x, qi
            yield from rec(k + 1, t2, r2, prob * pr)

    yield from rec(0, {0: None}, {}, 1.0)


def traversal(tokens, rows) -> dict:
    """{emitted tuple: probability} of the rule on one drawn tree."""
    dists = {v: target(prefix_of(tokens, v)).copy() for v in range(N_NODES)}
    weight = {0: 1.0}
    for c in range(1, N_NODES):
        weight[c] = min(weight[SHAPE[c]] * dists[SHAPE[c]][tokens[c]] / rows[c][tokens[c]], 1.0)
    return walk(tokens, rows, dists, weight, {v: list(CHILDREN[v]) for v in range(N_NODES)})


def reweigh(tokens, rows, dists, weight, alive, u):
    for c in alive[u]:
        q_x = rows[c][tokens[c]]
        weight[c] = min(weight[u] * dists[u][tokens[c]] / q_x, 1.0) if q_x > 0 else 0.0
        reweigh(tokens, rows, dists, weight, alive, c)


def walk(tokens, rows, dists, weight, alive) -> dict:
    leaf, path = 0, [0]
    while alive[leaf]:
        leaf = alive[leaf][0]
        path.append(leaf)
    kept = 1.0 if leaf == 0 else weight[leaf]
    drafted = tuple(tokens[c] for c in path[1:])
    out = {drafted + (y,): kept * dists[leaf][y] for y in range(V) if dists[leaf][y] > 0}
    if kept >= 1.0:
        return out
    dists = {k: a.copy() for k, a in dists.items()}
    weight, alive = dict(weight), {k: list(a) for k, a in alive.items()}
    u = SHAPE[leaf]
    residual = np.clip(weight[u] * dists[u] - rows[leaf], 0, None)
    mass = residual.sum()
    if RULE == "block":
        new_weight = mass / (mass + 1 - weight[u]) if mass + 1 - weight[u] > 0 else 1.0
    elif RULE == "ratio":
        new_weight = min(mass / (1 - rows[leaf][tokens[leaf]]), 1.0)
    else:
        new_weight = weight[u]
    if mass > 0:
        dists[u] = residual / mass
    weight[u] = new_weight
    alive[u].remove(leaf)
    reweigh(tokens, rows, dists, weight, alive, u)
    for key, val in walk(tokens, rows, dists, weight, alive).items():
        out[key] = out.get(key, 0) + (1 - kept) * val
    return out


def token_level(tokens, rows) -> dict:
    """Recursive rejection sampling (RejectionAcceptor) on the same tree."""

    def at(v, drafted, w):
        out, r = {}, target(prefix_of(tokens, v)).copy()
        for c in CHILDREN[v]:
            x, q = tokens[c], rows[c]
            a = min(1.0, r[x] / q[x])
            for key, val in at(c, drafted + (x,), w * a).items():
                out[key] = out.get(key, 0) + val
            w *= 1 - a
            r = np.clip(r - q, 0, None)
            r = r / r.sum() if r.sum() > 0 else r
            if w == 0:
                return out
        for y in range(V):
            out[drafted + (y,)] = out.get(drafted + (y,), 0) + w * r[y]
        return out

    return at(0, (), 1.0)


def emitted(rule) -> dict:
    law = {}
    for tokens, rows, prob in draws():
        for key, val in rule(tokens, rows).items():
            law[key] = law.get(key, 0) + prob * val
    return law


def main():
    depth = [0] * N_NODES
    for c in range(1, N_NODES):
        depth[c] = depth[SHAPE[c]] + 1
    length = max(depth) + 1
    law, reference = emitted(traversal), emitted(token_level)
    worst = 0.0
    for seq in itertools.product(range(V), repeat=length):
        joint = np.prod([target(seq[:j])[seq[j]] for j in range(length)])
        completed = sum(law.get(seq[:k], 0.0) * np.prod([target(seq[:j])[seq[j]] for j in range(k, length)])
                        for k in range(1, length + 1))
        worst = max(worst, abs(completed - joint))
    mean_len = sum(len(k) * v for k, v in law.items())
    ref_len = sum(len(k) * v for k, v in reference.items())
    shape = sys.argv[3] if len(sys.argv) > 3 else "a"
    print(f"rule={RULE} shape={shape} seed={seed}: total {sum(law.values()):.12f}, largest deviation {worst:.1e}; "
          f"emitted tokens per step {mean_len:.4f} (token-level rejection {ref_len:.4f})")


if __name__ == "__main__":
    main()
