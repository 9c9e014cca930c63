"""Choosing the tree budget: this machine's verification cost curve, and the budget it makes worth it.

A tree of B draft nodes costs t(B) / t(0) single-token steps to verify; on a 2-core CPU that
ratio jumps to ~1.6 at once and keeps rising (unlike a GPU, where it stays ~1 up to dozens of
nodes). `--budget auto` measures the curve once per target, dtype, device and thread count (bf16
and float32 curves differ several-fold on a CPU with AMX; cached as JSON), at a few context
lengths: every tree node attends to the whole context, so the same tree costs more steps' worth
at 4,000 tokens than at 128 (a 16-node tree in bf16 here: 1.5 vs 1.2 steps). Then, at every step, it picks
for the current context length the B that maximises expected tokens per unit of time:
    (1 + sum_{i <= B} P(node i accepted)) / cost(B),
where a best-first tree's nodes come best first and P(node) = exp(its cumulative drafter
log-prob), the drafter's own estimate that the target agrees with the node's whole path.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from ..errors import BlockdraftError
from ..model.loading import cache_dir
from ..model.precision import cache_key
from .tree import DraftTree

# Sizes the curve is measured at, including both sides of each step: oneDNN's AMX kernels take rows in tiles of
# 16, so a tree of 15 draft nodes (16 rows with the root) costs little more than one of 12, and one of 16 costs a
# tile more (here 1.17 against 1.26 one-token steps). Interpolated from 12 to 16, nodes 13-15 were priced at the
# step's full cost.
SIZES = (0, 1, 2, 3, 4, 6, 8, 12, 15, 16, 24, 31, 32, 48, 63, 64)
CONTEXTS = (128, 1024, 4096)  # context lengths the curve is measured at (those the target can hold)


@dataclass
class CostCurve:
    """t(B) / t(0) per context length: {context: {B: cost}}; between measured lengths it is interpolated,
    beyond them the nearest one holds. A plain {B: cost} dict is a curve that ignores the context."""

    by_context: dict[int, dict[int, float]]

    def __post_init__(self):
        # read at every step (`at`): the lengths, the sizes every length has and their costs, as arrays once
        self._lengths = sorted(self.by_context)
        self._sizes = sorted(set.intersection(*(set(c) for c in self.by_context.values())))
        self._costs = np.array([[self.by_context[n][b] for n in self._lengths] for b in self._sizes])

    @classmethod
    def of(cls, curve: "CostCurve | dict[int, float] | None") -> "CostCurve | None":
        return curve if curve is None or isinstance(curve, CostCurve) else cls({0: dict(curve)})

    @property
    def max_nodes(self) -> int:
        return min(max(c) for c in self.by_context.values())

    def at(self, context: int) -> dict[int, float]:
        rows = zip(self._sizes, self._costs, strict=True)
        return {b: float(np.interp(context, self._lengths, row)) for b, row in rows}


def measure_cost_curve(target, sizes=SIZES, reps: int = 7, contexts=CONTEXTS) -> CostCurve:
    """The curve at each context length the target can hold with the largest tree (at least the shortest)."""
    room = target.max_length - max(sizes) - 2
    fitting = [n for n in contexts if n <= room] or [min(min(contexts), room)]
    bar = tqdm(fitting, desc="measuring the verification cost curve (once; cached)", unit="context", leave=False)
    return CostCurve({n: measure_cost_at(target, sizes, reps, n) for n in bar})


def measure_cost_at(target, sizes=SIZES, reps: int = 7, context: int = 128) -> dict[int, float]:
    """Time to verify a random tree of B draft nodes after `context` tokens, relative to B = 0 (one token).

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
    return {b: float(t / times[0]) for b, t in zip(sizes, times, strict=True)}


def cost_curve_path(target) -> Path:
    """One cache file per target, dtype, device and thread count."""
    return cache_dir() / "cost" / f"{cache_key(target)}.json"


def cost_curve(target) -> CostCurve:
    """The cached curve for this target, dtype, device and thread count, measured on first use (~40 s here).
    A file measured at other sizes (or without context lengths) is measured again."""
    path = cost_curve_path(target)
    if path.is_file():
        saved = json.loads(path.read_text())
        if "by_context" in saved and saved.get("sizes") == list(SIZES):
            return CostCurve({int(n): {int(b): v for b, v in c.items()} for n, c in saved["by_context"].items()})
    curve = measure_cost_curve(target)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"sizes": list(SIZES), "by_context": curve.by_context}, indent=1))
    return curve


def best_budget(scores: list[float], curve: dict[int, float]) -> int:
    """The B (0 .. len(scores)) maximising (1 + sum of the B best node probabilities) / cost(B)."""
    sizes = np.array(sorted(curve))
    cost = np.interp(np.arange(len(scores) + 1), sizes, [curve[b] for b in sizes])
    gain = 1 + np.concatenate([[0.0], np.cumsum(np.exp(scores))])
    return int(np.argmax(gain / cost))


def node_budget(budget, curve: CostCurve | None) -> int:
    """How many nodes a best-first tree method builds: the curve's largest B under 'auto' (it then
    keeps only the best B, see `keep_best`), else the fixed `budget`, checked."""
    if curve is not None:
        budget = curve.max_nodes
    if not isinstance(budget, int) or budget < 1:
        raise BlockdraftError(f"the tree budget must be a positive number of nodes or 'auto', got {budget}")
    return budget


def keep_best(tree: DraftTree, scores: list[float], curve: CostCurve | None, context: int) -> DraftTree:
    """A best-first tree as built (fixed budget), or under 'auto' its first best_budget() nodes at this context."""
    return tree if curve is None else tree.truncate(best_budget(scores, curve.at(context)) + 1)
