"""A drafter's few-row matmuls: float32 against aten's int8 weight-only kernel (bf16 activations), 2 threads.

"cold": 600 MB written between calls, as a target pass does between two drafting calls in the loop.
    python benchmarks/2026-12-03-int8-drafting/matmul_int8.py
"""

import time

import torch

from blockdraft.target import packing

torch.set_num_threads(2)
flush = torch.empty(150_000_000, dtype=torch.float32)


def median_ms(f, cold: bool, reps: int = 20) -> float:
    times = []
    for _ in range(reps):
        if cold:
            flush.add_(1)
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return sorted(times)[reps // 2] * 1e3


print("| in x out | rows | cache | float32 (ms) | int8 (ms) | int8 / float32 |")
print("|---|---|---|---|---|---|")
for k, n in [(576, 8192), (576, 1536), (1536, 576)]:
    w = torch.randn(n, k)
    q, scales = packing.quantize(w)
    for m in [1, 4, 8, 16, 32, 64, 128]:
        x = torch.randn(m, k)
        for cold in (True, False):
            a = median_ms(lambda x=x, w=w: x @ w.T, cold)
            b = median_ms(lambda x=x, q=q, s=scales: torch._weight_int8pack_mm(x.bfloat16(), q, s).float(), cold)
            print(f"| {k} x {n} | {m} | {'cold' if cold else 'warm'} | {a:.3f} | {b:.3f} | {b / a:.2f} |")
