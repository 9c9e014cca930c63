"""TreeFlash (or another method's) drafting time per step after 128, 1,000 and 4,000 context tokens (bf16, eager target), then a profile at 4,000.

    python benchmarks/2026-12-02-context/drafting_by_context.py [METHOD]
"""
import json, time, statistics, sys, torch
from blockdraft import Target
from blockdraft.methods import make_drafter
from blockdraft.drafters import DraftContext
torch.set_num_threads(2)
t = Target.load(dtype="bfloat16")
method = sys.argv[1] if len(sys.argv) > 1 else "treeflash"
d = make_drafter(method, t)
t.feature_layers = d.feature_layers
base = [1000 + (7 * i) % 20000 for i in range(4100)]
for ctx in (128, 1000, 4000):
    ids = base[:ctx]
    feats = t.prefill(ids[:-1]); d.reset(ids)
    c = DraftContext(ids, feats, 16, None, 0.0, torch.Generator())
    d.propose(c)  # takes in the context
    c = DraftContext(ids, None, 16, None, 0.0, torch.Generator())
    ts = []
    for _ in range(15):
        t0 = time.perf_counter(); d.propose(c); ts.append(time.perf_counter() - t0)
    print(ctx, f"{statistics.median(ts)*1e3:.2f} ms")
from torch.profiler import profile
with profile(record_shapes=True) as p:
    for _ in range(10): d.propose(c)
print(p.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=20))
