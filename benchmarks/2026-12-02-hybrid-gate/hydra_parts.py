import time, statistics, torch
from blockdraft import load_target, make_drafter
torch.set_num_threads(2)
t = load_target(dtype="bfloat16")
d = make_drafter("hydra", t)
base, mod = d.base, d.module
H = t.model.config.hidden_size
flush = torch.empty(300_000_000, dtype=torch.uint8)
def timeit(f, n=60, fl=True):
    ts = []
    for _ in range(n):
        if fl: flush.add_(1)
        s = time.perf_counter(); f(); ts.append(time.perf_counter() - s)
    return statistics.median(ts[5:]) * 1000
h = torch.randn(H, dtype=torch.bfloat16)
with torch.inference_mode():
    states = base.model(h)
    S32 = torch.randn(32, H, dtype=torch.bfloat16)
    emb = torch.randn(4, 8, H, dtype=torch.bfloat16); hs = torch.randn(4, H, dtype=torch.bfloat16)
    for fl in (True, False):
        print("flush" if fl else "warm",
              f"heads {timeit(lambda: base.model(h), fl=fl):.2f}",
              f"lm_head(4) {timeit(lambda: base.lm_head(states), fl=fl):.2f}",
              f"lm_head(32) {timeit(lambda: base.lm_head(S32), fl=fl):.2f}",
              f"module {timeit(lambda: mod(hs[:, None].expand(4, 8, -1), emb), fl=fl):.2f}",
              f"logsm+topk(32) {timeit(lambda: torch.log_softmax(base.lm_head(S32).float(), -1).topk(8, -1), fl=fl):.2f}",
              f"copy 20MB {timeit(lambda: base.lm_head.weight.clone(), fl=fl):.2f}")
    print(base.lm_head.weight.shape, base.lm_head.packed is not None, sum(p.numel() for p in base.model.parameters()), sum(p.numel() for p in mod.parameters()))
