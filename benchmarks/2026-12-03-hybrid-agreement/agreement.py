"""Are hybrid tree nodes that several sources propose accepted more often than their best single score says?

Runs the hybrid on held-out ShareGPT prompts and records, for every child of an accepted node: how many sources
proposed it, its calibrated path score divided by its parent's (the conditional estimate), and whether the target
accepted it."""

import sys
from collections import defaultdict

import torch

from blockdraft.api import load_target
from blockdraft.bench.questions import load_questions
from blockdraft.decoding import SpeculativeDecoder
from blockdraft.drafters.hybrid import HybridDrafter
from blockdraft.methods import make_drafter
from blockdraft.verify import SamplingParams

torch.set_num_threads(2)
n = int(sys.argv[1]) if len(sys.argv) > 1 else 16
target = load_target(dtype="bfloat16")
drafter = make_drafter("hybrid", target)
rows = []
learn = HybridDrafter._learn


def recording_learn(self, tokens):
    if self._last is not None:
        tree, keys, start, scores = self._last
        returned = tokens[start:-1]
        node = 0
        for d in range(len(returned) + 1):
            nxt = returned[d] if d < len(returned) else None
            hit = None
            for child in tree.children[node]:
                ok = nxt is not None and hit is None and int(tree.tokens[child]) == nxt
                hit = child if ok else hit
                sources = {k[0].removesuffix("-global") for k in keys[child]}
                rows.append((len(sources), "hydra" in sources, scores[child] / max(scores[node], 1e-9), ok, d))
            if hit is None:
                break
            node = hit
    return learn(self, tokens)


drafter._learn = recording_learn.__get__(drafter)
decoder = SpeculativeDecoder(target, drafter, SamplingParams(0.0, 0, 1.0))
for q in load_questions("sharegpt", per_category=n):
    decoder.generate(target.encode(q.turns[0], True), 128)
table = defaultdict(lambda: [0, 0.0, 0])
for k, learned, est, ok, d in rows:
    label = "both" if k > 1 else ("learned only" if learned else "retrieval only")
    b = min(int(est * 5), 4)
    t = table[(label, b)]
    t[0] += 1
    t[1] += est
    t[2] += ok
print("| proposed by | conditional estimate bin | nodes | mean estimate | accepted |")
print("|---|---|---|---|---|")
for (label, b), (count, est, ok) in sorted(table.items()):
    print(f"| {label} | {b / 5:.1f}-{(b + 1) / 5:.1f} | {count} | {est / count:.3f} | {ok / count:.3f} |")
