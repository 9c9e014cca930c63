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

When the retrieval sources alone already expect `skip` or more accepted tokens, the learned
drafter is not run at all this step (it only takes in the step's target features), so copying
stretches draft at retrieval cost.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from ..errors import BlockdraftError
from ..trees import DraftTree
from ..trees.budget import CostCurve, best_budget
from .base import DraftContext, Drafter
from .suffix_index import Candidates


class AcceptanceCalibrator:
    """P(node accepted | parent accepted) per (source, raw-estimate bin, match-length bin), learnt online.

    Each bin starts at the raw estimate, worth PRIOR observations, and follows what the target does."""

    BINS, PRIOR = 10, 4.0
    LENGTHS = (0, 1, 2, 4, 8, 16)  # match-length bin edges (0: a learned source, no match)

    def __init__(self):
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
    cond = [p / (cand.prob[par] if par >= 0 else 1.0) for p, par in zip(cand.prob, cand.parents)]
    return Proposal(source, cand.tokens, cand.parents, cond, cand.match_length)


def learned_proposal(source: str, tree: DraftTree, scores: list[float]) -> Proposal:
    """A best-first tree with cumulative log-probs (node i+1 <-> scores[i]) -> conditionals."""
    parents = [int(p) - 1 for p in tree.parents[1:].tolist()]
    cond = [math.exp(s - (scores[p] if p >= 0 else 0.0)) for s, p in zip(scores, parents)]
    return Proposal(source, tree.tokens[1:].tolist(), parents, cond)


class HybridDrafter(Drafter):
    """Merge training-free sources (SuffixDrafter, RestDrafter, RecycleDrafter) and one learned drafter
    (TreeFlashDrafter)."""

    name = "hybrid"

    def __init__(self, retrieval: dict[str, Drafter], learned: tuple[str, Drafter] | None = None, budget: int = 24,
                 cost_curve: CostCurve | dict[int, float] | None = None, skip: float = 4.0,
                 weights: dict[str, float] | None = None):
        if not retrieval and learned is None:
            raise BlockdraftError("hybrid needs at least one source")
        if budget < 1:
            raise BlockdraftError(f"hybrid needs budget >= 1, got {budget}")
        self.retrieval, self.learned = retrieval, learned
        self.budget, self.cost_curve, self.skip = budget, CostCurve.of(cost_curve), skip
        self.weights = weights or {}
        self.calibrator = AcceptanceCalibrator()
        self.feature_layers = learned[1].feature_layers if learned else ()
        self.learned_runs = self.steps = 0  # how often the learned drafter ran (for the report)
        self._last = None

    def reset(self, prompt_ids) -> None:
        for source in self.retrieval.values():
            source.reset(prompt_ids)
        if self.learned:
            self.learned[1].reset(prompt_ids)
        self._last = None

    def observe(self, ctx: DraftContext) -> None:
        for source in self.retrieval.values():
            source.observe(ctx)
        if self.learned:
            self.learned[1].observe(ctx)

    def forget(self) -> None:
        for source in self.retrieval.values():
            source.forget()
        self.calibrator = AcceptanceCalibrator()

    def proposals(self, ctx: DraftContext, depth: int) -> list[Proposal]:
        found = []
        for name, source in self.retrieval.items():
            if name == "recycle":  # the target's own top-k from earlier passes
                source.recycle(ctx.verified)
                tokens, parents, probs = source.candidates(ctx.tokens[-1], min(source.depth, depth))
                found.append(retrieval_proposal(name, Candidates(tokens, parents, probs, 0)))
            elif name == "suffix":  # the request's own tokens and earlier outputs: calibrated apart
                for label, cand in zip(("suffix", "suffix-global"), source.sources(ctx, min(source.depth, depth))):
                    found.append(retrieval_proposal(label, cand))
            else:
                found.append(retrieval_proposal(name, source.candidates(ctx, min(source.depth, depth))))
        for p in found:
            self._score(p)
        expected = max((sum(p.score) for p in found), default=0.0)  # accepted tokens, each source alone
        if self.learned:
            name, drafter = self.learned
            if expected >= self.skip:
                drafter.observe(ctx)  # keep its context in step, draft nothing
            else:
                self.learned_runs += 1
                tree, scores = drafter.scored_tree(ctx)
                found.append(self._score(learned_proposal(name, tree, scores)))
        return found

    def _score(self, p: Proposal) -> Proposal:
        """Each node's calibration bin and calibrated probability that the target accepts its whole path."""
        p.keys = [self.calibrator.key(p.source, c, p.match_length) for c in p.cond]
        p.score = []
        for key, par, c in zip(p.keys, p.parents, p.cond):
            p.score.append((p.score[par] if par >= 0 else 1.0) * self.calibrator.estimate(key, c))
        return p

    def propose(self, ctx: DraftContext) -> DraftTree:
        self._learn(ctx.tokens)
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
            for tok, par, key, score in zip(p.tokens, p.parents, p.keys, p.score):
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
        self._last = (tree, keys, len(ctx.tokens))
        return tree

    def _learn(self, tokens: list[int]) -> None:
        """For every node whose parent was accepted: was it accepted too? (read off the tokens that came back)"""
        if self._last is None:
            return
        tree, keys, start = self._last
        self._last = None
        node = 0
        returned = tokens[start:-1]  # the final token is the target's bonus, never a draft
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
