"""Grouped-query attention on this CPU: SDPA's enable_gqa against the folded query the engine uses.

    python benchmarks/attention_gqa.py [--threads 2]

SmolLM2-135M's shapes (9 query heads, 3 KV heads, head_dim 64), bf16, one layer's attention: microseconds
per call (median of 200) for a batch of B sequences of n new tokens each over `end` cached positions,
under a tree mask. `gqa`: enable_gqa=True with a bool mask (what the engine did); `folded`: the query
viewed as [B, kv_heads, group * n, d] with an additive mask (what it does, target/engine.py). Also checks
that both give the same output.
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64


def micros(fn, reps: int = 200) -> float:
    for _ in range(10):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    g, group = torch.Generator().manual_seed(0), HEADS // KV_HEADS
    print("| B | n | end | gqa (us) | folded (us) | folded / gqa | max abs diff |")
    print("|---|---|---|---|---|---|---|")
    for B, n, end in ((8, 2, 300), (8, 2, 1000), (8, 2, 2000), (8, 8, 1000), (1, 17, 1000), (1, 17, 4000)):
        q = torch.randn(B, HEADS, n, HEAD_DIM, generator=g).bfloat16()
        k = torch.randn(B, KV_HEADS, end, HEAD_DIM, generator=g).bfloat16()
        v = torch.randn(B, KV_HEADS, end, HEAD_DIM, generator=g).bfloat16()
        mask = torch.rand(B, 1, n, end, generator=g) > 0.3
        mask[..., :1] = True  # every row sees something
        bias = torch.zeros(mask.shape, dtype=q.dtype).masked_fill_(~mask, float("-inf")).repeat(1, 1, group, 1)
        folded_q = q.reshape(B, KV_HEADS, group * n, HEAD_DIM)
        gqa = micros(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True))
        folded = micros(lambda: F.scaled_dot_product_attention(folded_q, k, v, attn_mask=bias))
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        b = F.scaled_dot_product_attention(folded_q, k, v, attn_mask=bias).view(B, HEADS, n, HEAD_DIM)
        diff = (a.float() - b.float()).abs().max().item()
        print(f"| {B} | {n} | {end} | {gqa:.0f} | {folded:.0f} | {folded / gqa:.2f} | {diff:.1e} |")


if __name__ == "__main__":
    main()
