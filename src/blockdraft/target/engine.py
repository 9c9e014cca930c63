"""A static-cache forward for Llama-family targets (gpt-fast style): fused projections, in-place KV commits.

transformers' eager forward spends most of a one-token step on per-call overhead: 7 matmuls per layer,
a cache object that concatenates and slices 2 x num_layers tensors every step, mask and position
plumbing. This engine runs the same weights with 4 matmuls per layer (QKV and gate/up fused), a KV
buffer preallocated in chunks that verification writes into and `commit` compacts in place, and
nothing else. It reproduces the model's own forward (same RMSNorm, rotary embedding and SDPA
attention; checked against it in tests/test_engine.py) for the architectures `supports` accepts;
any other model keeps transformers' forward (`Target` falls back by itself).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import packing

# Llama-style decoders: RMSNorm, rotary attention with q/k/v/o projections, SiLU-gated MLP.
SUPPORTED_TYPES = ("llama", "mistral", "qwen2")
CHUNK = 512  # KV capacity grows in steps of this many tokens


def supports(model) -> bool:
    """Whether `model` is a Llama-family causal LM this engine reproduces exactly."""
    config = model.config
    if config.model_type not in SUPPORTED_TYPES or getattr(config, "hidden_act", "silu") != "silu":
        return False
    if getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None):
        return False  # Mistral/Qwen2 sliding-window attention is not implemented here
    rope = getattr(config, "rope_scaling", None) or getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type", rope.get("type", "default")) == "dynamic":
        return False  # dynamic NTK scaling changes the table with the length: keep transformers' forward
    layer = model.model.layers[0]
    return all(hasattr(layer.self_attn, p) for p in ("q_proj", "k_proj", "v_proj", "o_proj")) and all(
        hasattr(layer.mlp, p) for p in ("gate_proj", "up_proj", "down_proj"))


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # As transformers' LlamaRMSNorm: the statistics in float32, the scale in the model's dtype.
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """transformers' `x * cos + rotate_half(x) * sin` in 4 ops instead of 6: rotate_half(x) is
    roll(x) with its first half negated, and the sign moves (exactly) into the sin table."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin


class _Linear:
    """y = x W^T + b for one or several projections of the same input concatenated (q|k|v, gate|up),
    prepacked for oneDNN where that applies (target/packing.py)."""

    def __init__(self, linears):
        self.weight = torch.cat([m.weight for m in linears]).detach()
        biases = [m.bias if m.bias is not None else torch.zeros_like(m.weight[:, 0]) for m in linears]
        self.bias = torch.cat(biases).detach() if any(m.bias is not None for m in linears) else None
        self.packed = packing.pack(self.weight)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return packing.linear(x, self.weight, self.bias, self.packed)


class _Layer:
    """One decoder layer's weights, with q/k/v and gate/up concatenated into one matrix each."""

    def __init__(self, layer):
        attn, mlp = layer.self_attn, layer.mlp
        self.qkv = _Linear([attn.q_proj, attn.k_proj, attn.v_proj])
        self.o = _Linear([attn.o_proj])
        self.gate_up = _Linear([mlp.gate_proj, mlp.up_proj])
        self.down = _Linear([mlp.down_proj])
        self.ln1, self.ln2 = layer.input_layernorm.weight.detach(), layer.post_attention_layernorm.weight.detach()
        self.eps1, self.eps2 = layer.input_layernorm.variance_epsilon, layer.post_attention_layernorm.variance_epsilon


