"""Hybrid drafting: one tree under one budget, its branches from several sources, ranked by calibrated acceptance.

Suffix matches (the request, earlier outputs), REST's datastore and a learned best-first tree
(treeflash, hydra) are each strong somewhere else: copies, common phrasings, free text. Each
source proposes a trie with its own estimate of how likely each node is to follow its parent
(a match's continuation frequency, a drafter's probability). Those estimates are not comparable
across sources, so each is calibrated online: for every node whose parent the target accepted,
the drafter records whether the node was accepted too, binned by source, raw estimate and match
length. A node's score is then the calibrated probability that the target accepts its whole
path; the union of the sources' tries is merged, nodes taken best first, and under the machine's
verification cost curve only as many as pay for their cost (possibly none).

The learned drafter costs time every step it runs (a fifth of a step or so), so it runs
only where it pays (`LearnedGate`): per bin of what the retrieval sources alone expect, the gate
keeps how many accepted tokens the learned drafter's nodes added, and runs it when that gain beats
its measured share of the step's time (BENCHMARKS.md, "Decisions": hybrid gate). When the
retrieval sources alone already expect `skip` or more accepted tokens it is not run either. A
skipped learned drafter only takes in the step's target features, so copying stretches draft at
retrieval cost.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass, field

from ..errors import BlockdraftError
from ..trees import DraftTree
from ..trees.budget import CostCurve, best_budget
from .base import DraftContext, Drafter

# 31 draft nodes + the root fill two of the AMX kernels' 16-row tiles, so nodes 25-31 are nearly free
# (trees/budget.py) and 31 beat 24 (BENCHMARKS.md, "Decisions": hybrid budget). The cost-aware cut still decides how
# many of them are sent.
BUDGET = 31


class AcceptanceCalibrator:
    """P(node accepted | parent accepted) per (source, raw-estimate bin, match-length bin), learnt online.

    Each bin starts at the raw estimate, worth PRIOR observations, and follows what the target does."""

    BINS, PRIOR = 10, 4.0
    LENGTHS = (0, 1, 2, 4, 8, 16)  # match-length bin edges (0: a learned source, no match)

    def __init__(self):
        self.clear()

    def clear(self) -> None:
        self.accepted = defaultdict(float)
        self.seen = defaultdict(float)

    def key(self, source: str, estimate: float, match_length: int) -> tuple:
        length_bin = sum(match_length >= edge for edge in self.LENGTHS[1:])
        return source, min(int(estimate * self.BINS), self.BINS - 1), length_bin

    def estimate(self, key: tuple, raw: float) -> float:
        return (self.accepted[key] + self.PRIOR * raw) / (self.seen[key] + self.PRIOR)

    def update(self, key: tuple, accepted: bool) -> None:
        self.accepted[key] += accepted
        self.seen[key] += 1


class LearnedGate:
    """Should the learned drafter run this step? Learnt online, in accepted tokens per unit of time.

    Per bin of `expected` (the tokens the retrieval sources alone expect to get accepted), steps where the
    learned drafter ran record `retrieved` (accepted tokens along nodes some retrieval source proposed too)
    and `gain` (accepted tokens past them, which only the learned drafter proposed). Running it costs
    `learned_s` on top of a step of `rest_s` (drafting by the other sources and verification), so it pays when
        (1 + retrieved + gain) / (rest_s + learned_s) > (1 + retrieved) / rest_s,
    i.e. gain > (1 + retrieved) * learned_s / rest_s. The two are timed apart: a step's whole time mixes steps
    with and without the drafter, and a drafter dearer than the average step must still be weighed (it was once
    treated as unmeasured, and so never gated off). Each bin starts as if the drafter paid (PRIOR_GAIN over PRIOR
    steps), and a bin that stopped paying is retried every EXPLORE-th step, so that its estimate follows the
    text."""

    EDGES = (0.05, 0.25, 0.5, 1.0, 2.0, 4.0)
    PRIOR, PRIOR_GAIN, EXPLORE = 4.0, 1.0, 8

    def __init__(self):
        self.clear()

    def clear(self) -> None:
        self.steps = defaultdict(float)
        self.gain = defaultdict(float)
        self.retrieved = defaultdict(float)
        self.skipped = defaultdict(int)
        self.learned_s = self.rest_s = None  # moving averages (seconds)

    def bin(self, expected: float) -> int:
        return sum(expected >= edge for edge in self.EDGES)

    def should_run(self, expected: float) -> bool:
        b = self.bin(expected)
        n = self.steps[b] + self.PRIOR
        gain = (self.gain[b] + self.PRIOR * self.PRIOR_GAIN) / n
        retrieved = self.retrieved[b] / n
        if self.learned_s is None or not self.rest_s:
            return True  # nothing measured yet
        if gain > (1 + retrieved) * self.learned_s / self.rest_s:
            return True
        self.skipped[b] += 1
        return self.skipped[b] % self.EXPLORE == 0

    def record(self, expected: float, retrieved: int, gain: int) -> None:
        b = self.bin(expected)
        self.steps[b] += 1
        self.retrieved[b] += retrieved
        self.gain[b] += gain

    def time(self, learned_s: float | None = None, rest_s: float | None = None) -> None:
        average = lambda old, new: new if old is None else 0.9 * old + 0.1 * new  # noqa: E731
        if learned_s is not None:
            self.learned_s = average(self.learned_s, learned_s)
        if rest_s is not None:
            self.rest_s = average(self.rest_s, rest_s)


@dataclass
class Proposal:
    """One source's trie: parents precede children; cond[i] = raw P(node i | its parent)."""

    source: str
    tokens: list[int]
    parents: list[int]
    cond: list[float]
    match_length: int = 0
    keys: list = field(default_factory=list)  # each node's calibration bin (set by HybridDrafter._score)
    score: list = field(default_factory=list)  # each node's calibrated path probability


