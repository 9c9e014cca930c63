"""How a node's children should be drafted at T > 0: the acceptance of the root's k children, exactly computed.

Decodes held-out ShareGPT prompts with `treeflash:sample=1` (or METHOD) at T = 1 and records, at every step,
the drafter's transition row at the root (its top-32 tokens, q = softmax at T) and the target's distribution p
there (softmax(logits / T) of the verification pass). For k = 1..4 children it then computes the probability
that one of them is accepted by multi-draft recursive rejection (RejectionAcceptor's rule):
- top-k:       the k most likely tokens of q, each verified as a one-hot draft (= p of those k tokens);
- sampled:     k draws without replacement from q (trees/sampled.py), averaged over 300 draw orders;
- greedy-last: the k-1 most likely tokens as one-hot drafts, the last child drawn from q without them.
    python benchmarks/2026-12-03-sampled/root_acceptance.py [PROMPTS] [METHOD]
"""

import sys

import numpy as np
import torch

from blockdraft.api import load_target
from blockdraft.bench.questions import load_questions
from blockdraft.decoding import SpeculativeDecoder
from blockdraft.drafters.treeflash import TreeFlashDrafter
from blockdraft.methods import make_drafter
from blockdraft.verify import SamplingParams

T, KS, ORDERS = 1.0, (1, 2, 3, 4), 300
prompts = int(sys.argv[1]) if len(sys.argv) > 1 else 8
method = sys.argv[2] if len(sys.argv) > 2 else "treeflash:sample=1"

torch.set_num_threads(2)
target = load_target("smollm2-135m")
drafter = make_drafter(method, target)
decoder = SpeculativeDecoder(target, drafter, SamplingParams(T))
steps = []  # per drafted step: (support ids, log q) of the root's row, the target's p at the root
pending = []  # this step's row, until the verification pass gives p

inner_transitions = TreeFlashDrafter.transitions


def recording_transitions(self, root, lattice, width=None):
    parents, tokens, logp = inner_transitions(self, root, lattice, width)
    pending[:] = [(tokens[0, 0].numpy(), logp[0, 0].double().numpy())]
    return parents, tokens, logp


TreeFlashDrafter.transitions = recording_transitions
inner_accept = decoder.acceptor.accept


def recording_accept(tree, logits, gen):
    if pending:
        steps.append((*pending.pop(), torch.softmax(logits[0].double() / T, -1).numpy()))
    return inner_accept(tree, logits, gen)


decoder.acceptor.accept = recording_accept
for q in load_questions("sharegpt", prompts):
    decoder.generate(target.encode(q.turns[0]), 96, seed=0)


def accept_any(p_support: np.ndarray, q_rows: list[np.ndarray], drawn: list[int]) -> float:
    """P(one of the children is accepted): child i (support index drawn[i], proposal q_rows[i]) is kept with
    min(1, r(x) / q_i(x)); after a rejection r <- norm(max(r - q_i, 0)). Off-support mass is one number."""
    r, off = p_support.copy(), 1.0 - p_support.sum()
    miss = 1.0
    for x, qi in zip(drawn, q_rows, strict=True):
        z = r.sum() + off
        a = min(1.0, r[x] / z / qi[x])
        miss *= 1.0 - a
        r, off = np.maximum(r / z - qi, 0.0), off / z
    return 1.0 - miss


rng = np.random.default_rng(0)
totals = {(name, k): 0.0 for name in ("top-k", "sampled", "greedy-last") for k in KS}
for ids, logq, p in steps:
    q = np.exp((logq - logq.max()) / T)
    q /= q.sum()
    ps = p[ids]
    for k in KS:
        totals["top-k", k] += ps[:k].sum()
        onehots = [np.eye(len(q))[i] for i in range(k - 1)]
        rest = q.copy()
        rest[: k - 1] = 0.0
        totals["greedy-last", k] += np.mean([accept_any(ps, onehots + [rest / rest.sum()], list(range(k - 1)) + [x])
                                             for x in rng.choice(len(q), size=ORDERS // 10, p=rest / rest.sum())])
        acc = 0.0
        for _ in range(ORDERS // k):
            keys = np.log(q) + rng.gumbel(size=len(q))
            order = list(np.argsort(-keys)[:k])
            q_rows, left = [], q.copy()
            for x in order:
                q_rows.append(left / left.sum())
                left = left.copy()
                left[x] = 0.0
            acc += accept_any(ps, q_rows, order)
        totals["sampled", k] += acc / (ORDERS // k)

n = len(steps)
print(f"{method}, T = {T}, {prompts} held-out ShareGPT prompts, {n} steps: P(a root child is accepted)")
print("| children | " + " | ".join(("top-k", "sampled", "greedy-last")) + " |\n|---|---|---|---|")
for k in KS:
    print(f"| {k} | " + " | ".join(f"{totals[name, k] / n:.3f}" for name in ("top-k", "sampled", "greedy-last"))
          + " |")
