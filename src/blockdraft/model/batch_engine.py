"""Batched forward passes over several sequences, each with its own KV cache, on the static engine's weights.

One verification step of continuous batching runs every active sequence's draft tree in one forward:
trees padded to the batch's largest, each node attending to its own sequence's committed prefix and
to its ancestors (per-sequence ancestor masks), at its own positions (per-sequence start + depth).
Sequences live in slots 0..B-1 of one preallocated KV buffer [slots, kv_heads, capacity, head_dim], so
the batch's keys are a view, not a gather; a finished sequence's slot is refilled by moving the last one in.
"""

from __future__ import annotations

import time

import torch

from ..errors import BlockdraftError
from .compiled import compiled_step, in_order
from .engine import CHUNK, Rows, StaticEngine, window_mask
from .traits import rope_tables


class BatchEngine:
    """KV caches of up to `slots` sequences on the weights of a `StaticEngine` (shared, not copied)."""

    def __init__(self, engine: StaticEngine, slots: int):
        if not isinstance(engine, StaticEngine):
            raise BlockdraftError("batched decoding needs the static engine (model/traits.py); this target "
                                  "runs on transformers' forward: serve it with --max-batch 1")
        if slots < 1:
            raise BlockdraftError(f"a batch needs at least one slot, got {slots}")
        self.w = engine
        self.slots = slots
        self.lengths = [0] * slots  # committed tokens per slot
        self.keys: list[torch.Tensor] = []  # per layer [slots, kv_heads, capacity, head_dim]
        self.values: list[torch.Tensor] = []
        self.cos = self.sin = None
        # A compiled engine compiles batched steps too (once, here, on throwaway sequences): graphs for
        # B >= 2 rows, one-token steps and trees. A step of one sequence runs on the engine's own graphs.
        # quantized weights: eager (their compiled kernel needs a fixed row count, model/compiled.py, and a batch's
        # rows vary with its size and trees)
        quantized = engine.decoder.weights != "full"
        self.compiled = compiled_step(engine.decoder) if engine.compiled is not None and not quantized else None
        self.compile_seconds = self._compile() if self.compiled is not None and slots > 1 else 0.0

    def _compile(self) -> float:
        """Batched steps over min(slots, 3) throwaway sequences: their first calls compile."""
        t0 = time.perf_counter()
        rows = min(self.slots, 3)
        for slot in range(rows):
            self.forward(slot, [torch.zeros(11, dtype=torch.long)], [torch.arange(11)], [None], last_logits_only=True)
        self.forward(0, [torch.zeros(1, dtype=torch.long)] * rows, [torch.arange(1)] * rows, [None] * rows)
        self.forward(0, [torch.zeros(7, dtype=torch.long)] * rows, [torch.arange(7)] * rows, [None] * rows)
        for slot in range(rows):
            self.reset(slot)
        return time.perf_counter() - t0

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2] if self.keys else 0

    def _reserve(self, needed: int) -> None:
        """Grow every slot's buffer (in CHUNK steps) to hold `needed` positions."""
        if needed <= self.capacity:
            return
        w = self.w
        cap = -(-needed // CHUNK) * CHUNK
        dtype, device = w.embed.dtype, w.embed.device
        shape = (self.slots, w.kv_heads, cap, w.head_dim)
        old, n = self.keys + self.values, self.capacity
        # zeros, not empty: a short sequence's masked-out tail is still multiplied by its zero attention
        # weight, and uninitialised memory can hold NaN, which 0 * NaN would spread
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in w.layers]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in w.layers]
        for new, prev in zip(self.keys + self.values, old, strict=False):
            new[:, :, :n] = prev
        self.cos, self.sin, _ = rope_tables(w.rotary, w.embed[:1].unsqueeze(0), torch.arange(cap, device=device),
                                            w.traits.rope_kinds)  # the model's own rotary tables

    def reset(self, slot: int) -> None:
        self.lengths[slot] = 0

    def _rows(self, first: int, tokens, depths, allowed, logits: str) -> Rows:
        """A block of rows for slots first .. first+len(tokens)-1 (see `forward`), pads included."""
        B = len(tokens)
        sizes = [len(t) for t in tokens]
        n = max(sizes)
        starts = torch.tensor([self.lengths[s] for s in range(first, first + B)])
        end = int(starts.max()) + n  # pad rows are written too (after each prefix), then overwritten later
        device = self.w.embed.device
        write_slot = torch.arange(first, first + B).repeat_interleave(n).to(device)
        write_pos = (starts[:, None] + torch.arange(n)[None, :]).reshape(-1).to(device)
        if B == 1 and allowed[0] is None and int(starts[0]) == 0:  # a fresh prompt: the causal kernel, no mask
            pos = depths[0][None].to(device)
            cos, sin = self.cos[:, pos].unsqueeze(2), self.sin[:, pos].unsqueeze(2)
            return Rows(tokens[0][None].to(device), cos, sin, None, write_slot, write_pos, first, end, n > 1, logits,
                        self._window(None, n > 1, pos, torch.arange(end, device=device)[None]))
        tok = torch.zeros(B, n, dtype=torch.long)
        pos = torch.zeros(B, n, dtype=torch.long)
        mask = torch.zeros(B, n, end, dtype=torch.bool)
        keep = torch.arange(end)[None, :] < starts[:, None]  # [B, end]: each sequence's own prefix
        mask |= keep[:, None, :]
        for b, (t, d, a, size) in enumerate(zip(tokens, depths, allowed, sizes, strict=False)):
            s = int(starts[b])
            tok[b, :size], pos[b, :size] = t, s + d
            pos[b, size:] = s  # any valid position: padding reads nothing that matters
            a = torch.ones(size, size, dtype=torch.bool).tril_() if a is None else a.cpu()
            mask[b, :size, s : s + size] = a
            mask[b, range(size, n), range(s + size, s + n)] = True  # a pad row attends to itself only
        tok, pos, mask = tok.to(device), pos.to(device), mask.to(device)[:, None]
        cos, sin = self.cos[:, pos].unsqueeze(2), self.sin[:, pos].unsqueeze(2)  # [R, B, 1, n, head_dim]
        window = None
        if self.w.traits.windowed:  # keys' positions: their slots, but a tree's nodes sit at start + depth
            key_pos = torch.arange(end, device=device).repeat(B, 1)
            key_pos.scatter_(1, write_pos.view(B, n), pos)
            window = self._window(mask, False, pos, key_pos)
        return Rows(tok, cos, sin, mask, write_slot, write_pos, first, end, False, logits, window)

    def _window(self, mask, causal: bool, pos, key_pos):
        """The sliding-window layers' mask (None for a model without them): engine.window_mask."""
        window = self.w.traits.window
        return None if window is None else window_mask(mask, causal, pos, key_pos, window)

    def _end(self, first: int, tokens) -> int:
        """One past the last position a block for slots first.. writes (pad rows included)."""
        return max(self.lengths[s] for s in range(first, first + len(tokens))) + max(len(t) for t in tokens)

    def _advance(self, first: int, tokens) -> None:
        for slot, t in enumerate(tokens, start=first):
            self.lengths[slot] += len(t)  # uncommitted until `commit` keeps a path of them

    @torch.inference_mode()
    def forward(self, first: int, tokens: list[torch.Tensor], depths: list[torch.Tensor],
                allowed: list[torch.Tensor | None], hidden_layers: tuple[int, ...] = (),
                last_logits_only: bool = False):
        """Slots first .. first+len(tokens)-1, one token list each (a tree's nodes, or a prompt):
        tokens[b], depths[b]: [n_b]; allowed[b]: [n_b, n_b] bool among the new tokens (None = causal).

        Writes their keys and values after each slot's committed prefix and returns
        (logits [B, n, V] (or [B, 1, V]: the last row only, for a prefill of one sequence), hidden states of
        `hidden_layers` [B, n, hidden] each); rows past n_b are padding.
        """
        w, B = self.w, len(tokens)
        self._reserve(self._end(first, tokens) + 1)  # one position to spare: see StaticEngine.forward
        rows = self._rows(first, tokens, depths, allowed, "last" if last_logits_only else "all")
        # a step runs on the compiled graphs; prefills stay eager (see StaticEngine)
        if self.compiled is not None and first == 0 and not last_logits_only and not rows.causal:
            tok, cos, sin, mask, write_slot, write_pos, _, end = rows[:8]
            if B > 1:
                logits, every_layer = self.compiled(tok, cos, sin, mask, self.keys, self.values, write_slot,
                                                    write_pos, end, rows.window_mask)
            else:  # slot 0 alone: the one-sequence graphs, on a view of its buffers (a lone token sees its prefix)
                logits, every_layer = w.compiled(tok, cos, sin, None if tok.shape[1] == 1 else mask,
                                                 [k[:1] for k in self.keys], [v[:1] for v in self.values],
                                                 write_slot, write_pos, end, rows.window_mask)
            hidden = [every_layer[i] for i in hidden_layers]
        else:
            logits, ascending = w.decoder.run([rows], self.keys, self.values, tuple(hidden_layers))[0]
            hidden = in_order(ascending, hidden_layers)
        self._advance(first, tokens)
        return logits, hidden

    @torch.inference_mode()
    def forward_with_prompt(self, first: int, tokens: list[torch.Tensor], depths: list[torch.Tensor],
                            allowed: list[torch.Tensor | None], hidden_layers: tuple[int, ...],
                            slot: int, chunk: torch.Tensor):
        """`forward(first, tokens, depths, allowed, hidden_layers)` and, in the same pass, the next `chunk`
        of a prompt into `slot` (outside the step's slots): causal after what the slot holds, no logits.

        Why one pass: a forward here costs at least a one-token step whatever its size (the matmuls' per-call
        cost), which a prompt prefilled on its own pays again while every running sequence waits; folded
        into a step, the chunk's rows ride on the step's matmuls (BENCHMARKS.md, "Decisions": prefill_chunk).
        Returns (logits, hidden, chunk_hidden).
        Runs eager (the compiled graphs take one block).
        """
        self._reserve(max(self._end(first, tokens), self._end(slot, [chunk])) + 1)
        step = self._rows(first, tokens, depths, allowed, "all")
        prompt = self._rows(slot, [chunk], [torch.arange(len(chunk))], [None], "none")
        (logits, ascending), (_, chunk_ascending) = self.w.decoder.run([step, prompt], self.keys, self.values,
                                                                       tuple(hidden_layers))
        self._advance(first, tokens)
        self._advance(slot, [chunk])
        return logits, in_order(ascending, hidden_layers), in_order(chunk_ascending, hidden_layers)

    @torch.inference_mode()
    def commit(self, slot: int, start: int, path: list[int]) -> None:
        """Keep slot's new entries `path` (node indices, root first) as positions start .. start+len(path)."""
        m = len(path)
        if path != list(range(m)):
            src = torch.tensor(path, device=self.w.embed.device) + start
            for k, v in zip(self.keys, self.values, strict=False):
                k[slot, :, start : start + m] = k[slot].index_select(1, src)
                v[slot, :, start : start + m] = v[slot].index_select(1, src)
        self.lengths[slot] = start + m

    def entries(self, slot: int, n: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Slot's first n keys and values, per layer [kv_heads, n, head_dim]: views of the buffers, valid until
        the slot is written again (the prefix cache copies the part it keeps)."""
        return [k[slot, :, :n] for k in self.keys], [v[slot, :, :n] for v in self.values]

    @torch.inference_mode()
    def load(self, slot: int, keys: list[torch.Tensor], values: list[torch.Tensor], n: int) -> None:
        """Make the first n entries of `keys`/`values` (per layer [kv_heads, >= n, head_dim]) the slot's prefix."""
        self._reserve(n + 1)
        for dst, src in zip(self.keys + self.values, keys + values, strict=True):
            dst[slot, :, :n] = src[:, :n]
        self.lengths[slot] = n

    @torch.inference_mode()
    def move(self, src: int, dst: int) -> None:
        """Move a sequence from slot src to slot dst (keeping the active slots contiguous)."""
        n = self.lengths[src]
        for k, v in zip(self.keys, self.values, strict=False):
            k[dst, :, :n] = k[src, :, :n]
            v[dst, :, :n] = v[src, :, :n]
        self.lengths[dst], self.lengths[src] = n, 0
