"""One request's decoding state, and what follows each verification pass: accept -> commit -> stats -> stop."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..drafters import DraftContext, Drafter
from ..errors import BlockdraftError
from ..model import Target
from ..trees import DraftTree
from ..verify import Acceptor, SamplingParams, make_acceptor
from .stats import GenerationResult, GenerationStats
from .stopping import Stopper

# on_tokens(ids, accepted): a step's new tokens, each flagged True if it was a drafted token the target accepted,
# False for the target's own (bonus) token
TokenCallback = Callable[[list[int], list[bool]], None]


@dataclass(eq=False)  # a sequence is itself: finding it in a batch's lists compares identities, not fields
class Sequence:
    """Everything one request carries between steps, and the step's second half.

    Both loops share it: `SpeculativeDecoder` runs one sequence (a batch of one) on the target's own cache,
    `BatchDecoder` runs many whose trees share one verification forward. Either loop drafts (`draft`), runs the
    target over the tree, then hands the logits to `advance`, which accepts a path, has the loop commit it to its
    cache, counts the step, and applies the stopping rules; `result` is set once the sequence is done.
    """

    prompt_ids: list[int]
    max_new_tokens: int
    max_length: int  # the target's context: no step may run past it
    drafter: Drafter
    acceptor: Acceptor
    stopper: Stopper
    gen: torch.Generator
    on_tokens: TokenCallback | None
    stats: GenerationStats
    tokens: list[int] = field(default_factory=list)  # prompt + output; tokens[-1] is the next tree's root
    new: list[int] = field(default_factory=list)
    features: torch.Tensor | None = None  # features of the tokens committed since the last propose()
    keep_chars: int | None = None  # a stop string cuts the text inside a token: the characters kept
    started: float = 0.0
    result: GenerationResult | None = None

    @classmethod
    def start(cls, target: Target, prompt_ids: list[int], drafter: Drafter, params: SamplingParams | None = None,
              acceptor: Acceptor | str | None = None, max_new_tokens: int = 128, stop_strings: tuple[str, ...] = (),
              seed: int | None = None, on_tokens: TokenCallback | None = None, **extra) -> Sequence:
        """Check a request and set up its state (`extra`: fields of a subclass, e.g. the batch's tag)."""
        if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens <= 0:
            raise BlockdraftError(f"max_new_tokens must be a positive integer, got {max_new_tokens}")
        prompt_ids = [int(t) for t in prompt_ids]
        target.check_prompt(prompt_ids)
        if not isinstance(acceptor, Acceptor):
            acceptor = make_acceptor(acceptor, params or SamplingParams())
        gen = torch.Generator()
        gen.manual_seed(seed) if seed is not None else gen.seed()
        decode = target.decode if target.tokenizer is not None else None
        stopper = Stopper(target.eos_token_ids, tuple(stop_strings) + target.stop_strings, decode)
        return cls(prompt_ids, max_new_tokens, target.max_length, drafter, acceptor, stopper, gen, on_tokens,
                   GenerationStats(method=drafter.name), tokens=list(prompt_ids), started=time.perf_counter(),
                   **extra)

    @property
    def done(self) -> bool:
        return self.result is not None

    def room(self) -> int:
        """Draft depth the next step can use: each step emits accepted drafts + 1 bonus token."""
        return min(self.max_new_tokens - len(self.new), self.max_length - len(self.tokens)) - 1

    def context(self) -> DraftContext:
        return DraftContext(self.tokens, self.features, self.room(), self.acceptor.params.temperature, self.gen)

    def draft(self, max_nodes: int | None = None) -> DraftTree:
        """This step's tree from the drafter, cut to `max_nodes` (root included) and to the room left."""
        t0 = time.perf_counter()
        ctx = self.context()
        tree = self.drafter.propose(ctx)
        tree = tree.truncate(max_nodes or len(tree), ctx.max_depth)
        self.stats.draft_s += time.perf_counter() - t0
        return tree

    def plain(self) -> DraftTree:
        """A one-token step instead of a draft: the drafter takes in the context it would have drafted from."""
        t0 = time.perf_counter()
        self.drafter.observe(self.context())
        self.stats.plain_steps += 1
        self.stats.draft_s += time.perf_counter() - t0
        return DraftTree.root_only(self.tokens[-1])

    def advance(self, tree: DraftTree, logits: torch.Tensor, features: torch.Tensor | None,
                commit: Callable[[torch.Tensor], None], verify_s: float) -> int:
        """The step after the target's pass over `tree` (its logits [n, V] and the drafter's features [n, F] at
        every node, or None): accept a path, `commit(path)` it to the cache, count the step, emit its tokens and
        apply the stopping rules. Returns the number of tokens the step produced (accepted drafts + bonus)."""
        t0 = time.perf_counter()
        acc = self.acceptor.accept(tree, logits, self.gen)
        commit(acc.path)
        s = self.stats
        s.verify_s += verify_s + time.perf_counter() - t0  # accepting and committing count as verification
        s.target_calls += 1
        s.tree_nodes += len(tree)
        s.accepted_hist[acc.accepted_drafts] += 1
        self.drafter.on_step(tree, logits, acc.path)  # feedback to drafters that learn online
        self.features = features[acc.path] if features is not None else None
        self._emit(tree.tokens[acc.path[1:]].tolist() + [acc.bonus], acc.accepted_drafts)
        return acc.accepted_drafts + 1

    def _emit(self, emitted: list[int], drafts: int) -> None:
        flags = [True] * drafts + [False]
        emitted, hit_eos = self.stopper.cut_eos(emitted)
        n_before = len(self.new)
        self.new += emitted
        self.tokens += emitted
        stop = self.stopper.find_stop_string(self.new, n_before)
        if stop is not None:
            n_keep, self.keep_chars = stop
            emitted = emitted[: max(0, n_keep - n_before)]
            del self.new[n_keep:]
        if self.on_tokens is not None and emitted:
            self.on_tokens(emitted, flags[: len(emitted)])
        if stop is not None:
            self.finish("stop_string")
        elif hit_eos:
            self.finish("eos")
        elif self.room() < 0:
            self.finish("length")

    def finish(self, reason: str) -> None:
        s = self.stats
        s.stop_reason, s.new_tokens = reason, len(self.new)
        s.total_s = time.perf_counter() - self.started
        decode = self.stopper.decode
        text = decode(self.new) if decode is not None else ""
        self.result = GenerationResult(self.new, text[: self.keep_chars] if self.keep_chars is not None else text, s)
        self.drafter.on_finish(self.prompt_ids, self.new)
