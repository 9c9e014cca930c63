"""The drafter protocol: propose a DraftTree rooted at the last accepted token."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from ..trees import DraftTree


@dataclass
class DraftContext:
    """What a drafter may look at before a step."""

    tokens: list[int]  # prompt + output so far; tokens[-1] is the root, not yet seen by the target
    # Target features [m, F] of the tokens committed since the previous propose(): the accepted path of
    # the last step, or on the first step the prompt minus its last token. None if the drafter reads none.
    features: torch.Tensor | None
    max_depth: int  # drafts deeper than this would be cut (token budget or context end)
    # The decoder's sampling temperature (0: greedy) and its generator: a drafter in sampling mode draws
    # its drafts with them and reports their distributions in DraftTree.q (trees/sampled.py).
    temperature: float = 0.0
    generator: torch.Generator | None = None


class Drafter:
    """Base class. A drafter proposes; it never decides what is accepted.

    `feature_layers` names the target layers whose hidden states the drafter reads; the
    target returns them with every verification pass at no extra call.

    Feedback comes through one hook pair, called by the shared per-sequence code (decoding/sequence.py) in
    single and batch decoding alike (as transformers' `update_candidate_strategy`): `on_step` after every
    verification pass, `on_finish` once a generation ends. What a drafter learns across requests (earlier
    outputs, the target's recent top-k, acceptance calibration) lives in one object its forks share,
    created by its constructor and cleared in place by `forget`.
    """

    name = "base"
    feature_layers: tuple[int, ...] = ()
    # drafts through the target's single-sequence engine (drafters/quantized.py): the batch decoder cannot run it
    single_sequence = False
    # the attributes that hold drafters this one wraps (a tree's base): fork() forks them too
    wraps: tuple[str, ...] = ()

    def fork(self) -> "Drafter":
        """This drafter for another sequence of a batch: the same weights and settings, its own per-sequence state.

        The contract that makes a shallow copy enough: a drafter keeps its per-sequence state in attributes
        that `reset` (or `propose`) assigns anew, never in objects it mutates in place; weights and settings are
        shared. What it wraps is declared in `wraps` and forked with it. A drafter that learns across
        generations in place (the hybrid's acceptance calibration) shares that learning with its forks."""
        twin = copy.copy(self)
        for attribute in self.wraps:
            setattr(twin, attribute, getattr(self, attribute).fork())
        return twin

    def reset(self, prompt_ids: list[int]) -> None:
        """Called once per generation, after the target's prefill of prompt_ids[:-1]."""

    def on_step(self, tree: DraftTree, logits: torch.Tensor, path: list[int]) -> None:
        """A verification pass is done: the target's logits [n, V] (its dtype, CPU) at every node of `tree`,
        and the node indices it accepted (root first). Drafters that learn online override it; by default it
        reaches the drafters this one wraps."""
        for attribute in self.wraps:
            getattr(self, attribute).on_step(tree, logits, path)

    def on_finish(self, prompt_ids: list[int], output: list[int]) -> None:
        """A generation has ended with `output` (the tokens returned to the caller)."""
        for attribute in self.wraps:
            getattr(self, attribute).on_finish(prompt_ids, output)

    def propose(self, ctx: DraftContext) -> DraftTree:
        raise NotImplementedError

    def retrieve(self, ctx: DraftContext, depth: int) -> list:
        """A retrieval source's candidates for `hybrid` (methods.py: hybrid="retrieval"): [(part, Candidates)], each
        part calibrated apart (drafters/hybrid.py), None for the source's main trie. By default one trie,
        `candidates(ctx, depth)`."""
        return [(None, self.candidates(ctx, depth))]

    def observe(self, ctx: DraftContext) -> None:
        """Take in a step's context without drafting (a hybrid that skips this drafter for a step).
        Drafters that accumulate per-token state (the block drafter's context cache) override it."""

    def forget(self) -> None:
        """Drop what was learnt from earlier generations (the bench calls it after its warm-up), for this
        drafter and its forks."""
        for attribute in self.wraps:
            getattr(self, attribute).forget()


class LatticeDrafter(Drafter):
    """A drafter with a top-k lattice per step; on its own it proposes the chain of top-1 tokens.

    Trees (trees/drafter.py) and refiners (refine/drafter.py) wrap it and read `lattice()` instead.
    """

    def lattice(self, ctx: DraftContext):
        """This step's DraftLattice, or None when there is nothing to draft."""
        raise NotImplementedError

    def propose(self, ctx: DraftContext) -> DraftTree:
        lattice = self.lattice(ctx)
        if lattice is None:
            return DraftTree.root_only(ctx.tokens[-1])
        return DraftTree.chain(ctx.tokens[-1], lattice.best()[: ctx.max_depth])
