"""Continuous batching: many sequences decoded together, one batched target forward per step.

Each step, every active sequence drafts its own tree (its own drafter state), all the trees are verified
in one forward of the batch engine (per-sequence KV caches, ancestor masks and positions), and each
sequence accepts, commits and checks its stopping rules on its own. A sequence may join before any
step and leaves as soon as it stops, so a long request never holds up a short one. A newcomer's prompt
goes into the KV cache in chunks carried by the running sequences' steps (chunked prefill, as vLLM's
scheduler does), not in a pass of its own while they wait. With the greedy acceptor every sequence's output is the one
`SpeculativeDecoder` produces for it alone.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from ..drafters import Drafter
from ..errors import BlockdraftError
from ..model import Target
from ..model.batch_engine import BatchEngine
from ..verify import SamplingParams
from .prefix_cache import CachedPrefix, PrefixCache
from .sequence import Sequence, TokenCallback


@dataclass(eq=False)
class BatchSequence(Sequence):
    """A sequence inside the batch: the shared state plus its slot and its prompt's way into the cache."""

    prefilled: int = 0  # prompt tokens in the KV cache while the sequence waits to decode
    looked_up: bool = False  # whether the prefix cache was asked for its prompt (once, when it is next in line)
    prompt_features: list[torch.Tensor] = field(default_factory=list)  # their features, chunk by chunk
    feature_history: list[torch.Tensor] | None = None  # features of every committed position (for the prefix cache)
    slot: int = -1
    error: Exception | None = None  # why it stopped without a result
    tag: object = None  # the caller's (e.g. the server's job)

    @property
    def done(self) -> bool:
        return self.result is not None or self.error is not None


