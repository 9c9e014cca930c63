"""Scratch: prefill of L tokens: batch engine (bias mask, eager), static engine (causal kernel, eager),
and the compiled dynamic graph (slot 0, causal bool mask, all logits)."""
import time, torch
from blockdraft.api import load_target
from blockdraft.target.batch_engine import BatchEngine
torch.set_num_threads(2)
t = load_target(None, compile=True)
w = t.forwarder
eng = BatchEngine(w, 8)
def med(f, reps=5):
    ts = []
    for r in range(reps):
        t0 = time.perf_counter(); f(); ts.append(time.perf_counter() - t0)
    return sorted(ts)[len(ts)//2] * 1000
for L in (32, 100, 300, 600, 1200):
    toks = torch.randint(1000, (L,))
    def batch_path():
        eng.reset(0); eng.forward(0, [toks], [torch.arange(L)], [None], last_logits_only=True)
    def causal_path():
        w.reset(); w.forward(toks, torch.arange(L), last_logits_only=True)
    def compiled_path():
        eng._reserve(L + 1)
        pos = torch.arange(L)
        cos, sin = eng.cos[pos][None, None], eng.sin[pos][None, None]
        mask = torch.ones(L, L + 0, dtype=torch.bool).tril_()[None, None]
        w.compiled(toks[None].clone(), cos, sin, mask, [k[:1] for k in eng.keys], [v[:1] for v in eng.values],
                   torch.zeros(L, dtype=torch.long), pos, L)
    r = {name: med(f) for name, f in (("batch", batch_path), ("causal", causal_path), ("compiled", compiled_path))}
    print(L, {k: f"{v:.1f} ms" for k, v in r.items()}, flush=True)
