"""Where a drafter's time goes inside the real decoding loop (eager target, bf16, 2 threads).

Wraps the parts of hydra / hybrid drafting with timers and decodes 8 Spec-Bench first turns (every 40th
question), 128 tokens each, after one warm-up generation:
    python benchmarks/2026-12-02-drafting-costs/hybrid_parts_in_loop.py [METHOD] [compile]
Prints tokens/s, drafting and verification per step, tau, and each part's ms per step and per call.
"""

import collections
import functools
import json
import sys
import time
from pathlib import Path

import torch

import blockdraft
import blockdraft.drafters.heads as heads
import blockdraft.drafters.hybrid as hybrid
import blockdraft.drafters.suffix as suffix
import blockdraft.drafters.treeflash as treeflash
from blockdraft.api import load_target
from blockdraft.decoding import SpeculativeDecoder
from blockdraft.methods import make_drafter

seconds, calls = collections.defaultdict(float), collections.Counter()


def timed(owner, name: str, label: str) -> None:
    """Replace owner.name by a wrapper that adds its wall time to seconds[label]."""
    inner = getattr(owner, name)

    @functools.wraps(inner)
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            seconds[label] += time.perf_counter() - t0
            calls[label] += 1

    setattr(owner, name, wrapper)


def main() -> None:
    torch.set_num_threads(2)
    timed(heads.HeadsDrafter, "draft_lattice", "heads lattice")
    timed(treeflash.TreeFlashDrafter, "transitions", "transitions")
    timed(treeflash, "best_first_transition_tree", "tree builder")
    timed(treeflash.TreeFlashDrafter, "scored_tree", "learned, all")
    timed(suffix.SuffixDrafter, "sources", "suffix sources")
    timed(hybrid.HybridDrafter, "propose", "hybrid propose")
    method = sys.argv[1] if len(sys.argv) > 1 else "hybrid"
    target = load_target(compile=len(sys.argv) > 2)
    decoder = SpeculativeDecoder(target, make_drafter(method, target))
    questions = Path(blockdraft.__file__).parent / "bench" / "spec_bench" / "question.jsonl"
    prompts = [json.loads(line)["turns"][0] for line in questions.read_text().splitlines()[::40]][:8]
    encode = lambda text: target.encode_chat([{"role": "user", "content": text}])  # noqa: E731
    decoder.generate(encode(prompts[0]), 32)  # warm-up
    seconds.clear()
    calls.clear()
    draft = verify = steps = tokens = total = 0.0
    for prompt in prompts:
        s = decoder.generate(encode(prompt), 128).stats
        draft, verify, total = draft + s.draft_s, verify + s.verify_s, total + s.total_s
        steps, tokens = steps + s.target_calls, tokens + s.new_tokens
    print(f"{method}: {tokens / total:.1f} tok/s, drafting {draft / steps * 1e3:.2f} ms a step, verifying "
          f"{verify / steps * 1e3:.2f} ms, tau {tokens / steps:.2f}")
    for label, s in seconds.items():
        each = s / calls[label] * 1e3
        print(f"  {label:16s} {s / steps * 1e3:6.2f} ms a step ({calls[label]} calls, {each:.2f} ms each)")


if __name__ == "__main__":
    main()
