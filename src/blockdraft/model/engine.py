"""A static-cache forward (gpt-fast style) for the families of model/traits.py: fused projections, in-place commits.

transformers' eager forward spends most of a one-token step on per-call overhead: 7 matmuls per layer,
a cache object that concatenates and slices 2 x num_layers tensors every step, mask and position
plumbing. This engine runs the same weights with 4 matmuls per layer (QKV and gate/up fused), a KV
buffer preallocated in chunks that verification writes into and `commit` compacts in place, and
nothing else. It reproduces the model's own forward (same RMSNorm, rotary embedding and SDPA
attention; checked against it in tests/test_engine.py) for the architectures `supports` accepts (Llama, Mistral,
Qwen2/3, Gemma 1/2/3: their differences are a few declared traits, model/traits.py);
any other model keeps transformers' forward (`Target` falls back by itself). With `compile=True` the
decoding steps run through torch.compile (`compiled_step`).
"""

from __future__ import annotations

import functools
import time
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from . import qkernel, quantized_weights
from .compiled import ROW_BUCKETS, compiled_step, in_order, row_bucket, static_rows_step
from .linear import Linear
from .traits import ACTIVATIONS, SUPPORTED_TYPES, Traits, norm_eps, norm_weight, rms_norm, rope_tables, softcap, \
    traits_of

__all__ = ["SUPPORTED_TYPES", "StaticEngine", "Decoder", "supports"]
CHUNK = 512  # KV capacity grows in steps of this many tokens


def supports(model) -> bool:
    """Whether `model` is a decoder this engine reproduces exactly (its traits: model/traits.py)."""
    return traits_of(model) is not None


def window_mask(mask: torch.Tensor | None, causal: bool, q_pos: torch.Tensor, key_pos: torch.Tensor,
                window: int) -> torch.Tensor:
    """[B, 1, n, end] bool: what `mask` lets each row see (None: every key; `causal`: the lower triangle of a
    fresh prefill), limited to keys whose position is within `window` of the row's (transformers' sliding
    window: key > query - window). q_pos [B, n] and key_pos [B, end] are positions, not cache slots: a tree
    node sits at start + depth."""
    n, end = q_pos.shape[1], key_pos.shape[1]
    near = key_pos[:, None, None, :] > q_pos[:, None, :, None] - window
    if mask is not None:
        return near & mask
    if causal:
        return near & torch.ones(n, end, dtype=torch.bool, device=near.device).tril_(end - n)
    return near


def _rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """transformers' `x * cos + rotate_half(x) * sin` in 4 ops instead of 6: rotate_half(x) is
    roll(x) with its first half negated, and the sign moves (exactly) into the sin table."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin


class _Layer(nn.Module):
    """One decoder layer's weights, with q/k/v and gate/up concatenated into one matrix each."""

    def __init__(self, layer, traits: Traits, linear):
        super().__init__()
        attn, mlp = layer.self_attn, layer.mlp
        self.qkv = linear([attn.q_proj, attn.k_proj, attn.v_proj])
        self.o = linear([attn.o_proj])
        self.gate_up = linear([mlp.gate_proj, mlp.up_proj])
        self.down = linear([mlp.down_proj])
        # Llama's post_attention_layernorm is the MLP's input norm; Gemma 2/3's normalises the attention output
        # and pre_feedforward_layernorm is the MLP's input norm
        names = {"ln1": "input_layernorm", "ln2": "post_attention_layernorm"}
        if traits.sandwich:
            names.update(ln2="pre_feedforward_layernorm", post_attn="post_attention_layernorm",
                         post_mlp="post_feedforward_layernorm")
        if traits.qk_norm:
            names.update(q_norm="self_attn.q_norm", k_norm="self_attn.k_norm")
        self.eps = {}
        for name, path in names.items():
            norm = layer.get_submodule(path)
            setattr(self, name, nn.Parameter(norm_weight(norm, traits), requires_grad=False))
            self.eps[name] = norm_eps(norm)

    def norm(self, x: torch.Tensor, name: str, gemma: bool) -> torch.Tensor:
        return rms_norm(x, getattr(self, name), self.eps[name], gemma)


