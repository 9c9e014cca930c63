"""Choosing the tree budget: this machine's verification cost curve, and the budget it makes worth it.

A tree of B draft nodes costs t(B) / t(0) single-token steps to verify; on a 2-core CPU that
ratio jumps to ~1.6 at once and keeps rising (unlike a GPU, where it stays ~1 up to dozens of
nodes). `--budget auto` measures the curve once per target, dtype, device and thread count (bf16
and float32 curves differ several-fold on a CPU with AMX; cached as JSON),
then picks, at every step, the B that maximises expected tokens per unit of time:
    (1 + sum_{i <= B} P(node i accepted)) / cost(B),
where a best-first tree's nodes come best first and P(node) = exp(its cumulative drafter
log-prob), the drafter's own estimate that the target agrees with the node's whole path.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch

from ..errors import BlockdraftError
from ..target.loading import cache_dir
from ..target.precision import cache_key
from .tree import DraftTree

SIZES = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


def measure_cost_curve(target, sizes=SIZES, reps: int = 7, context: int = 128) -> dict[int, float]:
    """Time to verify a random tree of B draft nodes, relative to B = 0 (one token).

    Another process's load only ever adds time, so each size's fastest run is its estimate; the
    sizes are timed in turns (every size once per round), so that a burst of load hits all sizes
    alike; a larger tree never costs less than a smaller one (running maximum)."""
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(target.vocab_size, (context,), generator=g).tolist()
    target.prefill(prompt)
    trees = []
    for b in sizes:
        parents = [-1] + [int(torch.randint(i, (), generator=g)) for i in range(1, b + 1)]
        trees.append(DraftTree(torch.randint(target.vocab_size, (b + 1,), generator=g), torch.tensor(parents)))
    runs: list[list[float]] = [[] for _ in sizes]
    for rep in range(reps + 1):  # the first round warms up
        for i, tree in enumerate(trees):
            t0 = time.perf_counter()
            target.verify(tree)
            if rep:
                runs[i].append(time.perf_counter() - t0)
            target.commit([])  # drop the tree again: every run sees the same context
    times = np.maximum.accumulate([min(r) for r in runs])
    return {b: float(t / times[0]) for b, t in zip(sizes, times)}


def cost_curve_path(target) -> Path:
    """One cache file per target, dtype, device and thread count."""
    return cache_dir() / "cost" / f"{cache_key(target)}.json"


def cost_curve(target) -> dict[int, float]:
    """The cached curve for this target, dtype, device and thread count, measured on first use (~10 s)."""
    path = cost_curve_path(target)
    if path.is_file():
        return {int(k): v for k, v in json.loads(path.read_text()).items()}
    curve = measure_cost_curve(target)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(curve, indent=1))
    return curve


def best_budget(scores: list[float], curve: dict[int, float]) -> int:
    """The B (0 .. len(scores)) maximising (1 + sum of the B best node probabilities) / cost(B)."""
    sizes = np.array(sorted(curve))
    cost = np.interp(np.arange(len(scores) + 1), sizes, [curve[b] for b in sizes])
    gain = 1 + np.concatenate([[0.0], np.cumsum(np.exp(scores))])
    return int(np.argmax(gain / cost))


def node_budget(budget, curve: dict[int, float] | None) -> int:
    """How many nodes a best-first tree method builds: the curve's largest B under 'auto' (it then
    keeps only the best B, see `keep_best`), else the fixed `budget`, checked."""
    if curve is not None:
        budget = max(curve)
    if not isinstance(budget, int) or budget < 1:
        raise BlockdraftError(f"the tree budget must be a positive number of nodes or 'auto', got {budget}")
    return budget


def keep_best(tree: DraftTree, scores: list[float], curve: dict[int, float] | None) -> DraftTree:
    """A best-first tree as built (fixed budget), or under 'auto' its first best_budget() nodes."""
    return tree if curve is None else tree.truncate(best_budget(scores, curve) + 1)

