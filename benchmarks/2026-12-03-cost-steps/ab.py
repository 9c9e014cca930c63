"""The cost curve with and without the sizes on both sides of the AMX tile steps (15, 31, 63), side by side.

Both curves come from one measurement (the new one); the old one drops the new sizes, i.e. interpolates from 12 to
16 as before. Each method is built twice (one drafter per curve) and the two run alternately on every prompt, so
load on the machine hits both alike. Prints tau and tokens/s per method and curve, and the ratio.

    python benchmarks/2026-12-03-cost-steps/ab.py --methods hybrid,hydra --questions sharegpt --per-category 16
"""

import argparse
import statistics

import torch

import blockdraft
from blockdraft.bench.questions import load_questions
from blockdraft.methods import make_drafter
from blockdraft.trees import budget

p = argparse.ArgumentParser()
p.add_argument("--methods", default="hybrid,hydra")
p.add_argument("--questions", default="sharegpt")
p.add_argument("--per-category", type=int, default=16)
p.add_argument("--max-new-tokens", type=int, default=128)
args = p.parse_args()
torch.set_num_threads(2)
target = blockdraft.Target.load("smollm2-135m", dtype="bfloat16", compile=True)
new = budget.cost_curve(target)
dropped = {15, 31, 63}
old = budget.CostCurve({n: {b: v for b, v in c.items() if b not in dropped} for n, c in new.by_context.items()})
print("curve at 128 tokens, new:", {b: round(v, 3) for b, v in new.at(128).items()})


def build(method, curve):
    real = budget.cost_curve
    budget.cost_curve = lambda t: curve  # the factories fetch the curve through budget.cost_curve
    try:
        return make_drafter(method, target)
    finally:
        budget.cost_curve = real


questions = load_questions(None if args.questions == "spec-bench" else args.questions, per_category=args.per_category)
prompts = [target.encode_chat([{"role": "user", "content": q.turns[0]}]) for q in questions]
for method in args.methods.split(","):
    decoders = {name: blockdraft.SpeculativeDecoder(target, build(method, curve)) for name, curve in
                (("old", old), ("new", new))}
    for d in decoders.values():  # warm up
        d.generate(prompts[0], max_new_tokens=16)
    stats = {name: {"tokens": 0, "calls": 0, "speed": [], "nodes": 0} for name in decoders}
    for i, ids in enumerate(prompts):
        order = ("old", "new") if i % 2 == 0 else ("new", "old")
        for name in order:
            r = decoders[name].generate(ids, max_new_tokens=args.max_new_tokens)
            s = stats[name]
            s["tokens"] += r.stats.new_tokens
            s["calls"] += r.stats.target_calls
            s["nodes"] += r.stats.tree_nodes
            s["speed"].append(r.stats.new_tokens / (r.stats.total_s - r.stats.prefill_s))
    for name, s in stats.items():
        print(f"{method:10s} {name}: tau {s['tokens'] / s['calls']:.3f}  nodes/step {s['nodes'] / s['calls']:.1f}  "
              f"tok/s mean {statistics.mean(s['speed']):.1f} median {statistics.median(s['speed']):.1f}")
    ratio = [b / a for a, b in zip(stats["old"]["speed"], stats["new"]["speed"], strict=True)]
    print(f"{method:10s} new/old per prompt: mean {statistics.mean(ratio):.3f}  median {statistics.median(ratio):.3f}",
          flush=True)
