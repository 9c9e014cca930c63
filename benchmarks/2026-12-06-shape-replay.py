"""Several drafters' trees scored at the very same contexts (a paired comparison of tree shapes at T > 0).

End-to-end runs at T = 1 compare drafters only through different random texts: 26 questions move tau by several
hundredths between seeds. Every lossless method writes text with the target's own law, so any one of them can
write it: the first method decodes, and at each of its steps every method drafts its own tree from the same
context (with its own generator), the target verifies that tree (a pass that is then discarded), and the
acceptance rule accepts it `repeats` times. Reported: each method's mean accepted drafts per step (tau - 1 over
these contexts), its mean tree size, and its ratio to the first method with a paired bootstrap over steps.

    python benchmarks/2026-12-06-shape-replay.py --questions sharegpt --per-category 12 \
        --methods treeflash:budget=32:sample=1,treeflash:budget=32:sample=1:children=4 --out runs/shape-replay

Variants tried here (BENCHMARKS.md, 2026-12-06): METHOD+rates=FILE.npy shapes a sampled tree by acceptance rates
that `--table FILE.npy` measured for the first method; METHOD+top=M makes each node's first M children its row's
top tokens (the library change is in 2026-12-06-shape-replay/top_first.diff); neither was adopted.
METHOD+support=N draws children from N tokens of each row instead of the library's SAMPLE_SUPPORT (32, then 512
after these runs).
"""

import argparse
import dataclasses
import json
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from blockdraft import SamplingParams, SpeculativeDecoder, load_target
from blockdraft.bench.questions import load_questions
from blockdraft.bench.run import _prompt_ids
from blockdraft.drafters import Drafter
from blockdraft.drafters.lattice import DraftLattice
from blockdraft.methods import make_drafter
from blockdraft.trees import DraftTree
from blockdraft.trees.builders import best_first_transition_tree
from blockdraft.trees.budget import keep_best
from blockdraft.trees.sampled import drafting_generator, sampled_tree, tempered
from blockdraft.verify import make_acceptor

EDGES = np.linspace(0, 1, 11)[1:-1]  # buckets of a node's likeliest child's q: [0, .1), [.1, .2), ... [.9, 1]
RANKS = 8


def bucket(top_q) -> np.ndarray:
    return np.digitize(top_q, EDGES)


class Table:
    """How often a node's k-th drawn child is on the accepted path, given the node is, by the node's top q."""

    def __init__(self):
        self.on_path = np.zeros((len(EDGES) + 1, RANKS))  # nodes on the path that have a k-th child
        self.child = np.zeros((len(EDGES) + 1, RANKS))  # ... and whose k-th child is on it

    def record(self, tree, path):
        kids = tree.children
        for i, u in enumerate(path):
            if not kids[u] or tree.q is None or torch.isnan(tree.q[kids[u][0], 0]):
                continue
            b = int(bucket(float(tree.q[kids[u][0]].max())))
            self.on_path[b, : len(kids[u])] += 1
            if i + 1 < len(path) and kids[u].index(path[i + 1]) < RANKS:
                self.child[b, kids[u].index(path[i + 1])] += 1

    def rates(self) -> np.ndarray:
        """[buckets, ranks] acceptance rates, non-increasing in rank (a best-first builder needs sorted rows)."""
        r = (self.child + 0.5) / (self.on_path + 1.0)
        return np.minimum.accumulate(r, axis=1)


def shaped_by(drafter, rates: np.ndarray):
    """`drafter` (sampled TreeFlash) with its tree's shape built from measured acceptance rates instead of its
    log-probs: a row's k-th child scores log rates[bucket(row's top q at the draft temperature), k]. The draws
    and their q are untouched, and the shape is still fixed before anything is drawn."""

    def shape_logp(logp: torch.Tensor, temperature: float) -> torch.Tensor:
        top = tempered(logp.float().numpy(), temperature).max(-1)
        k = logp.shape[-1]
        return torch.from_numpy(np.log(rates[bucket(top)][..., :k])).float()

    def scored_tree(ctx):
        self = drafter
        root = ctx.tokens[-1]
        lattice = self.lattice(ctx)
        assert self.sample and ctx.temperature > 0, "shaped by acceptance rates: sampled trees at T > 0 only"
        if lattice is None:
            return DraftTree.root_only(root), []
        temp = ctx.temperature * self.draft_temp
        width = max(self.children, self.SAMPLE_SUPPORT)
        parents, tokens, logp = self.transitions(root, lattice, width)
        flat = DraftLattice(lattice.tokens, shape_logp(lattice.logp, temp)[..., : lattice.tokens.shape[1]])
        scores: list[float] = []
        tree = best_first_transition_tree(root, flat, parents, tokens[..., : self.children],
                                          shape_logp(logp, temp)[..., : self.children], self.budget, ctx.max_depth,
                                          scores)
        tree = keep_best(tree, scores, self.cost_curve, len(ctx.tokens))
        return sampled_tree(tree, scores[: len(tree) - 1], lattice, temp, drafting_generator(ctx), self.vocab_size,
                            parents, tokens, logp, lambda ids, depth: self.rows_for(ids, depth, tokens.shape[-1]))

    drafter.scored_tree = scored_tree
    return drafter