class Rows(NamedTuple):
    """One block of a forward's rows: B sequences x n new tokens, in KV slots first .. first+B-1.

    Row b's j-th key and value are written at (write_slot[b*n + j], write_pos[b*n + j]), and every row
    attends over positions [0, end) of its slot under `mask` [B, 1, n, end] (None: a one-token step that
    sees everything, or `causal`: a fresh prefill). `logits`: "all" rows, the "last" row of each sequence,
    or "none" (a prompt chunk whose logits nobody reads).
    """

    tokens: torch.Tensor  # [B, n]
    cos: torch.Tensor  # [R, B, 1, n, head_dim]: one table per rotary kind (traits.rope_tables)
    sin: torch.Tensor
    mask: torch.Tensor | None
    write_slot: torch.Tensor  # [B * n]
    write_pos: torch.Tensor
    first: int
    end: int
    causal: bool = False
    logits: str = "all"
    window_mask: torch.Tensor | None = None  # [B, 1, n, end] bool: `mask` within the sliding window (window_mask)


def _sliced(fused: Linear, start: int, end: int, x: torch.Tensor) -> torch.Tensor:
    return fused(x)[..., start:end]


def _route_through(linears, fused: Linear) -> None:
    """transformers' nn.Linear modules of a planes-only model compute through the engine's fused Linear (each keeps
    its slice of the outputs): the model stays runnable (generate(), the float32 tie check) with one copy of the
    weights. Slow (a q_proj call computes k and v too), and only used away from the engine's own passes."""
    start = 0
    for m in linears:
        m.forward = functools.partial(_sliced, fused, start, start + m.out_features)
        start += m.out_features


