"""REST: retrieval-based speculative decoding from a datastore of token sequences.

He et al., "REST: Retrieval-Based Speculative Decoding". The datastore is a corpus of token ids
(ShareGPT conversations in the target's chat template, see train/datastore.py) with a suffix
array. Each step, the longest suffix of the context (up to 16 tokens) that occurs in it is found,
what followed its occurrences is merged into a trie counted per node, and the most frequent nodes
under the budget are verified as one tree.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from ..errors import BlockdraftError
from ..trees import DraftTree
from .base import DraftContext, Drafter
from .suffix import candidates_tree
from .suffix_index import Candidates, SuffixIndex

KIND = "datastore"


class Datastore(SuffixIndex):
    """A SuffixIndex saved as numpy arrays (tokens.npy, suffix_array.npy) + config.json, never pickle."""

    def save(self, folder, target, extra: dict | None = None) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        np.save(folder / "tokens.npy", self.tokens)
        np.save(folder / "suffix_array.npy", self.sa)
        config = {"kind": KIND, "separator": self.separator, "tokens": len(self.tokens),
                  "target": {"name": target.name, "vocab_size": target.vocab_size}, **(extra or {})}
        (folder / "config.json").write_text(json.dumps(config, indent=1))

    @classmethod
    def load(cls, folder, target=None) -> "Datastore":
        folder = Path(folder)
        try:
            config = json.loads((folder / "config.json").read_text())
            if config.get("kind") != KIND:
                raise BlockdraftError(f"'{folder}' holds a '{config.get('kind')}' checkpoint, not a datastore")
            tokens = np.load(folder / "tokens.npy", mmap_mode="r", allow_pickle=False)
            sa = np.load(folder / "suffix_array.npy", allow_pickle=False)
        except (OSError, ValueError, json.JSONDecodeError) as e:
            raise BlockdraftError(f"'{folder}' is not a readable datastore ({e}): rebuild it with "
                                  "`blockdraft train --drafter datastore --out DIR`") from None
        if len(tokens) != config["tokens"] or len(sa) != len(tokens):
            raise BlockdraftError(f"the datastore '{folder}' is corrupt: its arrays do not match config.json")
        recorded = config.get("target", {})
        if target is not None and (recorded.get("name"), recorded.get("vocab_size")) != (
                target.name, target.vocab_size):
            raise BlockdraftError(f"the datastore '{folder}' was built for target '{recorded.get('name')}' "
                                  f"(vocabulary {recorded.get('vocab_size')}), not for '{target.name}' "
                                  f"(vocabulary {target.vocab_size})")
        return cls(np.asarray(tokens), int(config["separator"]), suffix_array=sa)


class RestDrafter(Drafter):
    """Longest-suffix retrieval from a datastore, continuations merged into a frequency trie.

    budget: draft nodes; depth: longest continuation; max_match: longest suffix searched (REST: 16);
    occurrences: how many occurrences of the match are read; min_prob: drop rarer nodes;
    min_match: shorter matches draft nothing (a one-token match predicts little and costs a pass).
    """

    name = "rest"

    def __init__(self, datastore: Datastore, budget: int = 16, depth: int = 8, max_match: int = 16,
                 occurrences: int = 64, min_prob: float = 0.05, min_match: int = 2):
        if budget < 1 or depth < 1 or max_match < 1 or occurrences < 1:
            raise BlockdraftError("rest needs budget, depth, max_match and occurrences >= 1")
        self.store = datastore
        self.budget, self.depth, self.max_match = budget, depth, max_match
        self.occurrences, self.min_prob, self.min_match = occurrences, min_prob, min_match
        self.query_s, self.queries = 0.0, 0  # query time, for the report

    def candidates(self, ctx: DraftContext, depth: int) -> Candidates:
        t0 = time.perf_counter()
        cand = self.store.candidates(ctx.tokens, self.max_match, depth, self.occurrences, self.min_prob, self.budget)
        self.query_s += time.perf_counter() - t0
        self.queries += 1
        return cand

    def propose(self, ctx: DraftContext) -> DraftTree:
        root = ctx.tokens[-1]
        depth = min(self.depth, ctx.max_depth)
        if depth <= 0:
            return DraftTree.root_only(root)
        cand = self.candidates(ctx, depth)
        if cand.match_length < self.min_match:
            return DraftTree.root_only(root)
        return candidates_tree(root, cand)
