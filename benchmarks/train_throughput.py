"""Drafter training throughput: target tokens per hour to build the feature store, and to train each drafter kind.

    python benchmarks/train_throughput.py [--threads 2] [--dtypes float32,bfloat16] [--steps 60]
                                          [--store-tokens 20000] [--train-store DIR]

Per dtype, in one process: (1) the feature store is built over `--store-tokens` fresh ShareGPT training
tokens (whole conversations up to 2048 tokens) in a temporary folder; (2) each drafter kind (bpd, dflash,
TreeFlash on the shipped dflash drafter, hydra on the shipped bpd heads) trains `--steps`
optimizer steps from `--train-store` (a store of whole conversations, the data the real runs read), with
autocast to the target's dtype as in `blockdraft train`. The first 10 steps are warm-up and not timed.

A "token" is one store position a step consumes: bpd and hydra read `batch` positions per step, the
dflash drafter and TreeFlash one conversation per step (every one of its tokens, with anchor blocks on its
reply positions). The end-to-end rate is what one pass of new data costs: store building plus training.
"""

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from blockdraft import Target
from blockdraft.data.sharegpt import data_path, load_conversations, split_conversations
from blockdraft.train import trainer as loop
from blockdraft.train.features import FeatureStore, build_store
from blockdraft.train.run import training_config

SHIPPED = Path(__file__).resolve().parents[1] / "src/blockdraft/checkpoints/smollm2-135m"
KINDS = {  # name -> (train --drafter, options)
    "bpd": ("bpd", {}),
    "dflash": ("dflash", {}),
    "treeflash": ("treeflash", {"init": str(SHIPPED / "dflash")}),
    "hydra": ("treeflash", {"init": str(SHIPPED / "bpd")}),
}


class StepClock:
    """Wraps Trainer.step to stamp the time of every optimizer step (this script only)."""

    def __init__(self):
        self.stamps: list[float] = []
        self.original = loop.Trainer.step

    def __enter__(self):
        clock = self

        def step(trainer, loss, **extra):
            keep_going = clock.original(trainer, loss, **extra)
            clock.stamps.append(time.perf_counter())
            return keep_going

        loop.Trainer.step = step
        return self

    def __exit__(self, *exc):
        loop.Trainer.step = self.original

    def seconds_per_step(self, warmup: int = 10) -> float:
        gaps = [b - a for a, b in zip(self.stamps[warmup:], self.stamps[warmup + 1:])]
        return statistics.median(gaps)


def tokens_per_step(drafter: str, cfg, store: FeatureStore, init: str | None) -> float:
    heads_base = drafter == "bpd" or (init is not None and "bpd" in Path(init).name)
    if heads_base:
        return cfg.batch
    lengths = [b - a for a, b in store.sequences() if b - a >= 8]
    return statistics.mean(lengths)  # one conversation per step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--store-tokens", type=int, default=20_000)
    ap.add_argument("--train-store", required=True, help="a complete feature store to train from")
    ap.add_argument("--kinds", default=",".join(KINDS))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    train_records, _ = split_conversations(load_conversations(data_path("sharegpt")))
    store = FeatureStore.open(args.train_store)
    rows = []
    for dtype in args.dtypes.split(","):
        target = Target.load("smollm2-135m", dtype=dtype)
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            built = build_store(target, train_records[5000:], Path(tmp) / "store", args.store_tokens, max_len=2048)
            store_rate = built.meta["n_tokens"] / (time.perf_counter() - t0)
        rows.append((dtype, "feature store (target forward + top-32 teacher)", store_rate, None))
        for name in args.kinds.split(","):
            drafter, options = KINDS[name]
            with tempfile.TemporaryDirectory() as out, StepClock() as clock:
                cfg, train = training_config(drafter, out, stop_at_step=args.steps, **options)
                train(target, store, None, Path(out), cfg)
                rate = tokens_per_step(drafter, cfg, store, options.get("init")) / clock.seconds_per_step()
            rows.append((dtype, name, rate, 1 / (1 / store_rate + 1 / rate)))
    print(f"\n{args.threads} threads; training from {store.path} ({store.meta['n_tokens']:,} tokens, "
          f"max_len {store.meta['max_len']})\n")
    print("| dtype | stage | tokens/s | M tokens/hour | with the store: M new tokens/hour |")
    print("|---|---|---|---|---|")
    for dtype, name, rate, end_to_end in rows:
        both = f"{end_to_end * 3600 / 1e6:.2f}" if end_to_end else ""
        print(f"| {dtype} | {name} | {rate:,.0f} | {rate * 3600 / 1e6:.2f} | {both} |")


if __name__ == "__main__":
    main()
