"""Continuous batching: many sequences decoded together, one batched target forward per step.

Each step, every active sequence drafts its own tree (its own drafter state), all the trees are verified
in one forward of the batch engine (per-sequence KV caches, ancestor masks and positions), and each
sequence accepts, commits and checks its stopping rules on its own. A sequence may join before any
step (its prompt is prefilled into a free slot) and leaves as soon as it stops, so a long request
never holds up a short one. With the greedy acceptor every sequence's output is the one
`SpeculativeDecoder` produces for it alone.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..drafters import DraftContext, Drafter
from ..errors import BlockdraftError
from ..target import Target
from ..target.batch_engine import BatchEngine
from ..verify import Acceptor, SamplingParams, make_acceptor
from .stats import GenerationResult, GenerationStats
from .stopping import Stopper


def fork_drafter(drafter: Drafter) -> Drafter:
    """A drafter with its own per-sequence state and the same weights: drafters keep their state in
    attributes that `reset` and `propose` reassign, so a shallow copy (recursively through wrapped
    drafters: a tree's base, a hybrid's sources in their dict and tuple) is independent without
    copying any checkpoint. What a drafter deliberately learns across generations in place (the
    hybrid's acceptance calibration) stays shared; what it reassigns (suffix's global tree) stays
    with the fork, so such learning does not carry from batched sequences to later ones."""
    twin = copy.copy(drafter)
    for name, value in vars(drafter).items():
        forked = _fork_value(value)
        if forked is not value:
            setattr(twin, name, forked)
    return twin


def _fork_value(value):
    if isinstance(value, Drafter):
        return fork_drafter(value)
    if isinstance(value, dict) and any(isinstance(v, Drafter) for v in value.values()):
        return {k: _fork_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and any(isinstance(v, Drafter) for v in value):
        return type(value)(_fork_value(v) for v in value)
    return value


@dataclass
class Sequence:
    """One request's decoding state inside the batch."""

    prompt_ids: list[int]
    max_new_tokens: int
    drafter: Drafter
    acceptor: Acceptor
    stopper: Stopper
    gen: torch.Generator
    on_tokens: Callable[[list[int], list[bool]], None] | None
    stats: GenerationStats
    tokens: list[int] = field(default_factory=list)  # prompt + output; tokens[-1] is the next tree's root
    new: list[int] = field(default_factory=list)
    features: torch.Tensor | None = None  # features of the tokens committed since the last propose()
    verified: tuple | None = None  # the last step's tree and its logits (what token recycling reads)
    keep_chars: int | None = None
    slot: int = -1
    started: float = 0.0
    result: GenerationResult | None = None
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
    """

    def __init__(self, target: Target, max_batch: int = 8, max_nodes: int | None = None, max_rows: int | None = 16):
        self.target, self.max_batch = target, max_batch
        self.max_nodes = max_nodes  # optional cap on each tree's size, root included (as SpeculativeDecoder's)
        # Every tree is padded to the largest, so one big tree makes all B rows of the batch pay for it: with
        # B sequences, each tree keeps at most max_rows // B nodes (None: no such cap). On 16 held-out ShareGPT
        # prompts at batch 8 (lookup, bf16, 2 threads) total tokens/s was 161 without a cap, 170 / 190 / 204
        # with max_rows 64 / 32 / 16 (BENCHMARKS.md, "Serving")
        self.max_rows = max_rows
        self.engine = BatchEngine(target.forwarder, max_batch)
        self.active: list[Sequence] = []  # active[i] lives in slot i
        self.forwards = 0  # batched verification forwards run (for tests and metrics)

    @property
    def free(self) -> int:
        return self.max_batch - len(self.active)

    def add(self, prompt_ids: list[int], drafter: Drafter, params: SamplingParams | None = None,
            max_new_tokens: int = 128, stop_strings: tuple[str, ...] = (), seed: int | None = None,
            on_tokens: Callable[[list[int], list[bool]], None] | None = None, acceptor: str | None = None,
            tag=None) -> Sequence:
        """Prefill a new sequence into a free slot. `drafter` is forked: its weights are shared, its state not."""
        if not self.free:
            raise BlockdraftError(f"the batch is full ({self.max_batch} sequences)")
        if not isinstance(max_new_tokens, int) or max_new_tokens <= 0:
            raise BlockdraftError(f"max_new_tokens must be a positive integer, got {max_new_tokens}")
        target = self.target
        prompt_ids = [int(t) for t in prompt_ids]
        target.check_prompt(prompt_ids)
        params = params or SamplingParams()
        gen = torch.Generator()
        gen.manual_seed(seed) if seed is not None else gen.seed()
        decode = target.decode if target.tokenizer is not None else None
        drafter = fork_drafter(drafter)
        seq = Sequence(prompt_ids, max_new_tokens, drafter, make_acceptor(acceptor, params),
                       Stopper(target.eos_token_ids, tuple(stop_strings), decode), gen, on_tokens,
                       GenerationStats(method=drafter.name), tokens=list(prompt_ids), tag=tag)
        seq.started = time.perf_counter()
        seq.slot = len(self.active)
        self.engine.reset(seq.slot)
        body = prompt_ids[:-1]
        if body:  # as Target.prefill: the KV cache gets the prompt but its last token, the first root
            _, hidden = self.engine.forward(seq.slot, [torch.tensor(body)], [torch.arange(len(body))], [None],
                                            drafter.feature_layers, last_logits_only=True)
            seq.features = torch.cat([h[0] for h in hidden], -1) if hidden else None
        drafter.reset(prompt_ids)
        seq.stats.prefill_s = time.perf_counter() - seq.started
        self.active.append(seq)
        return seq

    def remove(self, seq: Sequence) -> None:
        """Drop a sequence (finished or cancelled): the last active one moves into its slot."""
        i = self.active.index(seq)
        last = self.active.pop()
        if last is not seq:
            self.engine.move(last.slot, i)
            last.slot = i
            self.active[i] = last
        seq.slot = -1

    def _room(self, seq: Sequence) -> int:
        """Draft depth this step can use: each step emits accepted drafts + 1 bonus token."""
        return min(seq.max_new_tokens - len(seq.new), self.target.max_length - len(seq.tokens)) - 1

    def step(self) -> list[Sequence]:
        """One draft-verify-accept-commit round for every active sequence. Returns the ones that finished
        (they have left the batch): `result` set, or `error` where their drafter raised."""
        failed = []
        batch, trees = [], []
        for seq in list(self.active):
            t0 = time.perf_counter()
            depth = self._room(seq)
            try:
                tree = seq.drafter.propose(DraftContext(seq.tokens, seq.features, depth, seq.verified,
                                                         seq.acceptor.params.temperature, seq.gen))
            except Exception as e:  # one drafter's failure ends its own sequence, not the batch's
                seq.error = e
                self.remove(seq)
                failed.append(seq)
                continue
            batch.append(seq)
            cap = self.max_nodes or len(tree)
            if self.max_rows:
                cap = min(cap, max(1, self.max_rows // len(self.active)))
            trees.append(tree.truncate(cap, depth))
            seq.stats.draft_s += time.perf_counter() - t0
        if not batch:
            return failed
        # the union of the drafters' feature layers, so that each can pick its own
        layers = tuple(sorted({layer for seq in batch for layer in seq.drafter.feature_layers}))
        t1 = time.perf_counter()
        starts = [self.engine.lengths[seq.slot] for seq in batch]
        logits, hidden = self.engine.forward(
            0, [t.tokens for t in trees], [t.depth for t in trees],
            [None if t.is_chain() else t.ancestor_mask() for t in trees], layers)
        logits = logits.float().cpu()  # acceptors run on the CPU, as in Target.verify
        verify_s = time.perf_counter() - t1
        self.forwards += 1

        finished = []
        for b, (seq, tree) in enumerate(zip(batch, trees, strict=False)):
            n = len(tree)
            acc = seq.acceptor.accept(tree, logits[b, :n], seq.gen)
            self.engine.commit(seq.slot, starts[b], acc.path)
            seq.verified = (tree, logits[b, :n])
            seq.features = None
            if seq.drafter.feature_layers:  # this drafter's layers, in its order, at the accepted nodes
                own = torch.cat([hidden[layers.index(layer)][b, :n] for layer in seq.drafter.feature_layers], -1)
                seq.features = own[acc.path]
            s = seq.stats
            s.verify_s += verify_s
            s.target_calls += 1
            s.tree_nodes += n
            s.accepted_hist[acc.accepted_drafts] += 1
            if self._emit(seq, tree.tokens[acc.path[1:]].tolist() + [acc.bonus], acc.accepted_drafts):
                finished.append(seq)
        for seq in finished:
            self.remove(seq)
        return failed + finished

    def _emit(self, seq: Sequence, emitted: list[int], drafts: int) -> bool:
        """Apply the stopping rules to one step's tokens, pass them on; True when the sequence is done."""
        flags = [True] * drafts + [False]
        emitted, hit_eos = seq.stopper.cut_eos(emitted)
        n_before = len(seq.new)
        seq.new += emitted
        seq.tokens += emitted
        stop = seq.stopper.find_stop_string(seq.new, n_before)
        if stop is not None:
            n_keep, seq.keep_chars = stop
            emitted = emitted[: max(0, n_keep - n_before)]
            del seq.new[n_keep:]
        if seq.on_tokens is not None and emitted:
            seq.on_tokens(emitted, flags[: len(emitted)])
        reason = "eos" if hit_eos and stop is None else "stop_string" if stop is not None else None
        if reason is None and self._room(seq) < 0:
            reason = "length"
        if reason is None:
            return False
        s = seq.stats
        s.stop_reason, s.new_tokens = reason, len(seq.new)
        s.total_s = time.perf_counter() - seq.started
        decode = seq.stopper.decode
        text = decode(seq.new) if decode is not None else ""
        seq.result = GenerationResult(seq.new, text[: seq.keep_chars] if seq.keep_chars is not None else text, s)
        return True
