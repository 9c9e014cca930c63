"""SpeculativeDecoder: the whole method in one loop. Draft a tree, verify it, accept a path, commit."""

from __future__ import annotations

import time
from typing import Callable

from ..drafters import Drafter
from ..drafters.ar import NoDrafter
from ..model import Target
from ..verify import Acceptor, SamplingParams, make_acceptor
from .pacer import Pacer
from .sequence import Sequence
from .stats import GenerationResult


class SpeculativeDecoder:
    """Speculative decoding of one sequence of `target` (a batch of one) with proposals from `drafter`.

    With the greedy or a lossless sampling acceptor the output is exactly what plain
    decoding of the target would produce (greedy) or is distributed exactly like it (T > 0).
    With `pace=True` a Pacer replaces drafting by plain one-token steps while they are measured
    faster (long contexts); the output does not change, only the time it takes. The pacer is this
    loop's alone: it compares one sequence's step times, which in a batch are shared by every row.
    """

    def __init__(
        self,
        target: Target,
        drafter: Drafter,
        params: SamplingParams | None = None,
        acceptor: Acceptor | str | None = None,
        max_nodes: int | None = None,
        pace: bool = False,
    ):
        self.target, self.drafter = target, drafter
        self.params = params or SamplingParams()
        self.acceptor = acceptor if isinstance(acceptor, Acceptor) else make_acceptor(acceptor, self.params)
        self.max_nodes = max_nodes  # optional cap on tree size, root included
        self.pace = pace and not isinstance(drafter, NoDrafter)

    def generate(
        self,
        prompt_ids: list[int],
        max_new_tokens: int = 128,
        stop_strings: tuple[str, ...] = (),
        seed: int | None = None,
        on_tokens: Callable[[list[int]], None] | None = None,
    ) -> GenerationResult:
        target, drafter = self.target, self.drafter
        seq = Sequence.start(target, prompt_ids, drafter, acceptor=self.acceptor, max_new_tokens=max_new_tokens,
                             stop_strings=stop_strings, seed=seed,
                             on_tokens=(lambda ids, accepted: on_tokens(ids)) if on_tokens else None)
        target.feature_layers = drafter.feature_layers  # hidden states the drafter reads, if any
        seq.features = target.prefill(seq.prompt_ids[:-1])  # the first propose() receives the prompt's features
        drafter.reset(seq.prompt_ids)
        seq.stats.prefill_s = time.perf_counter() - seq.started

        pacer = Pacer() if self.pace else None
        while not seq.done:
            t0 = time.perf_counter()
            context = len(seq.tokens)
            drafting = pacer is None or pacer.should_draft(context)
            # 1. draft: a tree of guesses rooted at the last token (or, paced, the root alone: a plain step)
            tree = seq.draft(self.max_nodes) if drafting else seq.plain()
            # 2. verify: one target pass over every node, each attending to the context and its own ancestors
            t1 = time.perf_counter()
            out = target.verify(tree)
            # 3. accept the longest path the target agrees with (+ its own bonus token), 4. commit that path's
            # KV entries and drop the rest, 5. emit the tokens and apply the stopping rules (sequence.py)
            produced = seq.advance(tree, out.logits, out.features, target.commit, time.perf_counter() - t1)
            if pacer is not None:
                pacer.record(drafting, time.perf_counter() - t0, produced, context)
        return seq.result
