"""Target attention after long contexts, one token: SDPA as is vs keys split into S chunks (flash-decoding), merged by log-sum-exp. 30 layers of distinct caches, so the caches come from memory as in a real step."""
import torch, time, torch.nn.functional as F
torch.set_num_threads(2)
op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
def bench(fn, reps=20):
    for _ in range(3): fn()
    ts=[]
    for _ in range(reps):
        t=time.perf_counter(); fn(); ts.append(time.perf_counter()-t)
    ts.sort(); return ts[len(ts)//2]*1e6/30
dt=torch.bfloat16
cap=4608
Ks=[torch.randn(1,3,cap,64,dtype=dt) for _ in range(30)]; Vs=[torch.randn(1,3,cap,64,dtype=dt) for _ in range(30)]
for L in (1000, 2000, 4000):
  for n in (1,):
    q = torch.randn(1,3,3*n,64,dtype=dt)
    ref = F.scaled_dot_product_attention(q,Ks[0][:,:,:L],Vs[0][:,:,:L],scale=0.125)
    def plain():
        for K,V in zip(Ks,Vs): F.scaled_dot_product_attention(q,K[:,:,:L],V[:,:,:L],scale=0.125)
    def split(S, check=False):
        c = L // S
        def one(K, V):
            k = K[0].as_strided((3, S, c, 64), (cap*64, c*64, 64, 1))
            v = V[0].as_strided((3, S, c, 64), (cap*64, c*64, 64, 1))
            qq = q[0][:, None].expand(3, S, 3*n, 64)
            out, lse = op(qq, k, v, scale=0.125)[:2]
            w = torch.softmax(lse, 1)[..., None]   # [3,S,3n,1] fp32
            return (out * w).sum(1, dtype=torch.float32).to(dt)[None]
        if check:
            return one(Ks[0], Vs[0])
        def f():
            for K,V in zip(Ks,Vs): one(K,V)
        return f
    r = {"plain": bench(plain)}
    for S in (2,4,8):
        if L % S == 0:
            err = (split(S, True) - ref).abs().max().item()
            r[f"split{S}"] = f"{bench(split(S)):.0f}us err {err:.3f}"
    print(L, n, r)