@dataclass
class _Node:
    score: float = 0.0
    keys: list = field(default_factory=list)


def retrieval_proposal(source: str, cand) -> Proposal:
    """A Candidates trie (prob = share of occurrences) -> conditional probabilities per node."""
    cond = [p / (cand.prob[par] if par >= 0 else 1.0) for p, par in zip(cand.prob, cand.parents, strict=True)]
    return Proposal(source, cand.tokens, cand.parents, cond, cand.match_length)


def learned_proposal(source: str, tree: DraftTree, scores: list[float]) -> Proposal:
    """A best-first tree with cumulative log-probs (node i+1 <-> scores[i]) -> conditionals."""
    parents = [int(p) - 1 for p in tree.parents[1:].tolist()]
    cond = [math.exp(s - (scores[p] if p >= 0 else 0.0)) for s, p in zip(scores, parents, strict=True)]
    return Proposal(source, tree.tokens[1:].tolist(), parents, cond)


class HybridDrafter(Drafter):
    """Merge training-free sources (SuffixDrafter, RestDrafter, RecycleDrafter) and one learned drafter
    (TreeFlashDrafter)."""

    name = "hybrid"

    def __init__(self, retrieval: dict[str, Drafter], learned: tuple[str, Drafter] | None = None, budget: int = BUDGET,
                 cost_curve: CostCurve | dict[int, float] | None = None, skip: float = 4.0,
                 weights: dict[str, float] | None = None, gate: bool = True):
        if not retrieval and learned is None:
            raise BlockdraftError("hybrid needs at least one source")
        if budget < 1:
            raise BlockdraftError(f"hybrid needs budget >= 1, got {budget}")
        self.retrieval, self.learned = retrieval, learned
        self.budget, self.cost_curve, self.skip = budget, CostCurve.of(cost_curve), skip
        self.weights = weights or {}
        self.calibrator = AcceptanceCalibrator()
        self.gate = LearnedGate() if gate and learned else None
        self.feature_layers = learned[1].feature_layers if learned else ()
        self.single_sequence = bool(learned and learned[1].single_sequence)
        self.learned_runs = self.steps = 0  # how often the learned drafter ran (for the report)
        self._last = None
        self._ran = None  # this step's retrieval expectation when the learned drafter ran (for the gate)
        self._step_started = None
        self._learned_s = 0.0  # the learned drafter's time in this step

    def fork(self) -> "HybridDrafter":
        """Its sources forked; the acceptance calibration and the gate's measurements stay shared (learnt
        across generations on purpose)."""
        twin = super().fork()
        twin.retrieval = {name: source.fork() for name, source in self.retrieval.items()}
        twin.learned = (self.learned[0], self.learned[1].fork()) if self.learned else None
        return twin

    def reset(self, prompt_ids) -> None:
        for source in self.retrieval.values():
            source.reset(prompt_ids)
        if self.learned:
            self.learned[1].reset(prompt_ids)
        self._last = self._ran = self._step_started = None

    def observe(self, ctx: DraftContext) -> None:
        for source in self.retrieval.values():
            source.observe(ctx)
        if self.learned:
            self.learned[1].observe(ctx)

    def forget(self) -> None:
        for source in self.retrieval.values():
            source.forget()
        self.calibrator.clear()  # in place: the forks share the calibration and the gate
        if self.gate is not None:
            self.gate.clear()

    def on_step(self, tree: DraftTree, logits, path: list[int]) -> None:
        for source in self.retrieval.values():
            source.on_step(tree, logits, path)
        if self.learned:
            self.learned[1].on_step(tree, logits, path)
        self._learn(tree.tokens[path[1:]].tolist())

    def on_finish(self, prompt_ids, output) -> None:
        for source in self.retrieval.values():
            source.on_finish(prompt_ids, output)
        if self.learned:
            self.learned[1].on_finish(prompt_ids, output)

    def proposals(self, ctx: DraftContext, depth: int) -> list[Proposal]:
        found = []
        for name, source in self.retrieval.items():  # each source's tries, each part calibrated apart
            for part, cand in source.retrieve(ctx, min(source.depth, depth)):
                found.append(retrieval_proposal(name if part is None else f"{name}-{part}", cand))
        for p in found:
            self._score(p)
        expected = max((sum(p.score) for p in found), default=0.0)  # accepted tokens, each source alone
        if self.learned:
            name, drafter = self.learned
            if expected >= self.skip or (self.gate is not None and not self.gate.should_run(expected)):
                drafter.observe(ctx)  # keep its context in step, draft nothing
            else:
                self.learned_runs += 1
                t0 = time.perf_counter()
                tree, scores = drafter.scored_tree(ctx)
                self._learned_s = time.perf_counter() - t0
                if self.gate is not None:
                    self.gate.time(learned_s=self._learned_s)
                self._ran = expected
                found.append(self._score(learned_proposal(name, tree, scores)))
        return found

    def _score(self, p: Proposal) -> Proposal:
        """Each node's calibration bin and calibrated probability that the target accepts its whole path."""
        p.keys = [self.calibrator.key(p.source, c, p.match_length) for c in p.cond]
        p.score = []
        for key, par, c in zip(p.keys, p.parents, p.cond, strict=True):
            p.score.append((p.score[par] if par >= 0 else 1.0) * self.calibrator.estimate(key, c))
        return p

    def propose(self, ctx: DraftContext) -> DraftTree:
        now = time.perf_counter()
        if self.gate is not None and self._step_started is not None:  # the last step, less the learned drafter
            self.gate.time(rest_s=now - self._step_started - self._learned_s)
        self._step_started, self._learned_s = now, 0.0
        self._ran = None
        self.steps += 1
        root = ctx.tokens[-1]
        depth = ctx.max_depth
        if depth <= 0:
            if self.learned:
                self.learned[1].observe(ctx)
            return DraftTree.root_only(root)
        nodes: dict[tuple, _Node] = {}
        for p in self.proposals(ctx, depth):
            paths: list[tuple] = []
            weight = self.weights.get(p.source.removesuffix("-global"), 1.0)
            for tok, par, key, score in zip(p.tokens, p.parents, p.keys, p.score, strict=True):
                path = (paths[par] if par >= 0 else ()) + (tok,)
                paths.append(path)
                if len(path) > depth:
                    continue
                node = nodes.setdefault(path, _Node())
                node.score = max(node.score, weight * score)
                node.keys.append(key)
        # A child never scores above its parent, and ties go to the shorter path: parents come first.
        ranked = sorted(nodes.items(), key=lambda kv: (-kv[1].score, len(kv[0])))[: self.budget]
        if self.cost_curve is not None:
            ranked = ranked[: best_budget([math.log(max(n.score, 1e-9)) for _, n in ranked],
                                         self.cost_curve.at(len(ctx.tokens)))]
        index = {(): 0}
        tokens, parents, keys = [root], [-1], [[]]
        for path, node in ranked:
            index[path] = len(tokens)
            tokens.append(path[-1])
            parents.append(index[path[:-1]])
            keys.append(node.keys)
        tree = DraftTree(tokens, parents)
        self._last = (tree, keys)
        return tree

    def _learn(self, returned: list[int]) -> None:
        """For every node whose parent was accepted: was it accepted too? (read off the accepted draft tokens:
        the verified tree may be this one cut to the decoder's row cap)"""
        if self._last is None:
            return
        tree, keys = self._last
        self._last = None
        node, retrieved, accepted = 0, 0, 0
        learned = self.learned[0] if self.learned else None
        for d in range(len(returned) + 1):
            nxt = returned[d] if d < len(returned) else None
            accepted_child = None
            for child in tree.children[node]:
                ok = nxt is not None and accepted_child is None and int(tree.tokens[child]) == nxt
                accepted_child = child if ok else accepted_child
                for key in keys[child]:
                    self.calibrator.update(key, ok)
            if accepted_child is None:
                break
            node = accepted_child
            accepted += 1
            if retrieved == accepted - 1 and any(key[0] != learned for key in keys[node]):
                retrieved = accepted  # still on a path some retrieval source proposed too
        if self._ran is not None and self.gate is not None:
            self.gate.record(self._ran, retrieved, accepted - retrieved)
