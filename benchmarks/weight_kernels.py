"""Time the linear layers of one decoding step with full, int8 and int4 weights, next to the memory-bandwidth limit.

A step of a small model on a CPU reads every weight once, so what matters is one pass over all the model's
matrices in order (the sum exceeds the caches), not one matrix called in a loop (which would come from cache).
This script builds the matrices of a model's fused projections (random values of the real shapes), then times
`--repeat` passes over all of them for each kernel and each row count: 1 row is a one-token step, 16-32 rows
a tree verification. It also measures read bandwidth (a sum over a 1 GiB tensor) and prints each kernel's
bandwidth limit: its weight bytes / that bandwidth.

    python benchmarks/weight_kernels.py                        # SmolLM2-135M shapes, bf16 activations
    python benchmarks/weight_kernels.py --dtype float32 --rows 1,32
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from blockdraft.model import packing
from blockdraft.model import quantized_weights as qw

SHAPES = {  # (out, in) of one layer's fused q|k|v, o, gate|up, down; the LM head; the layer count
    "smollm2-135m": ([(960, 576), (576, 576), (3072, 576), (576, 1536)], (49152, 576), 30),
    "gemma3-270m": ([(1536, 640), (640, 1024), (4096, 640), (640, 2048)], (262144, 640), 18),
}


class Kernel:
    """One weight behind one kernel: `linear(x)` and the bytes it reads (`nbytes`)."""

    def __init__(self, call, tensors):
        self.linear, self.nbytes = call, sum(t.numel() * t.element_size() for t in tensors)

    @classmethod
    def full(cls, w):  # oneDNN's prepacked bf16 (the engine's `full`), or plain float32
        packed = packing.pack(w)
        return cls(lambda x: packing.linear(x, w, None, packed), [w])

    @classmethod
    def int8_rows(cls, w):  # aten's int8 kernel: one scale per output row (model/packing.py's drafters' copies)
        q = packing.quantize(w)
        return cls(lambda x: packing.int8_linear(x, q, None), list(q))

    @classmethod
    def planes(cls, w, kind):  # 4-bit planes in groups of 32 (model/quantized_weights.py)
        packed, sz = qw.pack(qw.quantize(w, kind), w.dtype)
        planes = 2 if kind == "int8" else 1
        return cls(lambda x: qw.int4_linear(x, packed, sz, w.shape[0], None, planes), [packed, sz])


def bandwidth_gbs(repeat: int = 5) -> float:
    """Read bandwidth in GB/s: the best of `repeat` sums over a 1 GiB float32 tensor."""
    x = torch.ones(1 << 28)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t0)
    return x.numel() * 4 / best / 1e9


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=sorted(SHAPES), default="smollm2-135m")
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    p.add_argument("--rows", default="1,4,16,32")
    p.add_argument("--repeat", type=int, default=15)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--no-head", action="store_true", help="leave the LM head out")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    layer, head, layers = SHAPES[args.model]
    shapes = layer * layers + ([] if args.no_head else [head])
    torch.manual_seed(0)
    full = [torch.randn(n, k).mul_(0.02).to(dtype) for n, k in shapes]
    kinds = {"full": [Kernel.full(w) for w in full], "int8 rows": [Kernel.int8_rows(w) for w in full],
             "int8": [Kernel.planes(w, "int8") for w in full], "int4": [Kernel.planes(w, "int4") for w in full]}
    gbs = bandwidth_gbs()
    print(f"{args.model} linears ({len(shapes)} matrices), {args.dtype} activations, {args.threads} threads; "
          f"read bandwidth {gbs:.1f} GB/s")
    print(f"{'weights':>9} {'MB':>7} {'limit ms':>9} " + " ".join(f"{r:>4} row{'s' if r > 1 else ' '} ms"
                                                               for r in map(int, args.rows.split(","))))
    with torch.inference_mode():
        for kind, weights in kinds.items():
            mb = sum(w.nbytes for w in weights) / 1e6
            cells = []
            for rows in map(int, args.rows.split(",")):
                xs = {k: torch.randn(rows, k).to(dtype) for k in {s[1] for s in shapes}}
                times = []
                for _ in range(args.repeat + 2):
                    t0 = time.perf_counter()
                    for w, (_, k) in zip(weights, shapes, strict=True):
                        w.linear(xs[k])
                    times.append(time.perf_counter() - t0)
                cells.append(f"{statistics.median(times[2:]) * 1e3:>11.2f}")
            print(f"{kind:>9} {mb:>7.1f} {mb / 1e3 / gbs * 1e3:>9.2f} " + " ".join(cells))


if __name__ == "__main__":
    main()
