import sys, time, statistics, torch, blockdraft
from blockdraft.trees import DraftTree
torch.set_num_threads(2)
target = blockdraft.Target.load("smollm2-135m", dtype="bfloat16", compile=True)
ids = target.encode("The quick brown fox jumps over the lazy dog. " * 30)[:300]
def star(n):
    toks = ids[-1:] + list(range(100, 100 + n - 1)); par = [-1] + [0 if i < 4 else (i - 4) % 3 + 1 for i in range(1, n)]
    return DraftTree(toks, par)
ns = [1, 2, 4, 8, 12, 13, 14, 15, 16, 17, 18, 20, 24, 28, 32, 33, 34]
res = {n: [] for n in ns}
target.prefill(ids[:-1])
for rep in range(12):
    for n in ns:
        ts = []
        for k in range(5):
            t = time.perf_counter(); target.verify(star(n)); ts.append(time.perf_counter() - t); target.commit([])
        res[n].append(min(ts))
base = statistics.median(res[1])
for n in ns:
    m = statistics.median(res[n]); print(f"n {n:3d} (B {n-1:2d}): {1000*m:6.2f} ms  {m/base:.3f}")