class Decoder(nn.Module):
    """The forward pass on fused weights, for one sequence or a batch (model/batch_engine.py), eager or compiled.

    `forward` runs one block of rows (see Rows). `run` runs several in one pass, such as a batch's decoding
    step and a newcomer's prompt chunk: the projections and MLPs see all their rows at once (one matmul
    each, which on this CPU costs about what the largest block alone does), attention runs per block.
    """

    def __init__(self, model, weights: str = "full", planes: dict | None = None, share_weights: bool = True):
        """weights: "full" (the model's own), or "int8" / "int4" (model/linear.py): each projection from its
        entry in `planes` (nn.Linear -> quantized_weights.Planes: a GGUF file's own blocks) where there is one,
        else quantized here. share_weights: the model's linears become views of the fused weights (one copy in
        memory; Linear.share_with), for the target's own decoder, not a drafting copy that lowers its weights."""
        super().__init__()
        config, inner = model.config, model.model
        self.traits = traits = traits_of(model)
        if traits is None:
            raise ValueError(f"the static engine does not reproduce '{config.model_type}' models")
        planes = planes or {}
        if inner.embed_tokens.weight.is_meta:  # kept as the file's integers (model/gguf_model.py)
            self.embed = qkernel.Embedding(planes[inner.embed_tokens], model.dtype)
            inner.embed_tokens.forward = self.embed.forward
        else:
            self.embed = nn.Parameter(inner.embed_tokens.weight.detach(), requires_grad=False)
        self.register_buffer("embed_scale", None if traits.embed_scale is None else
                             torch.tensor(traits.embed_scale).to(self.embed.dtype))  # as Gemma: rounded to dtype
        # Built from a GGUF file with quantized weights (model/gguf_model.py), the projections exist only as the file's
        # integers (qkernel.QWeight): our kernel runs them where it is the faster one (qkernel.preferred), with no
        # float copy; elsewhere (small models on AVX512 / AMX CPUs) they become torch's int4 planes plus a full copy of
        # the same values, as any model's quantized weights
        from_file = weights != "full" and any(p.is_meta for p in model.parameters())
        ours = from_file and planes.ours  # decided with the embedding's form at load (model/gguf_model.py)

        def linear(linears):
            if weights == "full":
                return shared(Linear(linears), linears)
            if ours:
                fused = Linear(linears, qweights=qkernel.concat([planes[m] for m in linears]), dtype=self.embed.dtype)
                _route_through(linears, fused)
                return fused
            given = {m: qkernel.to_planes(planes[m]) for m in linears} if from_file else planes
            parts = [given.get(m) or quantized_weights.quantize(m.weight, weights) for m in linears]
            for m, part in zip(linears, parts, strict=True):
                # the model itself becomes the quantized one (its weights the planes' values), so that what reads
                # it -- transformers' forward, generate(), the bench's float32 tie check -- sees the same model
                m.weight = nn.Parameter(part.dequantize(m.weight.dtype).to(m.weight.dtype), requires_grad=False)
            return shared(Linear(linears, quantized_weights.concat(parts)), linears)

        def shared(fused: Linear, linears) -> Linear:
            if share_weights:
                fused.share_with(linears, tied=inner.embed_tokens.weight)
            return fused

        self.weights = weights
        # rows of our kernel's targets attend one at a time (StaticEngine.row_exact)
        self.row_exact = ours
        self.layers = nn.ModuleList(_Layer(layer, traits, linear) for layer in inner.layers)
        self.norm = nn.Parameter(norm_weight(inner.norm, traits), requires_grad=False)
        self.norm_eps = norm_eps(inner.norm)
        self.lm_head = linear([model.get_output_embeddings()])
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.scale = traits.query_scale or self.head_dim ** -0.5
        self.act = ACTIVATIONS[traits.activation]
        kinds = list(dict.fromkeys(traits.rope_kinds))  # each layer's rotary table, in traits.rope_tables' order
        self.rope_index = tuple(kinds.index(k) for k in traits.rope_kinds)

    def forward(self, tokens, cos, sin, mask, keys, values, write_slot, write_pos, first: int, end: int,
                hidden_layers: tuple[int, ...] = (), last_logits_only: bool = False, causal: bool = False,
                window_mask: torch.Tensor | None = None):
        """One block: (logits [B, n or 1, V], hidden states of `hidden_layers` [B, n, hidden] in ascending order)."""
        rows = Rows(tokens, cos, sin, mask, write_slot, write_pos, first, end, causal,
                    "last" if last_logits_only else "all", window_mask)
        return self.run([rows], keys, values, hidden_layers)[0]

    def run(self, blocks: list[Rows], keys, values, hidden_layers: tuple[int, ...] = ()):
        """Several blocks in one pass; per block (logits or None, hidden states as in `forward`)."""
        sizes = [b.tokens.numel() for b in blocks]
        flat = blocks[0].tokens.reshape(-1) if len(blocks) == 1 else torch.cat([b.tokens.reshape(-1) for b in blocks])
        x = self.embed(flat) if isinstance(self.embed, qkernel.Embedding) else F.embedding(flat, self.embed)
        if self.embed_scale is not None:
            x = x * self.embed_scale
        hidden = {0: x} if 0 in hidden_layers else {}
        gemma, sandwich = self.traits.gemma_norm, self.traits.sandwich
        fold = 1 if self.traits.attn_softcap is not None else self.heads // self.kv_heads  # see _attend
        biases = [(self._bias(b.mask, b.causal, x.dtype, fold), self._bias(b.window_mask, False, x.dtype, fold))
                  for b in blocks]
        for i, layer in enumerate(self.layers):
            h = layer.norm(x, "ln1", gemma)
            qkv = layer.qkv(h)
            if len(blocks) == 1:
                a = self._attend(i, blocks[0], biases[0], qkv, keys, values)
            else:
                a = torch.cat([self._attend(i, b, bias, part, keys, values)
                               for b, bias, part in zip(blocks, biases, qkv.split(sizes), strict=True)])
            a = layer.o(a)
            x = x + (layer.norm(a, "post_attn", gemma) if sandwich else a)
            h = layer.norm(x, "ln2", gemma)
            gate, up = layer.gate_up(h).chunk(2, dim=-1)
            m = layer.down(self.act(gate) * up)
            x = x + (layer.norm(m, "post_mlp", gemma) if sandwich else m)
            if i + 1 in hidden_layers:
                hidden[i + 1] = x
        x = rms_norm(x, self.norm, self.norm_eps, gemma)
        last = len(self.layers)
        if last in hidden_layers:
            hidden[last] = x
        out = []
        for b, h in zip(blocks, x.split(sizes) if len(blocks) > 1 else [x], strict=True):
            B, n = b.tokens.shape
            h = h.view(B, n, -1)
            logits = None if b.logits == "none" else softcap(self.lm_head(h[:, -1:] if b.logits == "last" else h),
                                                             self.traits.final_softcap)
            out.append([logits, []])
        for i in sorted(set(hidden_layers)):
            for o, b, h in zip(out, blocks, hidden[i].split(sizes) if len(blocks) > 1 else [hidden[i]], strict=True):
                o[1].append(h.view(*b.tokens.shape, -1))
        return [tuple(o) for o in out]

    def _bias(self, mask: torch.Tensor | None, causal: bool, dtype, fold: int = 1) -> torch.Tensor | None:
        """A block's mask as an additive bias [B, 1, fold * n, end] (None: causal, or every key); `fold` repeats
        the rows for the folded grouped-query attention of _attend (row (g, j) is token j's row)."""
        if causal or mask is None:
            return None
        bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
        bias.masked_fill_(~mask, float("-inf"))
        return bias if fold == 1 else bias.repeat(1, 1, fold, 1)

    def _attend(self, i: int, rows: Rows, biases, qkv, keys, values) -> torch.Tensor:
        """Layer i's attention for one block: writes its keys and values, returns [B * n, heads * head_dim]."""
        heads, kv_heads, d = self.heads, self.kv_heads, self.head_dim
        B, n = rows.tokens.shape
        qkv = qkv.view(B, n, -1, d).transpose(1, 2)  # [B, heads + 2 kv_heads, n, d]
        if self.traits.qk_norm:
            layer, gemma = self.layers[i], self.traits.gemma_norm
            qk = torch.cat([layer.norm(qkv[:, :heads], "q_norm", gemma),
                            layer.norm(qkv[:, heads : heads + kv_heads], "k_norm", gemma)], dim=1)
        else:
            qk = qkv[:, : heads + kv_heads]
        r = self.rope_index[i]
        qk = _rope(qk, rows.cos[r], rows.sin[r])  # queries and keys rotated together
        q, k, v = qk[:, :heads], qk[:, heads:], qkv[:, heads + kv_heads :]
        keys[i][rows.write_slot, :, rows.write_pos] = k.transpose(1, 2).reshape(B * n, kv_heads, d)
        values[i][rows.write_slot, :, rows.write_pos] = v.transpose(1, 2).reshape(B * n, kv_heads, d)
        first, end = rows.first, rows.end
        k_all, v_all = keys[i][first : first + B, :, :end], values[i][first : first + B, :, :end]
        windowed = self.traits.windows[i] is not None
        bias = biases[1] if windowed else biases[0]
        group = heads // kv_heads
        if self.traits.attn_softcap is not None:
            # as transformers' eager attention, which Gemma 2 runs (SDPA has no softcapping): scores, cap, mask,
            # softmax in float32
            k_all, v_all = k_all.repeat_interleave(group, dim=1), v_all.repeat_interleave(group, dim=1)
            scores = softcap(torch.matmul(q, k_all.transpose(2, 3)) * self.scale, self.traits.attn_softcap)
            if bias is not None:
                scores = scores + bias
            elif rows.causal:
                keep = torch.ones(n, end, dtype=torch.bool, device=q.device).tril_(end - n)
                scores = scores.masked_fill(~keep, float("-inf"))
            a = torch.matmul(F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype), v_all)
        elif rows.causal and not windowed:  # a prefill: the causal kernel (folding would put the rows out of order)
            a = F.scaled_dot_product_attention(q, k_all, v_all, is_causal=True, scale=self.scale,
                                               enable_gqa=kv_heads != heads)
        else:
            # Grouped-query attention as plain attention over a longer query: the `group` query heads that
            # share a KV head are contiguous, so [B, heads, n, d] views as [B, kv_heads, group * n, d] (each
            # of its rows attending under its token's mask row). That reads each key and value once per KV
            # head; SDPA's own enable_gqa path ran about twice as slow on this CPU for small queries over long
            # caches. The mask goes in as an additive bias, which the CPU kernel takes faster than a bool
            # one (benchmarks/attention_gqa.py; BENCHMARKS.md, "Decisions": grouped-query attention).
            if self.row_exact and n > 1 and rows.mask is not None:
                # each row exactly as a one-token step computes it (StaticEngine.row_exact): over the keys it may
                # see, gathered in order (a one-token step after the commit sees the same keys, same length)
                seen = rows.window_mask if windowed else rows.mask
                a = torch.stack([torch.cat([F.scaled_dot_product_attention(
                    q[b : b + 1, :, j : j + 1].reshape(1, kv_heads, group, d),
                    *(t[b : b + 1, :, seen[b, 0, j].nonzero()[:, 0]] for t in (k_all, v_all)),
                    scale=self.scale).view(heads, 1, d) for j in range(n)], dim=1) for b in range(B)])
            else:
                a = F.scaled_dot_product_attention(q.reshape(B, kv_heads, group * n, d), k_all, v_all,
                                                   attn_mask=bias, scale=self.scale).view(B, heads, n, d)
        return a.transpose(1, 2).reshape(B * n, -1)


