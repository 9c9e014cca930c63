"""Batch-8 decoding of held-out ShareGPT prompts (lookup, 64 tokens) under different BatchDecoder max_rows caps.

    python benchmarks/batch_rows.py [--rows none,16,32,64] [--prompts 16] [--reps 1] [--compile]

Each cap gets its own BatchDecoder (on a compiled target they share the graphs made at load), one untimed
warm-up run each, then `--reps` rounds that alternate between the caps; prints total tokens/s per run and
the median, and the target calls (summed over sequences).
"""
import argparse
import statistics
import time

import torch

from blockdraft.api import load_target
from blockdraft.data.sharegpt import load_conversations, split_conversations, user_prompts
from blockdraft.decoding import BatchDecoder
from blockdraft.methods import make_drafter


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="none,16,32,64", help="comma-separated max_rows caps ('none': no cap)")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--compile", action="store_true", help="compile the engine (as blockdraft serve does)")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    target = load_target(None, compile=args.compile)
    _, valid = split_conversations(load_conversations())
    prompts = [target.encode(text) for text in user_prompts(valid, max_chars=1500)[: args.prompts]]
    drafter = make_drafter("lookup", target)
    caps = [None if r == "none" else int(r) for r in args.rows.split(",")]
    decoders = {cap: BatchDecoder(target, max_batch=8, max_rows=cap) for cap in caps}

    def run(cap):
        decoder, pending, seqs = decoders[cap], list(prompts), []
        t0 = time.perf_counter()
        while pending or decoder.active:
            while pending and decoder.free:
                seqs.append(decoder.add(pending.pop(0), drafter, max_new_tokens=64))
            decoder.step()
        seconds = time.perf_counter() - t0
        return sum(len(s.result.tokens) for s in seqs) / seconds, sum(s.stats.target_calls for s in seqs)

    for cap in caps:
        run(cap)  # warm-up
    results = {cap: [] for cap in caps}
    for _ in range(args.reps):
        for cap in caps:
            results[cap].append(run(cap))
    for cap, runs in results.items():
        rates = [rate for rate, _ in runs]
        print(f"max_rows {cap}: {', '.join(f'{r:.1f}' for r in rates)} tok/s (median {statistics.median(rates):.1f}), "
              f"{runs[0][1]} target calls")


if __name__ == "__main__":
    main()