class StaticEngine:
    """Forward passes of one sequence against a preallocated KV buffer.

    `forward(tokens, positions, allowed)` writes the new tokens' keys and values at slots
    [length, length + n) and attends each new token to the committed prefix and to the new tokens
    `allowed` marks (its ancestors in a draft tree; None = causal). `commit(path)` moves the
    accepted slots next to the prefix, in place; the rest is overwritten by the next forward.
    """

    def __init__(self, model):
        config = model.config
        inner = model.model
        self.embed = inner.embed_tokens.weight.detach()
        self.layers = [_Layer(layer) for layer in inner.layers]
        self.norm, self.norm_eps = inner.norm.weight.detach(), inner.norm.variance_epsilon
        self.lm_head = _Linear([model.get_output_embeddings()])
        self.rotary = inner.rotary_emb
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.scale = self.head_dim ** -0.5
        self.keys: list[torch.Tensor] = []  # per layer [1, kv_heads, capacity, head_dim]
        self.values: list[torch.Tensor] = []
        self.cos = self.sin = None  # rotary tables [capacity, head_dim]; sin with its first half negated
        self.length = 0

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
        old_keys, old_values, n = self.keys, self.values, self.length
        self.keys = [torch.empty(shape, dtype=dtype, device=device) for _ in self.layers]
        self.values = [torch.empty(shape, dtype=dtype, device=device) for _ in self.layers]
        for new, old in zip(self.keys + self.values, old_keys + old_values):
            new[:, :, :n] = old[:, :, :n]
        # The model's own rotary module computes the table, so every static rope scaling is honoured.
        positions = torch.arange(cap, device=device).unsqueeze(0)
        cos, sin = self.rotary(self.embed[:1].unsqueeze(0), positions)
        half = self.head_dim // 2
        self.cos, self.sin = cos[0], torch.cat([-sin[0, :, :half], sin[0, :, half:]], dim=-1)

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, allowed: torch.Tensor | None = None,
                hidden_layers: tuple[int, ...] = (), last_logits_only: bool = False):
        """tokens, positions: [n]; allowed: [n, n] bool among the new tokens (None = causal).

        Returns (logits [n or 1, V], hidden states of `hidden_layers` as in transformers'
        `output_hidden_states`: 0 = embeddings, i = output of layer i, num_layers = after the final norm).
        """
        n, start = tokens.shape[0], self.length
        end = start + n
        self._reserve(end)
        x = F.embedding(tokens, self.embed).unsqueeze(0)  # [1, n, hidden]
        cos, sin = self.cos[positions].unsqueeze(0).unsqueeze(0), self.sin[positions].unsqueeze(0).unsqueeze(0)
        mask = None
        if n > 1 and (allowed is not None or start > 0):
            mask = torch.ones(n, end, dtype=torch.bool, device=x.device)
            mask[:, start:] = allowed if allowed is not None else torch.ones(n, n, dtype=torch.bool,
                                                                            device=x.device).tril_()
        causal = n > 1 and mask is None  # a fresh prefill: plain causal attention
        hidden = {0: x[0]} if 0 in hidden_layers else {}
        for i, layer in enumerate(self.layers):
            h = _rms_norm(x, layer.ln1, layer.eps1)
            qkv = layer.qkv(h).view(1, n, -1, self.head_dim).transpose(1, 2)  # [1, heads + 2 kv_heads, n, d]
            qk = _rope(qkv[:, : self.heads + self.kv_heads], cos, sin)  # queries and keys rotated together
            q, k, v = qk[:, : self.heads], qk[:, self.heads :], qkv[:, self.heads + self.kv_heads :]
            self.keys[i][:, :, start:end] = k
            self.values[i][:, :, start:end] = v
            a = F.scaled_dot_product_attention(q, self.keys[i][:, :, :end], self.values[i][:, :, :end],
                                               attn_mask=mask, is_causal=causal, scale=self.scale,
                                               enable_gqa=self.kv_heads != self.heads)
            x = x + layer.o(a.transpose(1, 2).reshape(1, n, -1))
            h = _rms_norm(x, layer.ln2, layer.eps2)
            gate, up = layer.gate_up(h).chunk(2, dim=-1)
            x = x + layer.down(F.silu(gate) * up)
            if i + 1 in hidden_layers:
                hidden[i + 1] = x[0]
        x = _rms_norm(x, self.norm, self.norm_eps)[0]
        last = len(self.layers)
        if last in hidden_layers:
            hidden[last] = x
        self.length = end
        logits = self.lm_head(x[-1:] if last_logits_only else x)
        return logits, [hidden[i] for i in hidden_layers]

    @torch.inference_mode()
    def commit(self, start: int, path: list[int]) -> None:
        """Keep the slots start + path (tree node indices, root first) as positions start.. start+len(path)."""
        m = len(path)
        if path != list(range(m)):
            src = torch.tensor(path, device=self.embed.device) + start
            for k, v in zip(self.keys, self.values):
                k[:, :, start : start + m] = k.index_select(2, src)
                v[:, :, start : start + m] = v.index_select(2, src)
        self.length = start + m