class StaticEngine:
    """Forward passes of one sequence against a preallocated KV buffer.

    `forward(tokens, positions, allowed)` writes the new tokens' keys and values at slots
    [length, length + n) and attends each new token to the committed prefix and to the new tokens
    `allowed` marks (its ancestors in a draft tree; None = causal). `commit(path)` moves the
    accepted slots next to the prefix, in place; the rest is overwritten by the next forward.

    With `compile=True` the steps after the prefill (one token or a tree) run the compiled decoder;
    prefills stay eager: there is one per prompt, a small share of a turn, so a graph of their own gained little
    end to end and cost more compilation at load (BENCHMARKS.md, "Decisions": --compile). Both graphs are
    compiled when the engine is made, on a throwaway sequence, and `compile_seconds` says how long that took.
    """

    def __init__(self, model, compile: bool = False, weights: str = "full", planes: dict | None = None):
        self.decoder = Decoder(model, weights, planes)
        # Our kernel quantizes each row's activations to int8 (model/qkernel.py): a difference of one ulp in a row's
        # input can move a rounding and its output by a whole step, so a tree's row must compute exactly what a
        # one-token step would; its projections do, and Decoder._attend attends row by row over the same keys
        self.row_exact = self.decoder.row_exact
        self.embed = self.decoder.embed
        self.layers = self.decoder.layers
        self.heads, self.kv_heads, self.head_dim = self.decoder.heads, self.decoder.kv_heads, self.decoder.head_dim
        self.rotary = model.model.rotary_emb
        self.traits = self.decoder.traits
        self.keys: list[torch.Tensor] = []  # per layer [1, kv_heads, capacity, head_dim]
        self.values: list[torch.Tensor] = []
        self.cos = self.sin = None  # rotary tables [R, capacity, head_dim]; sin with its first half negated
        self.length = 0
        # quantized weights compile one graph per row bucket (model/compiled.py), trees padded up to it
        self.row_buckets = compile and any(getattr(m, "max_rows", 0) for m in self.decoder.modules())
        step = static_rows_step if self.row_buckets else compiled_step
        self.compiled = step(self.decoder) if compile else None
        self.compile_seconds = self._compile() if compile else 0.0

    def _compile(self) -> float:
        """Run a one-token step and a tree pass on a throwaway sequence: their first calls compile.
        The sizes (an 11-token prefix, 7 nodes) are odd on purpose: a size equal to one of the model's own
        dimensions would be specialised to it, and other sizes would then compile again."""
        t0 = time.perf_counter()
        device = self.embed.device
        tokens = torch.zeros(19, dtype=torch.long, device=device)
        self.forward(tokens[:11], torch.arange(11, device=device))
        self.forward(tokens[11:12], torch.tensor([11], device=device))
        for size in ROW_BUCKETS[1:] if self.row_buckets else (7,):
            self.length = 12
            self.forward(tokens.new_zeros(size), torch.arange(12, 12 + size, device=device))
        self.reset()
        return time.perf_counter() - t0

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2] if self.keys else 0

    def reset(self) -> None:
        self.length = 0

    def _reserve(self, needed: int) -> None:
        """Grow the KV buffers and rotary tables (in CHUNK steps) to hold `needed` tokens."""
        if needed <= self.capacity:
            return
        cap = -(-needed // CHUNK) * CHUNK
        dtype, device = self.embed.dtype, self.embed.device
        shape = (1, self.kv_heads, cap, self.head_dim)
        # the whole old buffer, not only the committed prefix: a drafting copy's keys and values for its
        # earlier drafts sit past it (draft_step), and its next step may be the one that grows the buffer
        old_keys, old_values, n = self.keys, self.values, self.capacity
        self.keys = [torch.empty(shape, dtype=dtype, device=device) for _ in self.layers]
        self.values = [torch.empty(shape, dtype=dtype, device=device) for _ in self.layers]
        # (on the first call there is nothing to copy: the old lists are empty)
        for new, old in zip(self.keys + self.values, old_keys + old_values, strict=False):
            new[:, :, :n] = old[:, :, :n]
        self.cos, self.sin, _ = rope_tables(
            self.rotary, self.embed[:1].unsqueeze(0), torch.arange(cap, device=device), self.traits.rope_kinds)

    def window_mask(self, mask, causal: bool, positions: torch.Tensor, start: int) -> torch.Tensor | None:
        """The sliding-window layers' mask for new tokens at `positions` after `start` committed ones (None for
        a model without them): see window_mask."""
        if not self.traits.windowed:
            return None
        key_pos = torch.cat([torch.arange(start, device=positions.device), positions])
        return window_mask(mask, causal, positions[None], key_pos[None], self.traits.window)

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, allowed: torch.Tensor | None = None,
                hidden_layers: tuple[int, ...] = (), last_logits_only: bool = False):
        """tokens, positions: [n]; allowed: [n, n] bool among the new tokens (None = causal).

        Returns (logits [n or 1, V], hidden states of `hidden_layers` as in transformers'
        `output_hidden_states`: 0 = embeddings, i = output of layer i, num_layers = after the final norm).
        """
        n, start = tokens.shape[0], self.length
        compiled = self.compiled is not None and start > 0 and not last_logits_only
        if compiled and self.row_buckets:
            bucket = row_bucket(n)
            if bucket is not None and bucket > n:
                return self._padded(tokens, positions, allowed, hidden_layers, bucket)
            compiled = bucket == n  # past the largest bucket: eager
        end = start + n
        # one slot to spare: a pass that fills the buffer exactly would make the compiled graph's slice
        # [:end] the whole buffer, a case torch.compile guards on and would recompile for
        self._reserve(end + 1)
        device = tokens.device
        cos, sin = self.cos[:, positions][:, None, None], self.sin[:, positions][:, None, None]
        mask = None
        if n > 1 and (allowed is not None or start > 0):
            mask = torch.ones(n, end, dtype=torch.bool, device=device)
            mask[:, start:] = allowed if allowed is not None else torch.ones(n, n, dtype=torch.bool,
                                                                            device=device).tril_()
            mask = mask[None, None]
        causal = n > 1 and mask is None  # a fresh prefill: plain causal attention
        windowed = self.window_mask(mask, causal, positions, start)
        slot = torch.zeros(n, dtype=torch.long, device=device)
        write = torch.arange(start, end, device=device)
        if compiled:
            # a copy, not a view: a view's offset into its base would be guarded on, and recompiled for
            logits, every_layer = self.compiled(tokens[None].clone(), cos, sin, mask, self.keys, self.values, slot,
                                                write, end, windowed)
            hidden = [every_layer[i] for i in hidden_layers]
        else:
            logits, ascending = self.decoder(tokens[None], cos, sin, mask, self.keys, self.values, slot, write, 0,
                                             end, tuple(hidden_layers), last_logits_only, causal, windowed)
            hidden = in_order(ascending, hidden_layers)
        self.length = end
        return logits[0], [h[0] for h in hidden]

    def _padded(self, tokens, positions, allowed, hidden_layers, bucket: int):
        """`forward` for n new tokens as a pass of `bucket` rows: the padding rows (token 0 at the last position)
        see the prefix and themselves, no real row sees them, and their keys and values land past the real ones,
        where the next pass overwrites them."""
        n, pad, device = tokens.shape[0], bucket - tokens.shape[0], tokens.device
        grown = torch.eye(bucket, dtype=torch.bool, device=device)
        grown[:n, :n] = allowed if allowed is not None else torch.ones(n, n, dtype=torch.bool, device=device).tril_()
        logits, hidden = self.forward(torch.cat([tokens, tokens.new_zeros(pad)]),
                                      torch.cat([positions, positions[-1:].expand(pad)]), grown, hidden_layers)
        self.length -= pad
        return logits[:n], [h[:n] for h in hidden]

    @torch.inference_mode()
    def draft_step(self, step, token: int, offset: int) -> torch.Tensor:
        """Logits [V] of `step` (a lowered copy of this engine's decoder in a _Step, eager or compiled: see
        drafters/quantized.py) for `token` at position length + offset. It attends to the committed prefix
        (this engine's own keys and values) and to the `offset` tokens that earlier calls wrote after it; its
        keys and values go to slot length + offset, past the committed prefix, where the next `forward`
        overwrites them. `length` does not move."""
        pos = self.length + offset
        self._reserve(pos + 2)  # one slot to spare, as in `forward`
        device = self.embed.device
        position = torch.tensor([pos], device=device)
        # the earlier drafts sit at consecutive slots and positions: keys' positions are their slots
        windowed = self.window_mask(None, False, position, pos)
        logits, _ = step(torch.tensor([[token]], device=device), self.cos[:, position][:, None, None],
                         self.sin[:, position][:, None, None], None, self.keys, self.values,
                         torch.zeros(1, dtype=torch.long, device=device), position, pos + 1, windowed)
        return logits[0, -1]

    @torch.inference_mode()
    def commit(self, start: int, path: list[int]) -> None:
        """Keep the slots start + path (tree node indices, root first) as positions start.. start+len(path)."""
        m = len(path)
        if path != list(range(m)):
            src = torch.tensor(path, device=self.embed.device) + start
            for k, v in zip(self.keys, self.values, strict=True):
                k[:, :, start : start + m] = k.index_select(2, src)
                v[:, :, start : start + m] = v.index_select(2, src)
        self.length = start + m
