import time, statistics, torch
from torch.nn import functional as F
torch.set_num_threads(2)
def timeit(f, n=200):
    for _ in range(10): f()
    ts = []
    for _ in range(n):
        s = time.perf_counter(); f(); ts.append(time.perf_counter() - s)
    return statistics.median(ts) * 1e6
for (o, i) in ((1536, 576), (576, 1536), (49152, 576)):
    W = torch.randn(o, i, dtype=torch.bfloat16)
    P = torch.ops.mkldnn._reorder_linear_weight(W, 1)
    row = []
    for M in (1, 8, 16, 17, 24, 32, 64):
        x = torch.randn(M, i, dtype=torch.bfloat16)
        with torch.inference_mode():
            a = timeit(lambda: F.linear(x, W))
            b = timeit(lambda: torch.ops.mkldnn._linear_pointwise(x, P, None, "none", [], ""))
        row.append(f"M={M}: {a:.0f}/{b:.0f}")
    print(f"[{o}x{i}] us F.linear/packed:", "  ".join(row))
