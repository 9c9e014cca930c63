"""Prompt lookup decoding: draft the continuation of an earlier occurrence of the last n-gram."""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..errors import BlockdraftError
from ..trees import DraftTree
from .base import DraftContext, Drafter


class PromptLookupDrafter(Drafter):
    """Training-free drafter (Saxena 2023), strong when the output copies the input.

    The last n tokens (n from `max_ngram` down to `min_ngram`) are searched for in the prompt
    and the output so far; the `num_tokens` tokens that followed a match are the draft. With
    `max_branches` > 1, the continuations of several matches (most recent first, distinct)
    are merged into a small trie and verified together.

    min_ngram defaults to 2: on a CPU, verifying any draft costs clearly more than a single-token
    step, and one-token matches are accepted too rarely to pay for it; max_ngram=4 or
    max_branches=3 were within noise of the defaults. Tuned on held-out ShareGPT prompts, never on
    Spec-Bench (BENCHMARKS.md, "Decisions": lookup).

    `min_gain` > 0 makes drafting cost-aware: the drafter learns, per n-gram length, how many
    of its draft tokens the target accepted (a running mean, read off the tokens that come
    back), and stops drafting on matches whose expected gain is below `min_gain` tokens, since
    such drafts cost more verification time than they save. The estimate drifts back towards
    its optimistic start while not drafting, so a match length that turns useful is retried.
    0 switches it off. The threshold follows what a draft costs: tuned to 0.4 with float32
    verification, it came down to 0.2 with bf16 (the default here), where a draft costs less
    (BENCHMARKS.md, "Decisions": lookup).
    """

    name = "lookup"
    PRIOR, RATE, RECOVERY = 1.0, 0.3, 0.05

    def __init__(self, max_ngram: int = 3, min_ngram: int = 2, num_tokens: int = 10, max_branches: int = 1,
                 min_gain: float = 0.2):
        if not 1 <= min_ngram <= max_ngram:
            raise BlockdraftError(f"lookup needs 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        if num_tokens < 1 or max_branches < 1:
            raise BlockdraftError("lookup needs num_tokens >= 1 and max_branches >= 1")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.num_tokens, self.max_branches = num_tokens, max_branches
        self.min_gain = min_gain
        self.reset([])

    def reset(self, prompt_ids) -> None:
        self.gain = {n: self.PRIOR for n in range(self.min_ngram, self.max_ngram + 1)}
        self._last = None  # (tree, length of the context it was drafted for, n-gram length)

    def propose(self, ctx: DraftContext) -> DraftTree:
        root = ctx.tokens[-1]
        self._learn(ctx.tokens)
        k = min(self.num_tokens, ctx.max_depth)
        if k <= 0:
            return DraftTree.root_only(root)
        n, paths = self._match(np.asarray(ctx.tokens), k)
        if not paths:
            return DraftTree.root_only(root)
        if self.min_gain > 0 and self.gain[n] < self.min_gain:
            self.gain[n] += self.RECOVERY * (self.PRIOR - self.gain[n])
            return DraftTree.root_only(root)
        tree = DraftTree.from_paths(root, paths)
        self._last = (tree, len(ctx.tokens), n)
        return tree

    def _match(self, seq: np.ndarray, k: int) -> tuple[int, list[list[int]]]:
        """The longest n-gram with earlier occurrences, and up to max_branches continuations."""
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if len(seq) <= n:
                continue
            # Windows over seq[:-1] so the final n-gram does not match itself.
            windows = sliding_window_view(seq[:-1], n)
            starts = np.flatnonzero((windows == seq[-n:]).all(axis=1))
            paths: list[list[int]] = []
            for s in starts[::-1]:  # the most recent occurrence is the best predictor
                cont = seq[s + n : s + n + k].tolist()
                if cont and cont not in paths:
                    paths.append(cont)
                    if len(paths) == self.max_branches:
                        break
            if paths:
                return n, paths
        return 0, []

    def _learn(self, tokens: list[int]) -> None:
        """Count how many tokens of the last draft were accepted: walk it with what came back."""
        if self._last is None:
            return
        tree, start, n = self._last
        self._last = None
        node, accepted = 0, 0
        for tok in tokens[start:-1]:  # the final token is the target's bonus, never a draft
            child = next((c for c in tree.children[node] if int(tree.tokens[c]) == tok), None)
            if child is None:
                break
            node, accepted = child, accepted + 1
        self.gain[n] += self.RATE * (accepted - self.gain[n])
