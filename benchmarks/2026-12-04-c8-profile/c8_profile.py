"""Where concurrency 8's time goes: issue 16's in-process load with timers around the batch engine's passes.

200 Spec-Bench first turns, 64 tokens each, `lookup`, compiled, default dtype, 2 threads, prefix cache 256 MB, as
`python benchmarks/serve_load.py --in-process --requests 200 --concurrency 8`, at prefill_chunk 256 (the default)
and 512, alternating, two runs each (or as many pairs as the first argument says). The first run's `forward` time
includes the batch graphs' compilation.

    python benchmarks/2026-12-04-c8-profile/c8_profile.py [PAIRS]     # from the repository root
"""

import collections
import sys
import time
import types

import torch

import blockdraft.decoding as decoding
from blockdraft.api import load_target
from blockdraft.bench import load_questions
from blockdraft.methods import make_drafter
from blockdraft.target.batch_engine import BatchEngine

sys.path.insert(0, "benchmarks")
import serve_load  # noqa: E402  (benchmarks/serve_load.py: its in-process load, unchanged)

SECONDS, CALLS = collections.defaultdict(float), collections.Counter()
CHUNK = [256]
PAIRS = int(sys.argv[1]) if len(sys.argv) > 1 else 2


def timed(name):
    real = getattr(BatchEngine, name)

    def wrapper(self, *args, **kwargs):
        t0 = time.perf_counter()
        out = real(self, *args, **kwargs)
        SECONDS[name] += time.perf_counter() - t0
        CALLS[name] += 1
        return out

    setattr(BatchEngine, name, wrapper)


class ChunkedBatchDecoder(decoding.BatchDecoder):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **{**kwargs, "prefill_chunk": CHUNK[0]})


def main() -> None:
    torch.set_num_threads(2)
    timed("forward")
    timed("forward_with_prompt")
    decoding.BatchDecoder = ChunkedBatchDecoder  # serve_load imports it from here at each level
    target = load_target(None, compile=True)
    drafter = make_drafter("lookup", target)
    conversations = [q.turns[:1] for q in load_questions(None)]
    args = types.SimpleNamespace(max_batch=8, max_tokens=64, system=[])
    for chunk in (256, 512) * PAIRS:
        CHUNK[0] = chunk
        SECONDS.clear()
        CALLS.clear()
        level = serve_load.run_level_in_process(target, drafter, conversations, 200, 8, 256.0, args)
        print(f"chunk {chunk}: {level['tokens_per_s']:.1f} tok/s, wall {level['wall_s']:.1f} s, "
              f"p50 {level['p50']:.2f} s, p95 {level['p95']:.2f} s; "
              + ", ".join(f"{k} {SECONDS[k]:.1f} s in {CALLS[k]} calls" for k in SECONDS), flush=True)


if __name__ == "__main__":
    main()
