"""The static engine's architectures as declared traits: what makes Qwen3 or Gemma 3 differ from Llama, read once.

gpt-fast's point is that a decoder family is a handful of switches on one forward pass, not a copy of it.
`traits_of(model)` reads them from a transformers model (None: the engine does not reproduce it, and the model
keeps transformers' forward); model/engine.py runs whichever combination it gets.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .hf_forward import layer_windows

# model types whose decoder layers are q/k/v/o attention + a gated MLP, with the variations below
SUPPORTED_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text")
GEMMA_TYPES = ("gemma", "gemma2", "gemma3_text")
ACTIVATIONS = {"silu": F.silu, "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh")}


@dataclass(frozen=True)
class Traits:
    """One decoder family's deviations from Llama (all off: Llama, Mistral, Qwen2)."""

    gemma_norm: bool = False  # RMSNorm scaled by (1 + w) in float32, then cast (Gemma); else w * x.to(dtype)
    qk_norm: bool = False  # an RMSNorm over each head's queries and keys before the rotation (Qwen3, Gemma 3)
    sandwich: bool = False  # norms on the attention's and the MLP's outputs too (Gemma 2 and 3)
    embed_scale: float | None = None  # embeddings times sqrt(hidden), rounded to the model's dtype (Gemma)
    activation: str = "silu"  # the MLP gate's (ACTIVATIONS)
    query_scale: float | None = None  # attention's 1/sqrt(d) replaced (Gemma's query_pre_attn_scalar ** -0.5)
    attn_softcap: float | None = None  # cap * tanh(scores / cap) before the mask (Gemma 2)
    final_softcap: float | None = None  # the same on the logits (Gemma 2)
    windows: tuple[int | None, ...] = ()  # per layer: sliding window, None = full attention
    rope_kinds: tuple[str | None, ...] = ()  # per layer: its rotary table's layer type (Gemma 3's local/global)

    @property
    def window(self) -> int | None:
        """The sliding window of the windowed layers (one size: traits_of refuses several), None without them."""
        return next((w for w in self.windows if w is not None), None)

    @property
    def windowed(self) -> bool:
        return self.window is not None


def traits_of(model) -> Traits | None:
    """The traits of `model`, or None when the static engine does not reproduce it exactly."""
    config = model.config
    kind = config.model_type
    if kind not in SUPPORTED_TYPES:
        return None
    act = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", "silu")
    if act not in ACTIVATIONS or getattr(config, "use_bidirectional_attention", False):
        return None
    rope = getattr(config, "rope_scaling", None) or getattr(config, "rope_parameters", None) or {}
    ropes = rope.values() if all(isinstance(v, dict) for v in rope.values()) and rope else [rope]
    if any(r.get("rope_type", r.get("type", "default")) == "dynamic" for r in ropes):
        return None  # dynamic NTK scaling changes the table with the length: keep transformers' forward
    try:
        windows = tuple(layer_windows(config))
    except ValueError:
        return None
    if len({w for w in windows if w is not None}) > 1:
        return None
    layer = model.model.layers[0]
    if not (all(hasattr(layer.self_attn, p) for p in ("q_proj", "k_proj", "v_proj", "o_proj"))
            and all(hasattr(layer.mlp, p) for p in ("gate_proj", "up_proj", "down_proj"))):
        return None
    gemma = kind in GEMMA_TYPES
    two_ropes = kind == "gemma3_text"
    return Traits(
        gemma_norm=gemma, qk_norm=hasattr(layer.self_attn, "q_norm"), sandwich=kind in ("gemma2", "gemma3_text"),
        embed_scale=config.hidden_size ** 0.5 if gemma else None, activation=act,
        query_scale=config.query_pre_attn_scalar ** -0.5 if kind in ("gemma2", "gemma3_text") else None,
        attn_softcap=getattr(config, "attn_logit_softcapping", None) if gemma else None,
        final_softcap=getattr(config, "final_logit_softcapping", None) if gemma else None,
        windows=windows,
        rope_kinds=tuple(config.layer_types) if two_ropes else (None,) * len(windows))


def norm_weight(norm: torch.nn.Module, traits: Traits) -> torch.Tensor:
    """The weight `rms_norm` multiplies by: Gemma's 1 + w is computed once here, in float32 as Gemma does."""
    w = norm.weight.detach()
    return 1.0 + w.float() if traits.gemma_norm else w


def norm_eps(norm: torch.nn.Module) -> float:
    return getattr(norm, "variance_epsilon", None) or norm.eps


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool) -> torch.Tensor:
    """As transformers' RMSNorms: statistics in float32; Llama scales after casting back (w * x.to(dtype)),
    Gemma before (x * (1 + w), then cast)."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (h * weight).type_as(x) if gemma else weight * h.to(x.dtype)


def softcap(x: torch.Tensor, cap: float | None) -> torch.Tensor:
    return x if cap is None else torch.tanh(x / cap) * cap


def rope_tables(rotary, like: torch.Tensor, positions: torch.Tensor, kinds: tuple[str | None, ...]):
    """cos and sin [R, len, head_dim] for each distinct rotary kind, from the model's own rotary module (so every
    static scaling is honoured); sin with its first half negated (see engine._rope). Returns (cos, sin, the table
    index of each layer)."""
    distinct = list(dict.fromkeys(kinds))
    cos, sin = [], []
    for kind in distinct:
        c, s = rotary(like, positions[None]) if kind is None else rotary(like, positions[None], kind)
        half = c.shape[-1] // 2
        cos.append(c[0])
        sin.append(torch.cat([-s[0, :, :half], s[0, :, half:]], dim=-1))
    return torch.stack(cos), torch.stack(sin), tuple(distinct.index(k) for k in kinds)
