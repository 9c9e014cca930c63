"""Batched decoding against batch 1 on the real target: identical outputs, numeric ties, real mismatches, tokens/s.

    python benchmarks/batch_check.py [--dtype bfloat16] [--method lookup] [--batch 8] [--tokens 48] [--threads 1]

The same Spec-Bench first turns are decoded one at a time (`SpeculativeDecoder`) and all together
(`BatchDecoder`), greedy. In float32 the outputs must be identical; in bf16/fp16 a batched pass rounds
differently, so each divergence is classified as the benchmark does (bench/ties.py): the float32 logit
gap between the two tokens at the first differing position, against the measured tie tolerance.
"""

import argparse
import time

import torch

from blockdraft import SpeculativeDecoder, load_target
from blockdraft.bench import load_questions
from blockdraft.bench.ties import first_difference, float32_reference, is_tie, logit_gap, tie_tolerance
from blockdraft.decoding import BatchDecoder
from blockdraft.methods import make_drafter


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--method", default="lookup")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    target = load_target("smollm2-135m", dtype=args.dtype)
    questions = load_questions(None, per_category=1)[: args.batch]
    prompts = [target.encode(q.turns[0]) for q in questions]
    drafter = make_drafter(args.method, target)

    t0 = time.perf_counter()
    single = [SpeculativeDecoder(target, drafter).generate(ids, args.tokens).tokens for ids in prompts]
    single_s = time.perf_counter() - t0
    decoder = BatchDecoder(target, args.batch)
    t0 = time.perf_counter()
    seqs = [decoder.add(ids, drafter, max_new_tokens=args.tokens) for ids in prompts]
    while decoder.active:
        decoder.step()
    batch_s = time.perf_counter() - t0

    tolerance = tie_tolerance(target)["tolerance"]
    reference = float32_reference(target)
    identical = ties = real = 0
    for ids, want, seq in zip(prompts, single, seqs, strict=True):
        got = seq.result.tokens
        pos = first_difference(want, got)
        if pos is None:
            identical += 1
            continue
        gap = logit_gap(reference, ids + want[:pos], want[pos] if pos < len(want) else None,
                        got[pos] if pos < len(got) else None)
        tie = is_tie(gap, tolerance)
        ties, real = ties + tie, real + (not tie)
        print(f"divergence at token {pos}: float32 gap {gap:.4f} (tolerance {tolerance:.4f}) -> "
              f"{'numeric tie' if tie else 'REAL MISMATCH'}")
    tokens = sum(len(s.result.tokens) for s in seqs)
    print(f"{args.method}, {args.dtype}, {len(prompts)} prompts x {args.tokens} tokens: identical {identical}, "
          f"ties {ties}, real mismatches {real}; one at a time {tokens / single_s:.1f} tokens/s, "
          f"batched {tokens / batch_s:.1f} tokens/s ({decoder.forwards} batched forwards)")


if __name__ == "__main__":
    main()
