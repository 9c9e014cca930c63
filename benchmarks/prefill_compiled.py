"""Prefill rate of the default target, eager against compiled (`Target.prefill`), in one process.

python benchmarks/prefill_compiled.py [--threads 2] [--lengths 64,256,774,2048] [--reps 7]
Prints tokens/s per prompt length (median of the reps after one warm-up) and the compiled engine's load time.
"""

import argparse
import statistics
import time

import torch

from blockdraft import Target


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--lengths", default="64,256,774,2048")
    p.add_argument("--reps", type=int, default=7)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    eager = Target.load("smollm2-135m")
    fast = Target.load("smollm2-135m", compile=True)
    print(f"{fast.dtype}, {args.threads} threads; compiled engine loaded in {fast.compile_seconds:.0f} s")
    print("| prompt tokens | eager tokens/s | compiled tokens/s | ratio |\n|---|---|---|---|")
    g = torch.Generator().manual_seed(0)
    for n in (int(x) for x in args.lengths.split(",")):
        ids = torch.randint(100, 40000, (n,), generator=g).tolist()
        times = {eager: [], fast: []}
        for rep in range(args.reps + 1):
            for target in (eager, fast):  # alternating, so that drift hits both alike
                t0 = time.perf_counter()
                target.prefill(ids)
                if rep:
                    times[target].append(time.perf_counter() - t0)
        e, c = statistics.median(times[eager]), statistics.median(times[fast])
        print(f"| {n} | {n / e:,.0f} | {n / c:,.0f} | {e / c:.2f}x |")


if __name__ == "__main__":
    main()