class BatchDecoder:
    """Speculative decoding of up to `max_batch` sequences of `target` at once (Llama-family targets).

    add() a sequence, then call step() until it is done; sequences can be added between any two steps.
    `on_tokens(ids, accepted)` receives each step's new tokens with a flag per token: True for a drafted
    token the target accepted, False for the target's own (bonus) token.

    Slots 0..D-1 hold the `decoding` sequences, the next ones those `waiting` for their prompt to be in the
    cache. Each step carries up to `prefill_chunk` prompt tokens of the first waiting sequence in its forward;
    a prompt is prefilled in a pass of its own only when nothing is decoding (it waits for no one then).

    With `prefix_cache_mb` > 0, finished sequences leave their KV entries in a `PrefixCache` of that size, and so
    do prompts as soon as they are prefilled; a new prompt that starts like one of them prefills only what
    differs (a conversation's next turn, a system prompt shared by requests that arrive together).

    What is the batch's alone, and why: the prefix cache (it stores the batch engine's per-slot KV entries; the
    single decoder's cache is the Target's own, reset by every prefill) and the row cap (it exists because trees are
    padded to the batch's largest). The pacer is the single decoder's alone: it compares one sequence's drafted and
    plain step times, and in a batch a step's time is shared by every row, so no sequence's own cost is measured.
    Everything after the verification pass (accept, commit, statistics, stopping rules) is `Sequence.advance`,
    the same code `SpeculativeDecoder` runs.
    """

    def __init__(self, target: Target, max_batch: int = 8, max_nodes: int | None = None, max_rows: int | None = 16,
                 prefill_chunk: int = 512, prefix_cache_mb: float = 256):
        if prefill_chunk < 1:
            raise BlockdraftError(f"prefill_chunk must be a positive number of tokens, got {prefill_chunk}")
        if not prefix_cache_mb >= 0:
            raise BlockdraftError(f"prefix_cache_mb must be >= 0 (0 turns the prefix cache off), got {prefix_cache_mb}")
        # 512-token chunks rather than 256: on issue 16's 200-request mix at concurrency 8 (AMX, bf16, lookup,
        # compiled) 3.2% more tokens/s over six alternating pairs (-0.6% to +5.6%) and a lower p95 latency
        # (6.45-6.54 s against 6.98-7.15; p50 2.19-2.25 s against 2.05-2.31): fewer, fuller passes carry the
        # prompts (BENCHMARKS.md, "Decisions": prefill_chunk).
        self.target, self.max_batch, self.prefill_chunk = target, max_batch, prefill_chunk
        self.max_nodes = max_nodes  # optional cap on each tree's size, root included (as SpeculativeDecoder's)
        # Every tree is padded to the largest, so one big tree makes all B rows of the batch pay for it: with
        # B sequences, each tree keeps at most max_rows // B nodes (None: no such cap). On 16 held-out ShareGPT
        # prompts at batch 8 (lookup, bf16, 2 threads) total tokens/s was 161 without a cap, 170 / 190 / 204
        # with max_rows 64 / 32 / 16 (BENCHMARKS.md, "Serving")
        self.max_rows = max_rows
        self.engine = BatchEngine(target.forwarder, max_batch)
        self.prefix_cache = PrefixCache(int(prefix_cache_mb * 2**20)) if prefix_cache_mb > 0 else None
        self.decoding: list[BatchSequence] = []  # decoding[i] lives in slot i
        self.waiting: list[BatchSequence] = []  # waiting[i] lives in slot len(decoding) + i
        self.forwards = 0  # batched verification forwards run (for tests and metrics)

    @property
    def active(self) -> list[BatchSequence]:
        """Every sequence in the batch, decoding or waiting for its prompt."""
        return self.decoding + self.waiting

    @property
    def free(self) -> int:
        return self.max_batch - len(self.decoding) - len(self.waiting)

    def add(self, prompt_ids: list[int], drafter: Drafter, params: SamplingParams | None = None,
            max_new_tokens: int = 128, stop_strings: tuple[str, ...] = (), seed: int | None = None,
            on_tokens: TokenCallback | None = None, acceptor: str | None = None,
            tag=None) -> BatchSequence:
        """Take a new sequence into a free slot; its prompt is prefilled by the next steps. `drafter` is
        forked: its weights are shared, its state not."""
        if not self.free:
            raise BlockdraftError(f"the batch is full ({self.max_batch} sequences)")
        if drafter.single_sequence:
            raise BlockdraftError(f"method '{drafter.name}' drafts through the target's single-sequence cache and "
                                  f"cannot run in the batch decoder: choose another method (a server launched with "
                                  f"this method, or with --max-batch 1, decodes one request at a time)")
        seq = BatchSequence.start(self.target, prompt_ids, drafter.fork(), params, acceptor, max_new_tokens,
                                  stop_strings, seed, on_tokens, tag=tag)
        seq.slot = len(self.decoding) + len(self.waiting)
        self.engine.reset(seq.slot)
        self.waiting.append(seq)
        return seq

    def _next_in_line(self) -> BatchSequence:
        """The first waiting sequence, whose prompt the next forward prefills; the prefix cache is asked for its
        prompt now rather than at `add`, so that it finds the prompts of the sequences that were ahead of it
        in line (a burst of requests sharing a long system prompt prefills that prompt once)."""
        seq = self.waiting[0]
        if not seq.looked_up:
            seq.looked_up = True
            if self.prefix_cache is not None:
                self._reuse_prefix(seq)
        return seq

    def _reuse_prefix(self, seq: BatchSequence) -> None:
        """Start seq's slot with the longest stored prefix of its prompt (all of it but the last token, which
        is the first tree's root), features included for drafters that read them."""
        layers = tuple(seq.drafter.feature_layers)
        if layers:
            seq.feature_history = []
        hit, n = self.prefix_cache.lookup(seq.prompt_ids[:-1], layers)
        if n:
            keys, values, features = hit.prefix(n, with_features=bool(layers))
            self.engine.load(seq.slot, keys, values, n)
            seq.prefilled = n
            if layers:
                seq.prompt_features.append(features)

    def _remember(self, seq: BatchSequence) -> None:
        """Store a sequence's KV entries (and features), its prompt's when it starts decoding, all of them
        when it finishes, for the prompts that will start like it."""
        n = min(self.engine.lengths[seq.slot], len(seq.tokens))  # tokens cut at EOS have entries but no place
        keys, values = self.engine.entries(seq.slot, n)  # views: the cache copies only what it does not hold yet
        history = seq.feature_history
        features = torch.cat(history)[:n] if history else None
        if features is not None and len(features) != n:  # (cannot happen: one feature row per committed entry)
            features = None  # then the entry serves drafters without features only, never misaligned rows
        layers = tuple(seq.drafter.feature_layers) if features is not None else ()
        self.prefix_cache.store(CachedPrefix(np.asarray(seq.tokens[:n], dtype=np.int64), keys, values, layers,
                                             features))

    def _unprefilled(self, seq: BatchSequence) -> list[int]:
        # as Target.prefill: the KV cache gets the prompt but its last token, the first tree's root
        return seq.prompt_ids[seq.prefilled : len(seq.prompt_ids) - 1]

    def _prefill_alone(self, seq: BatchSequence) -> None:
        rest = self._unprefilled(seq)
        _, hidden = self.engine.forward(seq.slot, [torch.tensor(rest)], [torch.arange(len(rest))], [None],
                                        seq.drafter.feature_layers, last_logits_only=True)
        self._prefilled(seq, len(rest), hidden)

    def _prefilled(self, seq: BatchSequence, n: int, hidden: list[torch.Tensor]) -> None:
        seq.prefilled += n
        if hidden:
            seq.prompt_features.append(torch.cat([h[0, :n] for h in hidden], -1))

    def _start_decoding(self) -> list[BatchSequence]:
        """Move the waiting sequences whose prompt is in the cache (in slot order) to decoding; with nothing
        decoding, the first one's prompt is prefilled now, in a pass of its own. Returns the sequences that
        failed on the way (their prefill or their drafter's reset raised): they have left the batch."""
        failed = []
        while self.waiting:
            seq = self.waiting[0]
            try:
                self._next_in_line()
                if self._unprefilled(seq) and not self.decoding:
                    self._prefill_alone(seq)
                if self._unprefilled(seq):
                    break
                self.decoding.append(self.waiting.pop(0))
                if seq.prompt_features:
                    seq.features = torch.cat(seq.prompt_features)
                    seq.prompt_features = []
                if seq.feature_history is not None and seq.features is not None:
                    seq.feature_history.append(seq.features)
                if self.prefix_cache is not None:
                    self._remember(seq)  # (a prompt the cache held whole is not stored twice: see PrefixCache.store)
                seq.drafter.reset(seq.prompt_ids)
            except Exception as e:  # one request's prompt or drafter fails it alone, not the batch
                self._fail(seq, e, failed)
                continue
            seq.stats.prefill_s = time.perf_counter() - seq.started  # waiting for its chunks included
        return failed

    def _fail(self, seq: BatchSequence, error: Exception, failed: list[BatchSequence]) -> None:
        seq.error = error
        self.remove(seq)
        failed.append(seq)

    def remove(self, seq: BatchSequence) -> None:
        """Drop a sequence (finished or cancelled); the slots stay contiguous: the last decoding sequence
        moves into a decoding one's slot, and the waiting ones after it move down one."""
        if seq in self.decoding:
            i = self.decoding.index(seq)
            last = self.decoding.pop()
            if last is not seq:
                self.engine.move(last.slot, i)
                last.slot = i
                self.decoding[i] = last
        else:
            self.waiting.remove(seq)
        for slot, waiting in enumerate(self.waiting, start=len(self.decoding)):
            if waiting.slot != slot:
                self.engine.move(waiting.slot, slot)
                waiting.slot = slot
        seq.slot = -1

    def step(self) -> list[BatchSequence]:
        """One draft-verify-accept-commit round for every active sequence. Returns the ones that finished
        (they have left the batch): `result` set, or `error` where something of their own raised (their drafter's
        reset or propose, their prompt's prefill alone, their acceptor, their on_tokens): the others go on. Only the
        shared forward's failure fails the step."""
        failed = self._start_decoding()
        batch, trees = [], []
        for seq in list(self.decoding):
            cap = self.max_nodes
            if self.max_rows:
                cap = min(cap or self.max_rows, max(1, self.max_rows // len(self.decoding)))
            try:
                tree = seq.draft(cap)
            except Exception as e:  # one drafter's failure ends its own sequence, not the batch's
                self._fail(seq, e, failed)
                continue
            batch.append(seq)
            trees.append(tree)
        if not batch:
            return failed
        # the union of the drafters' feature layers, so that each can pick its own
        layers = tuple(sorted({layer for seq in batch for layer in seq.drafter.feature_layers}))
        t1 = time.perf_counter()
        starts = [self.engine.lengths[seq.slot] for seq in batch]
        verify = ([t.tokens for t in trees], [t.depth for t in trees],
                [None if t.is_chain() else t.ancestor_mask() for t in trees])
        if self.waiting:  # the first waiting prompt's next chunk rides on this step
            newcomer = self._next_in_line()
            chunk = self._unprefilled(newcomer)[: self.prefill_chunk]
            prompt_layers = newcomer.drafter.feature_layers
            every = tuple(sorted(set(layers) | set(prompt_layers)))
            logits, hidden, chunk_hidden = self.engine.forward_with_prompt(0, *verify, every, newcomer.slot,
                                                                          torch.tensor(chunk))
            self._prefilled(newcomer, len(chunk), [chunk_hidden[every.index(layer)] for layer in prompt_layers])
            hidden = [hidden[every.index(layer)] for layer in layers]
        else:
            logits, hidden = self.engine.forward(0, *verify, layers)
        logits = logits.cpu()  # acceptors run on the CPU, in the target's dtype, as in Target.verify
        verify_s = time.perf_counter() - t1
        self.forwards += 1

        finished, broken = [], []
        for b, (seq, tree) in enumerate(zip(batch, trees, strict=True)):
            n = len(tree)
            try:
                own = None
                if seq.drafter.feature_layers:  # this drafter's layers, in its order, at every node
                    own = torch.cat([hidden[layers.index(layer)][b, :n] for layer in seq.drafter.feature_layers], -1)
                commit = lambda path, seq=seq, start=starts[b]: self.engine.commit(seq.slot, start, path)  # noqa: E731
                seq.advance(tree, logits[b, :n], own, commit, verify_s)
                if seq.feature_history is not None and seq.features is not None:
                    seq.feature_history.append(seq.features)
            except Exception as e:  # its acceptor (NaN probabilities) or its callback: this sequence alone fails
                seq.error = e
                broken.append(seq)
                continue
            if seq.done:
                finished.append(seq)
        # removed only now: a removal moves other sequences' slots, and every commit above reads its slot
        for seq in broken:
            self.remove(seq)
        for seq in finished:
            if self.prefix_cache is not None:
                self._remember(seq)
            self.remove(seq)
        return failed + broken + finished
