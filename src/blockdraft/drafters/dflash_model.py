"""The DFlash drafter's network: a few Llama layers whose keys and values also cover the projected target context.

The drafter reads the target's hidden states of several layers (concatenated, projected and
RMS-normed: the "context") as extra keys/values in every layer; its queries come only from the
block [last token, MASK x (gamma-1)], which attends to the whole context and to itself
(non-causally). Embeddings and LM head are the target's, frozen. What the block's inputs carry
depends on the style (dflash_styles.py).

The attention is hand-written (about 30 lines) because no transformers layer takes keys and
values from a second sequence of features; everything else is plain torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn import functional as F

from .dflash_styles import STYLES, style_name


@dataclass
class DFlashConfig:
    hidden_size: int
    feature_layers: tuple[int, ...]  # target hidden_states indices, concatenated in this order
    num_layers: int = 2
    num_heads: int = 9
    num_kv_heads: int = 3
    intermediate_size: int = 1536
    gamma: int = 8  # block size: the last token + gamma-1 drafted positions
    rope_theta: float = 100000.0
    rms_eps: float = 1e-5
    draft_vocab: int = 0  # 0 = the target's full vocabulary
    # The last feature layer is the target's final normed state, added to every block input (style "seeded")
    final_state_residual: bool = False
    # Medusa-style start: every layer's output projections and the MASK embeddings at zero, and a zero gate
    # on the added inputs, so that an untrained drafter predicts exactly what the target's LM head reads
    # from its final state. Off by default: at equal steps it matched the plain start (validation tau
    # 1.202 vs 1.204 after ~826 steps).
    zero_init: bool = False
    style: str = "seeded"  # one of dflash_styles.STYLES ("blockdraft" and "dflash", their old names, load too)
    mask_token_id: int = 0  # style "vllm": the token whose (frozen) target embedding fills the MASK positions
    training: dict = field(default_factory=dict)  # how the checkpoint was made (for the record)

    def __post_init__(self):
        self.style = style_name(self.style)
        self.feature_layers = tuple(self.feature_layers)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @classmethod
    def for_target(cls, target, feature_layers, **kw) -> "DFlashConfig":
        c = target.config
        return cls(hidden_size=target.hidden_size, feature_layers=tuple(feature_layers),
                   num_heads=c.num_attention_heads, num_kv_heads=getattr(c, "num_key_value_heads", None)
                   or c.num_attention_heads, intermediate_size=c.intermediate_size,
                   rope_theta=_rope_theta(c), rms_eps=getattr(c, "rms_norm_eps", 1e-5), **kw)


def _rope_theta(config) -> float:
    rope = getattr(config, "rope_parameters", None) or {}
    return float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary position embedding (Llama's rotate-half convention) on x [heads, n, head_dim]."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d)
    ang = pos.float()[:, None] * inv[None]  # [n, d/2]
    cos, sin = torch.cat([ang, ang], -1).cos().to(x.dtype), torch.cat([ang, ang], -1).sin().to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class DFlashLayer(nn.Module):
    """A Llama decoder layer whose keys/values also cover the projected target context."""

    def __init__(self, c: DFlashConfig):
        super().__init__()
        h, hd = c.hidden_size, c.head_dim
        self.c = c
        self.q_proj = nn.Linear(h, c.num_heads * hd, bias=False)
        self.k_proj = nn.Linear(h, c.num_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(h, c.num_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(c.num_heads * hd, h, bias=False)
        self.gate_proj = nn.Linear(h, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(h, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, h, bias=False)
        self.input_norm = nn.RMSNorm(h, eps=c.rms_eps)
        self.post_norm = nn.RMSNorm(h, eps=c.rms_eps)
        qk_norm = STYLES[c.style].qk_norm  # per-head RMSNorm on queries and keys, or none (no weights either)
        self.q_norm = nn.RMSNorm(hd, eps=c.rms_eps) if qk_norm else nn.Identity()
        self.k_norm = nn.RMSNorm(hd, eps=c.rms_eps) if qk_norm else nn.Identity()

    def kv(self, h: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (rotated) and values [kv_heads, n, head_dim] of already-normed states h [n, H]."""
        c = self.c
        k = self.k_norm(self.k_proj(h).view(-1, c.num_kv_heads, c.head_dim).transpose(0, 1))
        v = self.v_proj(h).view(-1, c.num_kv_heads, c.head_dim).transpose(0, 1)
        return rope(k, pos, c.rope_theta), v

    def forward(self, x, pos, ctx_k, ctx_v, mask=None):
        c = self.c
        h = self.input_norm(x)
        q = rope(self.q_norm(self.q_proj(h).view(-1, c.num_heads, c.head_dim).transpose(0, 1)), pos, c.rope_theta)
        k, v = self.kv(h, pos)
        k, v = torch.cat([ctx_k, k], 1), torch.cat([ctx_v, v], 1)
        # Grouped-query attention folded into a longer query, as in the target's engine (model/engine.py):
        # the `group` query heads that share a KV head are contiguous, so [heads, n, hd] views as
        # [kv_heads, group * n, hd], each row under its token's mask row. 4-D inputs also let SDPA take its
        # fused CPU kernel; the 3-D, repeat_interleave'd form ran the math path, which copies and scales every
        # key of the context in each layer (BENCHMARKS.md, "Decisions": grouped-query attention).
        group, n = c.num_heads // c.num_kv_heads, x.shape[0]
        if mask is not None:
            mask = mask.repeat(group, 1)[None, None]
        a = F.scaled_dot_product_attention(q.reshape(1, c.num_kv_heads, group * n, c.head_dim), k[None], v[None],
                                           attn_mask=mask)
        x = x + self.o_proj(a.reshape(c.num_heads, n, c.head_dim).transpose(0, 1).reshape(n, -1))
        h = self.post_norm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class DFlashModel(nn.Module):
    """The trainable part of the DFlash drafter (embeddings and LM head stay the target's)."""

    def __init__(self, c: DFlashConfig):
        super().__init__()
        self.style = STYLES[c.style]
        self.style.check(c)
        self.config = c
        self.fc = nn.Linear(len(c.feature_layers) * c.hidden_size, c.hidden_size, bias=False)
        self.context_norm = nn.RMSNorm(c.hidden_size, eps=c.rms_eps)
        self.layers = nn.ModuleList(DFlashLayer(c) for _ in range(c.num_layers))
        self.norm = nn.RMSNorm(c.hidden_size, eps=c.rms_eps)
        self.style.add_parameters(self, c)  # e.g. the learned MASK embeddings (style "seeded")
        # Per-dimension standardisation of the target features. Small Llamas have "massive activations"
        # (SmolLM2-135M: one dimension with std ~1100 where the median is ~5), which would otherwise
        # dominate the projection and starve the drafter of context until training suppressed them.
        n_feat = len(c.feature_layers) * c.hidden_size
        self.register_buffer("feature_mean", torch.zeros(n_feat))
        self.register_buffer("feature_scale", torch.ones(n_feat))

    def set_feature_stats(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        self.style.set_feature_stats(self, mean, std)

    def init_from_target(self, target_model) -> None:
        """Optionally start from the target's last layers and final norm (same shapes; the MASK embeddings
        become the mean embedding). Off by default: on our 2-core runs it did not learn faster than a
        fresh start (DFlashTrainConfig.init_from_target)."""
        body = target_model.model
        src_layers = body.layers[-len(self.layers):]
        with torch.no_grad():
            for mine, theirs in zip(self.layers, src_layers, strict=True):
                at, mlp = theirs.self_attn, theirs.mlp
                for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                    getattr(mine, name).weight.copy_(getattr(at, name).weight)
                for name in ("gate_proj", "up_proj", "down_proj"):
                    getattr(mine, name).weight.copy_(getattr(mlp, name).weight)
                mine.input_norm.weight.copy_(theirs.input_layernorm.weight)
                mine.post_norm.weight.copy_(theirs.post_attention_layernorm.weight)
            self.norm.weight.copy_(body.norm.weight)
            self.style.init_from_target(self, body)

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """Target features [n, len(layers)*H] -> context states [n, H]."""
        return self.context_norm(self.fc((features - self.feature_mean) * self.feature_scale))

    def context(self, h: torch.Tensor, pos: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per-layer keys/values of projected context states h [n, H] at positions pos."""
        return [layer.kv(h, pos) for layer in self.layers]

    def block_inputs(self, root_emb: torch.Tensor, last_features: torch.Tensor, mask_emb: torch.Tensor | None = None
                     ) -> torch.Tensor:
        """Root embeddings [A, H] and raw target features of the token before the root [A, F] -> inputs
        [A, gamma, H]; mask_emb [H] is the target's embedding of mask_token_id (style "vllm" reads it)."""
        return self.style.block_inputs(self, root_emb, last_features, mask_emb)

    def forward(self, x, pos, ctx_kv, mask=None) -> torch.Tensor:
        """Block inputs x [n, H] at positions pos -> final-normed hidden states [n, H]."""
        for layer, (k, v) in zip(self.layers, ctx_kv, strict=True):
            x = layer(x, pos, k, v, mask)
        return self.norm(x)
