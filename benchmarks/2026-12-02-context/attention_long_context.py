"""Two ways to cut the target's attention cost after long contexts, against SDPA as it is (bf16, 2 threads;
30 layers of distinct caches, so they come from memory as in a real step). Both measured no faster:

1. one token: the keys split into S chunks (flash-decoding), merged by log-sum-exp;
2. a tree: the committed context attended without a mask, the tree part with its mask, merged likewise.

    python benchmarks/2026-12-02-context/attention_long_context.py
"""
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

print('1. one token, keys split into chunks')
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

print('2. a tree, context and tree part apart')
for L in (1000, 4000):
  for n in (8, 17, 33):
    start=L-n
    q = torch.randn(1,3,3*n,64,dtype=dt)
    m = torch.rand(n,n) > 0.5; m |= torch.eye(n, dtype=torch.bool)
    full = torch.ones(n, L, dtype=torch.bool); full[:, start:] = m
    bias = torch.zeros(1,1,n,L,dtype=dt).masked_fill_(~full[None,None], float("-inf")).repeat(1,1,3,1)
    tb = bias[..., start:].contiguous()
    def masked():
        for K,V in zip(Ks,Vs): F.scaled_dot_product_attention(q,K[:,:,:L],V[:,:,:L],attn_mask=bias,scale=0.125)
    def one(K, V):
        o1, l1 = op(q, K[:,:,:start], V[:,:,:start], scale=0.125)[:2]
        o2, l2 = op(q, K[:,:,start:L], V[:,:,start:L], attn_mask=tb, scale=0.125)[:2]
        w = torch.sigmoid(l1 - l2)[..., None]  # weight of part 1
        return (o1 * w + o2 * (1 - w)).to(dt)
    def split():
        for K,V in zip(Ks,Vs): one(K,V)
    ref = F.scaled_dot_product_attention(q,Ks[0][:,:,:L],Vs[0][:,:,:L],attn_mask=bias,scale=0.125)
    err = (one(Ks[0],Vs[0]).float()-ref.float()).abs().max().item()
    print(L, n, f"masked {bench(masked):.0f}us split {bench(split):.0f}us err {err:.4f}")
