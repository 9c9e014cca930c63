"""Do the drafters lack capacity? Hydra's AR module, or the BPD heads, trained from scratch at several widths.

    python benchmarks/2026-12-04-capacity/probe.py [--kind module|heads] [--inner 1152,3456] [--epochs 2]

--kind module: on the shipped BPD heads (frozen), one AR module per inner size starts from the identity;
--kind heads: BPD heads per inner size (the heads' hidden width). Each trains on the same ShareGPT feature store
(600k tokens, built in the target's dtype on first use), with the same epochs, learning rate and seed, and is then
scored on the held-out store: per-depth top-1 agreement with the target (for a module, given the true parent:
what a tree can use). They are written to OUT/KIND-inner-N, for `hydra:module=DIR` or `bpd:checkpoint=DIR`.
"""
import argparse
import time

import torch

from blockdraft.api import load_target
from blockdraft.methods import CHECKPOINTS
from blockdraft.train.run import prepare_stores
from blockdraft.train.heads import HeadsTrainConfig, evaluate_heads, train_heads
from blockdraft.train.treeflash import TreeFlashTrainConfig, evaluate_treeflash, train_treeflash


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kind", choices=("module", "heads"), default="module")
    p.add_argument("--inner", default="1152,3456", help="comma-separated inner sizes")
    p.add_argument("--epochs", type=float, default=2.0)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--out", default="runs/capacity")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    target = load_target(None)
    store, valid = prepare_stores(target, "sharegpt", 600_000, 30_000)
    base = CHECKPOINTS / target.name / "bpd"
    rows = []
    for inner in (int(x) for x in args.inner.split(",")):
        t0 = time.perf_counter()
        out = f"{args.out}/{args.kind}-inner-{inner}"
        if args.kind == "module":
            drafter = train_treeflash(target, store, valid, out, TreeFlashTrainConfig(
                init=str(base), inner_size=inner, epochs=args.epochs, lr=args.lr))
            metrics, model = evaluate_treeflash(drafter, valid), drafter.module
        else:
            drafter = train_heads(target, store, valid, out, HeadsTrainConfig(inner_size=inner, epochs=args.epochs,
                                                                                lr=args.lr))
            metrics, model = evaluate_heads(drafter, valid), drafter.model
        minutes = (time.perf_counter() - t0) / 60
        params = sum(w.numel() for w in model.parameters())
        rows.append((inner, params, minutes, metrics.accuracy))
        print(f"inner {inner}: {params / 1e6:.1f}M parameters, {minutes:.1f} min, "
              f"top-1 per depth {[round(a, 4) for a in metrics.accuracy]}", flush=True)
    print(f"\n| {args.kind} inner size | parameters | training minutes | top-1 per depth (given the true parent) |")
    print("|---|---|---|---|")
    for inner, params, minutes, acc in rows:
        print(f"| {inner} | {params / 1e6:.1f}M | {minutes:.1f} | {' / '.join(f'{a:.3f}' for a in acc)} |")


if __name__ == "__main__":
    main()
