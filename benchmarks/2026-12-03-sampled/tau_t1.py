"""Tau and drafting time at T = 1 on held-out ShareGPT prompts, one method after another in one process.

    python benchmarks/2026-12-03-sampled/tau_t1.py PROMPTS METHOD... [--seed S] [--no-more-rows] [--conditioned]
--no-more-rows: sampled TreeFlash/hydra trees without rows computed for drawn tokens outside the table's parents
(their children then come from the depth's marginal row: the behaviour before 2026-12-03).
--conditioned: also count, per depth, the sampled nodes with children whose token has a table row.
96 new tokens a prompt, bf16 (the default dtype), eager, 2 threads.
"""

import argparse
import collections

import torch

import blockdraft.drafters.treeflash as treeflash
from blockdraft.api import load_target
from blockdraft.bench.questions import load_questions
from blockdraft.decoding import SpeculativeDecoder
from blockdraft.methods import make_drafter
from blockdraft.verify import SamplingParams

parser = argparse.ArgumentParser()
parser.add_argument("prompts", type=int)
parser.add_argument("methods", nargs="+")
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--no-more-rows", action="store_true")
parser.add_argument("--conditioned", action="store_true")
args = parser.parse_args()

inner = treeflash.sampled_tree
counts = collections.Counter()


def patched(shape, scores, lattice, temperature, gen, vocab, parents=None, tokens=None, logp=None, more_rows=None):
    tree, kept = inner(shape, scores, lattice, temperature, gen, vocab, parents, tokens, logp,
                       None if args.no_more_rows else more_rows)
    table = parents.tolist()
    for node, kids in enumerate(tree.children):
        if kids and node > 0:
            d = int(tree.depth[node])
            counts[d, "with children"] += 1
            counts[d, "has a table row"] += int(tree.tokens[node]) in table[d]
    return tree, kept


treeflash.sampled_tree = patched
torch.set_num_threads(2)
target = load_target("smollm2-135m")
questions = load_questions("sharegpt", args.prompts)
for method in args.methods:
    decoder = SpeculativeDecoder(target, make_drafter(method, target), SamplingParams(1.0))
    new = calls = 0
    drafting = 0.0
    for q in questions:
        stats = decoder.generate(target.encode(q.turns[0]), 96, seed=args.seed).stats
        new, calls, drafting = new + stats.new_tokens, calls + stats.target_calls, drafting + stats.draft_s
    print(f"{method}: tau {new / calls:.3f}, drafting {1000 * drafting / calls:.2f} ms a step", flush=True)
if args.conditioned:
    for d in sorted({d for d, _ in counts}):
        print(f"depth {d}: {counts[d, 'has a table row']} of {counts[d, 'with children']} nodes with children "
              "have a table row")
