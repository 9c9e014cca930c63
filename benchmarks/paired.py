"""Paired comparison of two methods in one bench run: tau over all turns, per-turn wins, and a bootstrap 95%
interval of the tau gain over resampled turns. Usage: python benchmarks/paired.py RESULTS.json METHOD_A METHOD_B
(RESULTS.json,OTHER.json pools the turns of several runs of the same two methods, e.g. two held-out sets).
METHOD@RUN.json takes that method from another run of the same questions (greedy tau does not depend on timing), the
turns paired by question and turn: python benchmarks/paired.py NEW.json OLD_METHOD@OLD.json NEW_METHOD"""

import json
import random
import sys
from collections import defaultdict


def main(path: str, a: str, b: str, resamples: int = 2000) -> None:
    by_method = defaultdict(dict)
    if "@" in a or "@" in b:  # one run's method against another's: the same questions, keyed without the file
        for name in (a, b):
            method, _, file = name.partition("@")
            for r in json.load(open(file or path))["records"]:
                if r["method"] == method:
                    by_method[name][(r["question_id"], r["turn"])] = r
    else:
        for file in path.split(","):
            for r in json.load(open(file))["records"]:
                by_method[r["method"]][(file, r["question_id"], r["turn"])] = r
    turns = [t for t in by_method[a] if t in by_method[b]]

    def tau(method: str, sample: list) -> float:
        rows = [by_method[method][t] for t in sample]
        return sum(r["new_tokens"] for r in rows) / sum(r["target_calls"] for r in rows)

    per_turn = [tau(b, [t]) - tau(a, [t]) for t in turns]
    rng = random.Random(0)
    gains = sorted(tau(b, s) - tau(a, s) for s in ([rng.choice(turns) for _ in turns] for _ in range(resamples)))
    low, high = gains[int(0.025 * resamples)], gains[int(0.975 * resamples)]
    print(f"{len(turns)} turns: tau {tau(a, turns):.3f} -> {tau(b, turns):.3f} ({tau(b, turns) - tau(a, turns):+.3f}); "
          f"better on {sum(g > 0 for g in per_turn)}, worse on {sum(g < 0 for g in per_turn)}; "
          f"bootstrap 95% [{low:+.3f}, {high:+.3f}]")


if __name__ == "__main__":
    main(*sys.argv[1:4])
