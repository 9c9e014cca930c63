"""Verification time by tree size, one row at a time around the AMX tile steps (compiled engine, bf16, 2 threads).

    python benchmarks/2026-12-03-cost-steps/verify_rows.py
"""

import statistics
import time

import torch

import blockdraft
from blockdraft.trees import DraftTree

torch.set_num_threads(2)
target = blockdraft.Target.load("smollm2-135m", dtype="bfloat16", compile=True)
ids = target.encode("The quick brown fox jumps over the lazy dog. " * 30)[:300]


def tree(n: int) -> DraftTree:
    """n rows: the root, 3 children, then grandchildren spread over them."""
    tokens = ids[-1:] + list(range(100, 100 + n - 1))
    parents = [-1] + [0 if i < 4 else (i - 4) % 3 + 1 for i in range(1, n)]
    return DraftTree(tokens, parents)


rows = [1, 2, 4, 8, 12, 13, 14, 15, 16, 17, 18, 20, 24, 28, 32, 33, 34]
times = {n: [] for n in rows}
target.prefill(ids[:-1])
for _ in range(12):  # sizes in turns, so that a burst of load hits all alike
    for n in rows:
        runs = []
        for _ in range(5):
            t0 = time.perf_counter()
            target.verify(tree(n))
            runs.append(time.perf_counter() - t0)
            target.commit([])
        times[n].append(min(runs))
one = statistics.median(times[1])
for n in rows:
    t = statistics.median(times[n])
    print(f"rows {n:3d} (draft nodes {n - 1:2d}): {1000 * t:6.2f} ms  {t / one:.3f} one-token steps")