def top_first(drafter, top: int):
    """`drafter` (sampled) with each node's first `top` children its row's likeliest tokens (deterministic, q
    one-hot) and the rest drawn from q without them. The verifier visits children in order, so a node accepts
    about p(T) + (1 - p(T)) * overlap(p, q outside T) + ...: after the top tokens' rejections the target's
    residual is p outside T, which q outside T approximates as well as q approximates p."""
    import blockdraft.trees.sampled as sampled

    plain_order, plain_rows = sampled.draw_order, sampled._q_rows

    def draw_order(prob, count, generator):
        count = min(count, int((prob > 0).sum()))
        lead = np.argsort(-prob, kind="stable")[: min(top, count)]
        rest = prob.copy()
        rest[lead] = 0.0
        return lead.tolist() + (plain_order(rest, count - len(lead), generator) if count > len(lead) else [])

    def q_rows(parents, sibling_index, draws, vocab_size):
        q = plain_rows(parents, sibling_index, draws, vocab_size)
        for c in range(1, len(parents)):
            if sibling_index[c] < top:
                q[c] = float("nan")
        return q

    def scored_tree(ctx):
        sampled.draw_order, sampled._q_rows = draw_order, q_rows
        try:
            return type(drafter).scored_tree(drafter, ctx)
        finally:
            sampled.draw_order, sampled._q_rows = plain_order, plain_rows

    drafter.scored_tree = scored_tree
    return drafter


def build(method: str, target):
    """A method string, with '+rates=PATH' for a sampled TreeFlash shaped by a recorded table, '+top=M' for
    one whose nodes' first M children are their top tokens, '+support=N' for one drawing from N tokens of a row."""
    name, _, rates = method.partition("+rates=")
    name, _, top = name.partition("+top=")
    name, _, support = name.partition("+support=")
    drafter = make_drafter(name, target)
    if support:
        drafter.SAMPLE_SUPPORT = int(support)  # tokens of each transition row a child may be drawn from
    if top:
        drafter = top_first(drafter, int(top))
    return shaped_by(drafter, np.load(rates)) if rates else drafter


class Scoring(Drafter):
    """Proposes the first drafter's tree; before that, every drafter's tree is verified and accepted on the side."""

    def __init__(self, target, drafters: dict, params: SamplingParams, rule: str, repeats: int):
        self.target, self.drafters, self.repeats = target, drafters, repeats
        layers = {d.feature_layers for d in drafters.values()}
        assert len(layers) == 1, "the methods must read the same target layers"
        self.feature_layers = layers.pop()
        self.rule = make_acceptor(rule, params)
        self.draft_gens = {m: torch.Generator().manual_seed(100 + i) for i, m in enumerate(drafters)}
        self.accept_gens = {m: torch.Generator().manual_seed(200 + i) for i, m in enumerate(drafters)}
        self.steps: list[dict] = []
        self.name = next(iter(drafters))
        self.table = Table()

    def reset(self, prompt_ids):
        for d in self.drafters.values():
            d.reset(prompt_ids)

    def propose(self, ctx):
        step, first = {}, None
        for method, drafter in self.drafters.items():
            own = dataclasses.replace(ctx, generator=self.draft_gens[method])
            tree = drafter.propose(own)
            tree = tree.truncate(len(tree), ctx.max_depth)
            self.target.forwarder.length = self.target.length  # the side pass writes where the real one will
            logits = self.target.verify(tree).logits.float()
            paths = [self.rule.accept(tree, logits, self.accept_gens[method]).path for _ in range(self.repeats)]
            step[method] = (float(np.mean([len(p) - 1 for p in paths])), len(tree))
            if first is None:
                for path in paths:
                    self.table.record(tree, path)
            first = tree if first is None else first
        self.target.forwarder.length = self.target.length
        self.steps.append(step)
        return first


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", required=True, help="comma-separated; the first one decodes and is the reference")
    ap.add_argument("--questions", default=None, help="spec-bench (default), sharegpt or a path")
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--rule", default="traversal")
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--all-turns", action="store_true", help="every turn of each question (default: the first)")
    ap.add_argument("--skip", type=int, default=0, help="leave out the first N questions")
    ap.add_argument("--table", default=None, help="save the first method's acceptance rates here (.npy)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target = load_target()
    params = SamplingParams(args.temperature)
    methods = args.methods.split(",")
    scoring = Scoring(target, {m: build(m, target) for m in methods}, params, args.rule, args.repeats)
    decoder = SpeculativeDecoder(target, scoring, params, args.rule)
    for i, q in enumerate(tqdm(load_questions(args.questions, args.per_category)[args.skip:], desc="questions")):
        answers = []  # every turn, each given the first method's earlier replies (as the bench does)
        for turn in range(len(q.turns) if args.all_turns else 1):
            out = decoder.generate(_prompt_ids(target, q, answers, turn), args.max_new_tokens, seed=args.seed + i)
            answers.append(out.text)
    if args.table:
        np.save(args.table, scoring.table.rates())
        print("on path per bucket and rank", scoring.table.on_path.astype(int).tolist())
        print(np.round(scoring.table.rates(), 3))
    accepted = {m: np.array([s[m][0] for s in scoring.steps]) for m in methods}
    nodes = {m: float(np.mean([s[m][1] for s in scoring.steps])) for m in methods}
    base = accepted[methods[0]]
    rng = np.random.default_rng(0)
    draws = [rng.integers(0, len(base), len(base)) for _ in range(2000)]
    results = {}
    for m in methods:
        boot = [(1 + accepted[m][i].mean()) / (1 + base[i].mean()) for i in draws]
        results[m] = {"tau": 1 + float(accepted[m].mean()), "nodes": nodes[m],
                      "tau ratio to first": float((1 + accepted[m].mean()) / (1 + base.mean())),
                      "95%": [float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))]}
        r = results[m]
        print(f"{m:60s} tau {r['tau']:.3f}  nodes {nodes[m]:5.1f}  ratio {r['tau ratio to first']:.3f} "
              f"[{r['95%'][0]:.3f}, {r['95%'][1]:.3f}]", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"config": vars(args), "steps": len(base),
                                                  "device": str(target.device), "dtype": str(target.dtype),
                                                  "results": results}, indent=1))


if __name__ == "__main__":
    main()
