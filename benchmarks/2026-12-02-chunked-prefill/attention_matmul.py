"""Scratch: folded SDPA against explicit matmul attention (scores in float32) for small queries over long caches."""
import statistics, time, torch
import torch.nn.functional as F
torch.set_num_threads(2)
H, KV, D = 9, 3, 64
def micros(fn, reps=200):
    for _ in range(10): fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e6
g, group = torch.Generator().manual_seed(0), H // KV
print("| B | n | end | sdpa folded (us) | matmul (us) | matmul bf16 scores (us) | diff f32sc | diff bf16sc |")
for B, n, end in ((8, 1, 300), (8, 2, 300), (8, 2, 1000), (8, 1, 1000), (8, 2, 2000), (4, 4, 1000), (1, 17, 1000), (1, 17, 4000)):
    q = torch.randn(B, KV, group * n, D, generator=g).bfloat16()
    k = torch.randn(B, KV, end, D, generator=g).bfloat16()
    v = torch.randn(B, KV, end, D, generator=g).bfloat16()
    mask = torch.rand(B, 1, n, end, generator=g) > 0.3
    mask[..., :1] = True
    bias = torch.zeros(mask.shape, dtype=q.dtype).masked_fill_(~mask, float("-inf")).repeat(1, 1, group, 1)
    fbias = bias.float()
    s = D ** -0.5
    def sdpa(): return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=s)
    def mm(): 
        w = torch.matmul(q, k.transpose(-1, -2)).float().mul_(s).add_(fbias).softmax(-1)
        return torch.matmul(w.to(v.dtype), v)
    def mm16():
        w = torch.baddbmm(bias.expand(B, KV, group * n, end).reshape(B * KV, group * n, end), q.view(B * KV, -1, D), k.view(B * KV, end, D).transpose(1, 2), alpha=s).softmax(-1)
        return torch.bmm(w, v.view(B * KV, end, D)).view(B, KV, -1, D)
    a, b, c = sdpa().float(), mm().float(), mm16().float()
    print(f"| {B} | {n} | {end} | {micros(sdpa):.0f} | {micros(mm):.0f} | {micros(mm16):.0f} | {(a-b).abs().max():.1e} | {(a-c).abs().max():.1e} |", flush=True)
