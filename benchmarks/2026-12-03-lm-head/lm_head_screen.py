"""The target's LM head in a verification pass, and an exact greedy argmax screened through an int8 copy.

1. Share: a compiled verification pass of n nodes (causal chain after a 300-token context) against the LM head alone
   on those n rows, run right after such a pass (so its weights come from memory, as in the loop).
2. Screen: for final hidden states h of real prompts, the int8 copy of the LM head (per row symmetric, bf16
   activations) gives approximate logits a_r; a bound e_r on |logit_r - a_r| (the bf16 rounding of h, the int8
   rounding of each row, the kernel's bf16 output) leaves the candidates whose a_r + e_r reaches the largest a - e.
   Their exact float32 logits decide the argmax. Checks it equals the full float32 argmax on every row, counts
   candidates, and times one row both ways.
    python benchmarks/2026-12-03-lm-head/lm_head_screen.py
"""

import json
import statistics
import time
from pathlib import Path

import torch

import blockdraft
from blockdraft.api import load_target
from blockdraft.target import packing

torch.set_num_threads(2)


def main() -> None:
    target = load_target(compile=True)
    engine = target.forwarder
    decoder = engine.decoder
    W = decoder.lm_head.weight.detach()  # [V, d] float32
    last = len(decoder.layers)
    print(f"dtype {W.dtype}, LM head {tuple(W.shape)} ({W.numel() * W.element_size() / 1e6:.0f} MB)")

    context = torch.randint(100, 20000, (300,))
    print("| nodes | compiled pass (ms) | LM head on its rows, after a pass (ms) | share |")
    print("|---|---|---|---|")
    for n in (1, 4, 8, 16, 32):
        tokens, positions = torch.randint(100, 20000, (n,)), torch.arange(300, 300 + n)
        allowed = torch.ones(n, n, dtype=torch.bool).tril_() if n > 1 else None
        passes, heads = [], []
        for _ in range(9):
            engine.reset()
            engine.forward(context, torch.arange(300))
            t = time.perf_counter()
            _, (h,) = engine.forward(tokens, positions, allowed, (last,))
            passes.append(time.perf_counter() - t)
            engine.reset()
            engine.forward(context, torch.arange(300))
            engine.forward(tokens, positions, allowed)
            with torch.inference_mode():
                t = time.perf_counter()
                decoder.lm_head(h)
                heads.append(time.perf_counter() - t)
        p, hd = statistics.median(passes) * 1e3, statistics.median(heads) * 1e3
        print(f"| {n} | {p:.1f} | {hd:.1f} | {hd / p:.0%} |")

    # final hidden states of real prompts
    questions = Path(blockdraft.__file__).parent / "bench" / "spec_bench" / "question.jsonl"
    prompts = [json.loads(line)["turns"][0] for line in questions.read_text().splitlines()[::20]][:24]
    rows = []
    for text in prompts:
        ids = target.encode_chat([{"role": "user", "content": text}])
        engine.reset()
        with torch.inference_mode():
            _, (h,) = engine.forward(torch.tensor(ids), torch.arange(len(ids)), None, (last,))
        rows.append(h[-64:])
    H = torch.cat(rows)

    q, scales = packing.quantize(W)  # the drafters' int8 copy, per row
    dequant_err = (W - q.float() * scales.float()[:, None]).abs().amax(1)  # [V]
    row_max = W.abs().amax(1)

    def screened_argmax(h: torch.Tensor) -> tuple[int, int]:
        hb = h.bfloat16()
        a = torch.ops.aten._weight_int8pack_mm(hb[None], q, scales)[0].float()
        l1 = hb.float().abs().sum()
        # bf16 rounding of h; int8 rounding of each row; float32 accumulation over d terms; bf16 output
        e = ((h - hb.float()).abs().sum() * row_max + l1 * dequant_err + h.numel() * 2 ** -24 * l1 * row_max
             + a.abs() * 2 ** -8 + 1e-4) * 1.01
        cands = torch.nonzero(a + e >= (a - e).max()).flatten()
        exact = W[cands] @ h
        return int(cands[int(exact.argmax())]), len(cands)

    with torch.inference_mode():
        full = (H @ W.T).argmax(1)
        found = [screened_argmax(h) for h in H]
    same = sum(int(f == t) for (f, _), t in zip(found, full.tolist(), strict=True))
    counts = sorted(c for _, c in found)
    print(f"\nscreened argmax equals the float32 argmax on {same}/{len(H)} rows; candidates per row: "
          f"median {counts[len(counts) // 2]}, p90 {counts[int(len(counts) * 0.9)]}, max {counts[-1]}")

    flush = torch.empty(150_000_000)

    def cold(f):
        def g():
            flush.add_(1)
            t = time.perf_counter()
            f()
            return time.perf_counter() - t
        return statistics.median(g() for _ in range(15)) * 1e3

    with torch.inference_mode():
        h = H[5]
        print(f"one row, weights from memory: float32 LM head {cold(lambda: h @ W.T):.2f} ms, "
              f"screened argmax {cold(lambda: screened_argmax(h)):.2f} ms")
        for n in (4, 16, 32):
            print(f"{n} rows, weights from memory: float32 LM head {cold(lambda n=n: H[:n] @ W.T):.2f} ms")


if __name__ == "__main__":
    main()
