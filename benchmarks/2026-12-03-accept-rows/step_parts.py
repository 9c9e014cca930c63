"""Per-step costs outside the forward pass, old way against new, for trees of 4 / 16 / 32 nodes (bf16 logits
over the default target's 49,152-token vocabulary, 2 threads, medians of 300 calls, microseconds).

- greedy acceptance: before, every row's logits converted to float32 (in Target.verify) and `max` over all rows;
  now only the accepted path's rows are converted and read (numpy argmax per row).
- the ancestor mask: before, torch row operations; now numpy rows.

python benchmarks/2026-12-03-accept-rows/step_parts.py
"""

import time

import numpy as np
import torch

from blockdraft.trees import DraftTree
from blockdraft.verify.base import child_with_token
from blockdraft.verify.greedy import GreedyAcceptor


def median_us(f, reps: int = 300) -> float:
    f()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return 1e6 * float(np.median(times))


def old_accept(tree, logits):
    best = logits.float().max(-1).indices.tolist()  # the float() was Target.verify's
    path, node = [0], 0
    while (child := child_with_token(tree, node, best[node])) is not None:
        path.append(child)
        node = child
    return path, best[node]


def old_mask(tree):
    n = len(tree)
    anc = torch.zeros(n, n, dtype=torch.bool)
    par = tree.parents.tolist()
    for i in range(n):
        if i:
            anc[i] = anc[par[i]]
        anc[i, i] = True
    return anc


def main():
    torch.set_num_threads(2)
    rng = np.random.default_rng(0)
    print("| nodes | accept before | accept now | ancestor mask before | ancestor mask now |")
    print("|---|---|---|---|---|")
    for n in (4, 16, 32):
        tree = DraftTree(list(range(100, 100 + n)), [-1] + [int(rng.integers(0, i)) for i in range(1, n)])
        logits = torch.randn(n, 49152).bfloat16()
        # the target agrees with the first three levels of the tree's first branch: a typical accepted path
        node = 0
        for _ in range(3):
            if not tree.children[node]:
                break
            child = tree.children[node][0]
            logits[node, int(tree.tokens[child])] = 100.0
            node = child
        new = GreedyAcceptor().accept(tree, logits)
        assert (new.path, new.bonus) == old_accept(tree, logits)
        assert torch.equal(tree.ancestor_mask(), old_mask(tree))
        costs = [median_us(lambda t=tree, x=logits: old_accept(t, x)),
                 median_us(lambda t=tree, x=logits: GreedyAcceptor().accept(t, x)),
                 median_us(lambda t=tree: old_mask(t)), median_us(lambda t=tree: t.ancestor_mask())]
        print(f"| {n} | " + " | ".join(f"{c:.0f}" for c in costs) + " |")


if __name__ == "__main__":
    main()
