"""Two acceptance rules scored on the very same draft trees and target logits (a paired comparison).

A bench run at T > 0 compares acceptors only through different random paths: 26 questions move tau by several
hundredths between seeds, as much as the effect. Here one decoder generates as usual, and at every step each rule
accepts the step's (tree, logits) R times with its own generator: the mean accepted drafts per step of both rules
on identical inputs, with a paired bootstrap interval over steps.

    python benchmarks/2026-12-06-acceptor-replay.py --methods treeflash:budget=32:sample=1,treeflash:budget=32 \
        --per-category 1 --max-new-tokens 128 --temperature 1 --repeats 64 --out benchmarks/2026-12-06-acceptor-replay
"""

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from blockdraft import SamplingParams, SpeculativeDecoder, load_target
from blockdraft.bench.questions import load_questions
from blockdraft.bench.run import _prompt_ids
from blockdraft.methods import make_drafter
from blockdraft.verify import ACCEPTORS, Acceptor


class Replay(Acceptor):
    """Decodes with `decide`; at each step also scores every rule in `rules` on the step's tree and logits."""

    def __init__(self, rules: list[str], params: SamplingParams, repeats: int, decide: str):
        super().__init__(params)
        self.rules = {name: ACCEPTORS[name](params) for name in rules}
        self.params, self.repeats, self.decide = params, repeats, ACCEPTORS[decide](params)
        self.gens = {name: torch.Generator().manual_seed(i + 1) for i, name in enumerate(rules)}
        self.steps: list[dict[str, float]] = []
        self.name = self.decide.name

    def accept(self, tree, logits, gen=None):
        logits = logits.float().cpu()
        self.steps.append({name: float(np.mean([rule.accept(tree, logits, self.gens[name]).accepted_drafts
                                                for _ in range(self.repeats)]))
                           for name, rule in self.rules.items()} | {"nodes": len(tree)})
        return self.decide.accept(tree, logits, gen)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", default="treeflash:budget=32:sample=1,treeflash:budget=32")
    ap.add_argument("--rules", default="rejection,traversal")
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target = load_target()
    params = SamplingParams(args.temperature)
    rules = args.rules.split(",")
    questions = load_questions(None, args.per_category)
    results = {}
    for method in args.methods.split(","):
        replay = Replay(rules, params, args.repeats, decide=rules[0])
        decoder = SpeculativeDecoder(target, make_drafter(method, target), params, replay)
        for q in tqdm(questions, desc=method):
            decoder.generate(_prompt_ids(target, q, [], 0), args.max_new_tokens, seed=0)
        per_rule = {name: np.array([s[name] for s in replay.steps]) for name in rules}
        base, other = per_rule[rules[0]], per_rule[rules[1]]
        rng = np.random.default_rng(0)
        boot = [other[i].mean() / base[i].mean()
                for i in (rng.integers(0, len(base), len(base)) for _ in range(2000))]
        results[method] = {
            "steps": len(base), "repeats": args.repeats,
            "tau": {name: 1 + float(v.mean()) for name, v in per_rule.items()},
            f"accepted ratio {rules[1]}/{rules[0]}": float(other.mean() / base.mean()),
            "ratio 95%": [float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))],
        }
        print(method, json.dumps(results[method]), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"config": vars(args), "device": str(target.device),
                                                  "dtype": str(target.dtype), "results": results}, indent=1))


if __name__ == "__main__":
    main()
