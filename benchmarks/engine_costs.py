"""Verification cost of the target, per engine and dtype: t(1) and t(k)/t(1), next to the bandwidth limit.

    python benchmarks/engine_costs.py [--target smollm2-135m] [--threads 2] [--context 400] [--reps 15]
                                      [--engines hf,static,compiled]
    python benchmarks/engine_costs.py --dtypes bfloat16 --engines static --weights full,int8,int4

Every engine x dtype x weights kind runs interleaved in one process (a round of each, repeated), so that the noise of
a shared machine hits them alike; medians are printed as a markdown table. The bandwidth limit is the
bytes of weight one step must read (every layer's matrices + the LM head; with int8 / int4 weights the bytes of
their planes and scales) divided by the bandwidth the LM-head matmul reaches on this machine (the largest single
read of a step, so its best case).
"""

import argparse
import statistics
import time

import torch

from blockdraft import Target
from blockdraft.trees import DraftTree

KS = (1, 2, 4, 8, 16, 32, 64)


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="smollm2-135m", help="model name, folder or .gguf file")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", type=int, default=400)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--engines", default="hf,static,compiled",
                    help="hf: transformers' forward; static: our engine, eager; compiled: our engine, torch.compile")
    ap.add_argument("--weights", default="full", help="the target's weights: full, int8, int4 (comma-separated)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ids = [1000 + (7 * i) % 20000 for i in range(args.context)]
    targets = {}
    for name in args.dtypes.split(","):
        for weights in args.weights.split(","):
            base = Target.load(args.target, dtype=getattr(torch, name), weights=weights)
            for engine in args.engines.split(","):
                if weights != "full" and engine == "hf":
                    continue  # quantized weights run in the static engine only
                kind = "static" if engine == "compiled" else engine
                t = base if (kind, engine) == ("static", "static") else Target(
                    base.model, base.tokenizer, name=base.name, engine=kind, compile=engine == "compiled",
                    weights=weights)
                t.prefill(ids)
                targets[(name, weights, engine)] = t
    trees = {k: DraftTree.chain(1999, list(range(2000, 1999 + k))) for k in KS}
    samples = {(key, k): [] for key in targets for k in KS}
    for rep in range(args.reps + 2):
        for k in KS:
            for key, t in targets.items():
                dt = timed(lambda: t.verify(trees[k]))
                t.commit([])  # drop the tree again: the context stays at --context tokens
                if rep >= 2:  # the first rounds warm caches and allocators
                    samples[(key, k)].append(dt)
    print(f"\n{args.threads} threads, {args.context}-token context, median of {args.reps}\n")
    print("| dtype | weights | engine | t(1) ms | " + " | ".join(f"t({k})/t(1)" for k in KS[1:]) + " |")
    print("|---|---|---|---|" + "---|" * (len(KS) - 1))
    for key in targets:
        med = {k: statistics.median(samples[(key, k)]) for k in KS}
        print(f"| {' | '.join(key)} | {med[1] * 1e3:.2f} | " + " | ".join(f"{med[k] / med[1]:.2f}" for k in KS[1:])
              + " |")
    print("\n| dtype | weights | weight bytes per step | LM-head matmul bandwidth | bandwidth-limit step |")
    print("|---|---|---|---|---|")
    roofs = {}
    for key, t in targets.items():
        if key[2] != "static":
            continue
        step_bytes = weight_bytes(t)
        bandwidth, rate = head_rates(t)
        roofs[key[:2]] = (step_bytes, bandwidth, rate, flops_per_row(t))
        print(f"| {key[0]} | {key[1]} | {step_bytes / 1e6:.0f} MB | {bandwidth / 1e9:.1f} GB/s | "
              f"{step_bytes / bandwidth * 1e3:.1f} ms |")
    # The roofline: a pass over k rows cannot take less than reading the weights once, nor less than its
    # multiply-adds at the rate the LM head's matmul reaches over 32 rows
    print("\n| dtype | weights | GEMM rate (32 rows) | " + " | ".join(f"t({k}) measured / roofline" for k in KS) + " |")
    print("|---|---|---|" + "---|" * len(KS))
    for key, t in targets.items():
        if key[2] != "static":
            continue
        step_bytes, bandwidth, rate, flops = roofs[key[:2]]
        cells = []
        for k in KS:
            roof = max(step_bytes / bandwidth, k * flops / rate)
            cells.append(f"{statistics.median(samples[(key, k)]) * 1e3:.0f} / {roof * 1e3:.0f} ms")
        print(f"| {key[0]} | {key[1]} | {rate / 1e9:.0f} GFLOP/s | " + " | ".join(cells) + " |")


def head_rates(target) -> tuple[float, float]:
    """(bytes/s, FLOP/s): the LM head's one-row matmul reading its weight, and its 32-row matmul's multiply-adds,
    through whatever the engine holds (full weight, planes, or the file's own integers)."""
    head = target.forwarder.decoder.lm_head
    x1 = torch.randn(1, head_inputs(target), dtype=target.dtype)
    x32 = torch.randn(32, x1.shape[1], dtype=target.dtype)
    with torch.inference_mode():
        for _ in range(3):
            head(x1)
        t1 = statistics.median(timed(lambda: head(x1)) for _ in range(11))
        head(x32)
        t32 = statistics.median(timed(lambda: head(x32)) for _ in range(5))
    return module_bytes(head) / t1, 2 * 32 * x1.shape[1] * head.out_features / t32


def head_inputs(target) -> int:
    return target.model.config.hidden_size


def flops_per_row(target) -> float:
    """Multiply-adds of one row through every projection and the LM head, times two."""
    decoder = target.forwarder.decoder
    total = 0
    for module in [*decoder.layers, decoder.lm_head]:
        for m in module.modules():
            if hasattr(m, "out_features") and hasattr(m, "qweights"):
                inputs = m.qweights[0].shape[1] if m.qweights else (m.weight.shape[1] if m.weight is not None
                                                                    else m.planes.shape[1] * 2)
                total += 2 * m.out_features * inputs
    return total


def module_bytes(module) -> int:
    """Bytes a one-row call reads: the file's integers (qweights), else planes and scales, else the full weight."""
    if getattr(module, "qweights", None):
        return sum(t.nbytes for q in module.qweights for t in (q.w, q.d, q.c, q.hi, q.sc))
    if getattr(module, "planes", None) is not None:
        return module.planes.nbytes + module.plane_scales.nbytes + (module.bias.nbytes if module.bias is not None
                                                                    else 0)
    return sum(t.nbytes for t in module.parameters())


def weight_bytes(target) -> int:
    """Bytes of weight a one-token step reads: every layer's matrices and the LM head (their quantized form when
    quantized), norms included; not the embedding (a step reads one row of it)."""
    decoder = getattr(target.forwarder, "decoder", None)
    if decoder is None:
        model = target.model
        head = model.get_output_embeddings().weight
        return sum(p.numel() * p.element_size() for p in model.model.layers.parameters()) + head.nbytes
    total = 0
    for module in [*decoder.layers, decoder.lm_head]:
        for m in module.modules():
            if hasattr(m, "qweights"):  # a Linear
                total += module_bytes(m)
            elif m is module:
                total += sum(p.nbytes for p in m.parameters(recurse=False))
    return total


if __name__ == "__main__":
    main()
