"""Draft vocabulary size: held-out coverage of the target's top-1 token, and what the LM head costs per draft step.

    python benchmarks/draft_vocab.py --train-store DIR --valid-store DIR [--sizes 4096,8192,16384,32768,0]
                                     [--threads 2] [--rows 8]

The draft vocabulary is what `blockdraft train` would choose from the train store (the most frequent reply
tokens and teacher top-1 tokens); coverage is the share of the valid store's reply positions whose teacher
top-1 lies inside it: a cap on every depth's acceptance. The head cost is the median time of the frozen
LM head over `--rows` states (one block drafter step, 7 depths + root) in the target's dtype.
"""

import argparse
import statistics
import time

import numpy as np
import torch

from blockdraft import Target
from blockdraft.drafters.layers import FrozenLMHead
from blockdraft.train.vocab import draft_vocabulary
from blockdraft.train.features import FeatureStore


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train-store", required=True)
    ap.add_argument("--valid-store", required=True)
    ap.add_argument("--sizes", default="4096,8192,16384,32768,0")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, default=8)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    train, valid = FeatureStore.open(args.train_store), FeatureStore.open(args.valid_store)
    target = Target.load("smollm2-135m")
    mask = np.asarray(valid.assistant, dtype=bool)
    top1 = np.asarray(valid.topk_ids[:, 0])[mask]
    weight = target.model.get_output_embeddings().weight
    h = torch.randn(args.rows, target.hidden_size, dtype=target.dtype)
    print(f"| draft vocabulary | held-out top-1 coverage | LM head, {args.rows} rows ({target.dtype}) |")
    print("|---|---|---|")
    for size in (int(s) for s in args.sizes.split(",")):
        vocab = draft_vocabulary(train, size, sorted(target.eos_token_ids))
        covered = 1.0 if vocab is None else float(np.isin(top1, vocab.numpy()).mean())
        head = FrozenLMHead(weight, vocab)
        head.prepack()
        times = []
        with torch.inference_mode():
            for _ in range(50):
                t0 = time.perf_counter()
                head(h)
                times.append(time.perf_counter() - t0)
        name = "full" if vocab is None else f"{size:,}"
        print(f"| {name} | {covered:.1%} | {statistics.median(times[10:]) * 1e3:.2f} ms |")


if __name__ == "__main__":
    main()
