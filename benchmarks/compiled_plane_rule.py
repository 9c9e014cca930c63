"""Compiled passes of a quantized target, two-plane (8-bit) weights on their planes at every row bucket or at one row.

    python benchmarks/compiled_plane_rule.py [--target gemma3-270m] [--reps 11]

Loads the target twice with `--weights int4` and compile on: once with linear.COMPILED_PLANE_MAX_ROWS[8] unbounded
(the planes at every bucket), once as shipped (one row); times a pass over k tokens after a 400-token context,
both interleaved, and prints the median of each.
"""

import argparse
import statistics
import time

import torch

from blockdraft import Target
from blockdraft.model import linear
from blockdraft.trees import DraftTree

KS = (1, 4, 8, 16, 32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--reps", type=int, default=11)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ids = [1000 + (7 * i) % 20000 for i in range(400)]
    shipped, targets = linear.COMPILED_PLANE_MAX_ROWS[8], {}
    for rule, rows in (("planes at every bucket", 1 << 30), ("shipped", shipped)):
        linear.COMPILED_PLANE_MAX_ROWS[8] = rows  # read when each Linear is built
        targets[rule] = Target.load(args.target, weights="int4", compile=True)
        targets[rule].prefill(ids)
    linear.COMPILED_PLANE_MAX_ROWS[8] = shipped
    trees = {k: DraftTree.chain(1999, list(range(2000, 1999 + k))) for k in KS}
    samples = {(rule, k): [] for rule in targets for k in KS}
    with torch.inference_mode():
        for rep in range(args.reps + 2):
            for k in KS:
                for rule, target in targets.items():
                    t0 = time.perf_counter()
                    target.verify(trees[k])
                    elapsed = time.perf_counter() - t0
                    target.commit([])  # drop the tree: the context stays at 400 tokens
                    if rep >= 2:  # the first rounds warm caches and allocators
                        samples[(rule, k)].append(elapsed)
    print(f"{args.target}, int4, compiled, {args.threads} threads: median ms of a pass over k tokens")
    for rule in targets:
        print(f"  {rule:24s} " + "  ".join(f"t({k}) {statistics.median(samples[(rule, k)]) * 1e3:5.1f}" for k in KS))


if __name__ == "__main__":
    main()
