"""SpeculativeDecoder: the whole method in one loop. Draft a tree, verify it, accept a path, commit."""

from __future__ import annotations

import time
from typing import Callable

import torch

from ..drafters import DraftContext, Drafter
from ..drafters.ar import NoDrafter
from ..errors import BlockdraftError
from ..model import Target
from ..trees import DraftTree
from ..verify import Acceptor, SamplingParams, make_acceptor
from .pacer import Pacer
from .stats import GenerationResult, GenerationStats
from .stopping import Stopper


class SpeculativeDecoder:
    """Batch-size-1 speculative decoding of `target` with proposals from `drafter`.

    With the greedy or a lossless sampling acceptor the output is exactly what plain
    decoding of the target would produce (greedy) or is distributed exactly like it (T > 0).
    With `pace=True` a Pacer replaces drafting by plain one-token steps while they are measured
    faster (long contexts); the output does not change, only the time it takes.
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
        if not isinstance(max_new_tokens, int) or max_new_tokens <= 0:
            raise BlockdraftError(f"max_new_tokens must be a positive integer, got {max_new_tokens}")
        prompt_ids = [int(t) for t in prompt_ids]
        target = self.target
        target.check_prompt(prompt_ids)
        gen = torch.Generator()
        if seed is not None:
            gen.manual_seed(seed)
        else:
            gen.seed()
        decode = target.decode if target.tokenizer is not None else None
        stopper = Stopper(target.eos_token_ids, tuple(stop_strings) + target.stop_strings, decode)
        stats = GenerationStats(method=self.drafter.name)

        t_start = time.perf_counter()
        target.feature_layers = self.drafter.feature_layers  # hidden states the drafter reads, if any
        features = target.prefill(prompt_ids[:-1])  # the first propose() receives the prompt's features
        self.drafter.reset(prompt_ids)
        stats.prefill_s = time.perf_counter() - t_start

        tokens, new, verified = list(prompt_ids), [], None
        keep_chars = None
        pacer = Pacer() if self.pace else None
        while True:
            # Each step emits accepted drafts + 1 bonus token: drafts deeper than this are wasted.
            max_depth = min(max_new_tokens - len(new), target.max_length - len(tokens)) - 1
            if max_depth < 0:
                stats.stop_reason = "length"
                break

            t0 = time.perf_counter()
            ctx = DraftContext(tokens, features, max_depth, verified, self.acceptor.params.temperature, gen)
            drafting = pacer is None or pacer.should_draft(len(tokens))
            if drafting:
                tree = self.drafter.propose(ctx)
                tree = tree.truncate(self.max_nodes or len(tree), max_depth)
            else:  # a plain step: the drafter takes in the context it would have drafted from
                self.drafter.observe(ctx)
                tree = DraftTree.root_only(tokens[-1])
            t1 = time.perf_counter()
            out = target.verify(tree)
            acc = self.acceptor.accept(tree, out.logits, gen)
            target.commit(acc.path)
            t2 = time.perf_counter()
            stats.draft_s += t1 - t0
            stats.verify_s += t2 - t1
            stats.target_calls += 1
            stats.plain_steps += not drafting
            stats.tree_nodes += len(tree)
            stats.accepted_hist[acc.accepted_drafts] += 1

            verified = (tree, out.logits)
            emitted = tree.tokens[acc.path[1:]].tolist() + [acc.bonus]
            if pacer is not None:
                pacer.record(drafting, t2 - t0, len(emitted), len(tokens))
            features = out.features[acc.path] if out.features is not None else None
            emitted, hit_eos = stopper.cut_eos(emitted)
            n_before = len(new)
            new += emitted
            tokens += emitted
            stop = stopper.find_stop_string(new, n_before)
            if stop is not None:
                n_keep, keep_chars = stop
                emitted = emitted[: max(0, n_keep - n_before)]
                del new[n_keep:]
            if on_tokens is not None and emitted:
                on_tokens(emitted)
            if hit_eos or stop is not None:
                stats.stop_reason = "eos" if stop is None else "stop_string"
                break

        stats.total_s = time.perf_counter() - t_start
        stats.new_tokens = len(new)
        text = decode(new) if decode is not None else ""
        if keep_chars is not None:
            text = text[:keep_chars]
        return GenerationResult(new, text, stats)
