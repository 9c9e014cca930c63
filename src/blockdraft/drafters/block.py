"""One-shot block drafter (DFlash-style): a few layers draft gamma-1 tokens in one forward pass.

The drafter reads the target's hidden states of several layers (concatenated, projected and
RMS-normed: the "context") as extra keys/values in every layer; its queries come only from the
block [last token, MASK x (gamma-1)], which attends to the whole context and to itself
(non-causally). Embeddings and LM head are the target's, frozen.

The attention is hand-written (about 30 lines) because no transformers layer takes keys and
values from a second sequence of features; everything else is plain torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn import functional as F

from ..errors import BlockdraftError
from .base import DraftContext, LatticeDrafter
from .checkpoint import load_checkpoint, load_weights, save_drafter
from .lattice import DraftLattice
from .layers import FrozenLMHead

# "blockdraft": the drafter described above. "dflash": the architecture vLLM's DFlashDraftModel runs
# (vllm/model_executor/models/qwen3_dflash.py), so that `blockdraft export --to vllm` can write it exactly:
# per-head RMSNorm on queries and keys, block inputs that are plain embeddings [root, MASK x (gamma-1)] with
# MASK the target's own embedding of `mask_token_id`, features scaled but not centred, no final-state feature.
BLOCK_STYLES = ("blockdraft", "dflash")
CONTEXT_CHUNK = 256  # the block drafter's context cache grows in steps of this many tokens


@dataclass
class BlockConfig:
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
    # The last feature layer is the target's final normed state, added to every block input (see block_inputs)
    final_state_residual: bool = False
    # Medusa-style start: every layer's output projections and the MASK embeddings at zero, and a zero gate
    # on the added inputs, so that an untrained drafter predicts exactly what the target's LM head reads
    # from its final state. Off by default: at equal steps it matched the plain start (validation tau
    # 1.202 vs 1.204 after ~826 steps).
    zero_init: bool = False
    style: str = "blockdraft"  # one of BLOCK_STYLES
    mask_token_id: int = 0  # style "dflash": the token whose (frozen) target embedding fills the MASK positions
    training: dict = field(default_factory=dict)  # how the checkpoint was made (for the record)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @classmethod
    def for_target(cls, target, feature_layers, **kw) -> "BlockConfig":
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


class BlockLayer(nn.Module):
    """A Llama decoder layer whose keys/values also cover the projected target context."""

    def __init__(self, c: BlockConfig):
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
        if c.style == "dflash":  # Qwen3's QK-norm, which vLLM's DFlash attention always applies
            self.q_norm = nn.RMSNorm(hd, eps=c.rms_eps)
            self.k_norm = nn.RMSNorm(hd, eps=c.rms_eps)

    def kv(self, h: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (rotated) and values [kv_heads, n, head_dim] of already-normed states h [n, H]."""
        c = self.c
        k = self.k_proj(h).view(-1, c.num_kv_heads, c.head_dim).transpose(0, 1)
        v = self.v_proj(h).view(-1, c.num_kv_heads, c.head_dim).transpose(0, 1)
        if c.style == "dflash":
            k = self.k_norm(k)
        return rope(k, pos, c.rope_theta), v

    def forward(self, x, pos, ctx_k, ctx_v, mask=None):
        c = self.c
        h = self.input_norm(x)
        q = self.q_proj(h).view(-1, c.num_heads, c.head_dim).transpose(0, 1)
        if c.style == "dflash":
            q = self.q_norm(q)
        q = rope(q, pos, c.rope_theta)
        k, v = self.kv(h, pos)
        k, v = torch.cat([ctx_k, k], 1), torch.cat([ctx_v, v], 1)
        # Grouped-query attention folded into a longer query, as in the target's engine (model/engine.py):
        # the `group` query heads that share a KV head are contiguous, so [heads, n, hd] views as
        # [kv_heads, group * n, hd], each row under its token's mask row. 4-D inputs also let SDPA take its
        # fused CPU kernel; the 3-D, repeat_interleave'd form ran the math path, which at ~4,000 context
        # tokens spent ~5 ms per layer copying and scaling the keys.
        group, n = c.num_heads // c.num_kv_heads, x.shape[0]
        if mask is not None:
            mask = mask.repeat(group, 1)[None, None]
        a = F.scaled_dot_product_attention(q.reshape(1, c.num_kv_heads, group * n, c.head_dim), k[None], v[None],
                                           attn_mask=mask)
        x = x + self.o_proj(a.reshape(c.num_heads, n, c.head_dim).transpose(0, 1).reshape(n, -1))
        h = self.post_norm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class BlockModel(nn.Module):
    """The trainable part of the block drafter (embeddings and LM head stay the target's)."""

    def __init__(self, c: BlockConfig):
        super().__init__()
        if c.style not in BLOCK_STYLES:
            raise BlockdraftError(f"unknown block drafter style '{c.style}': choose one of {', '.join(BLOCK_STYLES)}")
        if c.style == "dflash" and (c.final_state_residual or c.zero_init):
            raise BlockdraftError("the 'dflash' block drafter style takes no extra block inputs "
                                  "(final_state_residual, zero_init)")
        self.config = c
        self.fc = nn.Linear(len(c.feature_layers) * c.hidden_size, c.hidden_size, bias=False)
        self.context_norm = nn.RMSNorm(c.hidden_size, eps=c.rms_eps)
        self.layers = nn.ModuleList(BlockLayer(c) for _ in range(c.num_layers))
        self.norm = nn.RMSNorm(c.hidden_size, eps=c.rms_eps)
        if c.style == "blockdraft":  # (style "dflash" reads the target's embedding of mask_token_id instead)
            self.mask_embedding = nn.Parameter(torch.randn(c.gamma - 1, c.hidden_size) * 0.02)  # one per depth
        # Per-dimension standardisation of the target features. Small Llamas have "massive activations"
        # (SmolLM2-135M: one dimension with std ~1100 where the median is ~5), which would otherwise
        # dominate the projection and starve the drafter of context until training suppressed them.
        n_feat = len(c.feature_layers) * c.hidden_size
        self.register_buffer("feature_mean", torch.zeros(n_feat))
        self.register_buffer("feature_scale", torch.ones(n_feat))
        if c.zero_init:
            self.input_gate = nn.Parameter(torch.zeros(1))
            with torch.no_grad():
                self.mask_embedding.zero_()
                for layer in self.layers:
                    layer.o_proj.weight.zero_()
                    layer.down_proj.weight.zero_()

    def set_feature_stats(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        if self.config.style == "dflash":
            # Scale only, by the per-dimension RMS: vLLM's fc has no bias, so a subtracted mean could not be
            # exported, while a scale folds into fc's columns exactly (export/vllm.py).
            self.feature_mean.zero_()
            self.feature_scale.copy_(1.0 / (mean.square() + std.square()).sqrt().clamp_min(1e-3))
            return
        self.feature_mean.copy_(mean)
        self.feature_scale.copy_(1.0 / std.clamp_min(1e-3))

    def init_from_target(self, target_model) -> None:
        """Optionally start from the target's last layers and final norm (same shapes; the MASK embeddings
        become the mean embedding). Off by default: on our 2-core runs it did not learn faster than a
        fresh start (BlockTrainConfig.init_from_target)."""
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
            if self.config.style == "blockdraft":
                self.mask_embedding.copy_(body.embed_tokens.weight.mean(0).expand_as(self.mask_embedding))

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """Target features [n, len(layers)*H] -> context states [n, H]."""
        return self.context_norm(self.fc((features - self.feature_mean) * self.feature_scale))

    def context(self, h: torch.Tensor, pos: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per-layer keys/values of projected context states h [n, H] at positions pos."""
        return [layer.kv(h, pos) for layer in self.layers]

    def block_inputs(self, root_emb: torch.Tensor, last_features: torch.Tensor, mask_emb: torch.Tensor | None = None
                     ) -> torch.Tensor:
        """Root embeddings [A, H] and raw target features of the token before the root [A, F] -> inputs [A, gamma, H].

        Style "dflash" (DFlash's own inputs): [root embedding, mask_emb x (gamma-1)], mask_emb [H] being the
        target's embedding of mask_token_id; depths differ by position only, context comes by attention.

        Position 0 is the root, positions 1.. are MASK (one learned embedding per depth). Every
        position also gets the root's embedding, the projected last context state and (with
        `final_state_residual`) the target's final hidden state there. DFlash leaves all of this to
        attention; but a freshly initialised drafter spreads its attention over hundreds of context
        keys, and in a CPU-sized training budget it never learned to find them (depth-1 agreement
        stayed near the unigram level, 5-9%, after 30k blocks). The final state is what the frozen
        LM head reads, so the drafter starts, like Medusa heads, from the target's own prediction.
        """
        if self.config.style == "dflash":
            masks = mask_emb.to(root_emb.dtype).expand(len(root_emb), self.config.gamma - 1, -1)
            return torch.cat([root_emb[:, None], masks], 1)
        shared = root_emb + self.project(last_features)
        if self.config.zero_init:
            shared = shared * self.input_gate
        if self.config.final_state_residual:
            shared = shared + last_features[:, -self.config.hidden_size :]
        shared = shared[:, None]
        first = torch.zeros_like(self.mask_embedding[:1])
        return shared + torch.cat([first, self.mask_embedding])[None]

    def forward(self, x, pos, ctx_kv, mask=None) -> torch.Tensor:
        """Block inputs x [n, H] at positions pos -> final-normed hidden states [n, H]."""
        for layer, (k, v) in zip(self.layers, ctx_kv, strict=True):
            x = layer(x, pos, k, v, mask)
        return self.norm(x)


class BlockDrafter(LatticeDrafter):
    """Drafts gamma-1 tokens per step with one BlockModel pass; proposes the chain of top-1 tokens."""

    name = "dflash"
    kind = "block"

    def __init__(self, model: BlockModel, embed: torch.Tensor, lm_head: FrozenLMHead, top_k: int = 8,
                 depth: int | None = None):
        self.model = model.eval()
        self.config = model.config
        self.embed = embed  # the target's input embedding matrix (frozen, shared)
        self.lm_head = lm_head
        self.top_k = top_k
        # Drafts per step (default gamma-1): a shorter chain is cheaper to verify on slow hardware.
        self.depth = min(depth or self.config.gamma - 1, self.config.gamma - 1)
        self.feature_layers = tuple(self.config.feature_layers)
        self.last_lattice: DraftLattice | None = None  # the last proposal's lattice, for analysis
        self.reset([])

    # --- checkpoints -----------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, folder, target, **kw) -> "BlockDrafter":
        config, state = load_checkpoint(folder, cls.kind, target)
        vocab = state.pop("draft_vocab", None)
        fields = set(BlockConfig.__dataclass_fields__)
        cfg = BlockConfig(**{k: v for k, v in config.items() if k in fields})
        cfg.feature_layers = tuple(cfg.feature_layers)
        model = BlockModel(cfg)
        load_weights(model, state, folder, target)  # in the target's dtype, on its device
        return cls.for_target(model, target, vocab, **kw)

    @classmethod
    def for_target(cls, model: BlockModel, target, vocab: torch.Tensor | None = None, **kw) -> "BlockDrafter":
        weights = target.model.get_input_embeddings().weight.detach()
        head = FrozenLMHead(target.model.get_output_embeddings().weight, vocab)
        return cls(model, weights, head, **kw)

    def save_pretrained(self, folder, target) -> None:
        save_drafter(folder, self.kind, self.model, self.lm_head, target)

    # --- drafting --------------------------------------------------------------------
    def reset(self, prompt_ids) -> None:
        self._keys: list[torch.Tensor] = []  # per layer [kv_heads, capacity, head_dim], filled up to n_ctx
        self._values: list[torch.Tensor] = []
        self.n_ctx = 0
        self._pending: list[torch.Tensor] = []  # features observed while not drafting, projected when next drafting
        self.last_features = None  # raw target features of the newest committed token

    @property
    def ctx_kv(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The context cache's keys and values per layer, [kv_heads, n_ctx, head_dim] each."""
        if not self._keys:
            w = self.model.fc.weight  # the drafter's dtype and device (the target's, once loaded for it)
            empty = torch.zeros(self.config.num_kv_heads, 0, self.config.head_dim, dtype=w.dtype, device=w.device)
            return [(empty, empty)] * self.config.num_layers
        return [(k[:, : self.n_ctx], v[:, : self.n_ctx]) for k, v in zip(self._keys, self._values, strict=True)]

    @torch.inference_mode()
    def _append(self, features: torch.Tensor | None) -> None:
        """Project newly committed target features into the drafter's context cache (accepted tokens only)."""
        if features is None or len(features) == 0:
            return
        f = features.to(self.model.fc.weight.dtype)
        if f.shape[-1] != self.model.fc.in_features:
            raise BlockdraftError(f"the block drafter expects {self.model.fc.in_features} feature values per token, "
                                  f"got {f.shape[-1]}: the target was set up with other feature layers")
        pos = torch.arange(self.n_ctx, self.n_ctx + len(f), device=f.device)
        h = self.model.project(f)
        self.last_features = f[-1]
        new = self.model.context(h, pos)
        end = self.n_ctx + len(f)
        # Written in place into buffers grown in chunks, not by concatenating the whole cache every step (an
        # O(context) copy). At ~4,000 tokens this measured no faster (TreeFlash drafting 17.8 vs 17.3 ms a step):
        # the drafter's attention over the context is what grows; the copy is simply not needed.
        if not self._keys or end > self._keys[0].shape[1]:
            capacity = -(-end // CONTEXT_CHUNK) * CONTEXT_CHUNK
            grown = [(k.new_empty(k.shape[0], capacity, k.shape[2]), v.new_empty(v.shape[0], capacity, v.shape[2]))
                     for k, v in new]
            for (k, v), (old_k, old_v) in zip(grown, self.ctx_kv, strict=False):  # nothing to copy at first
                k[:, : self.n_ctx], v[:, : self.n_ctx] = old_k, old_v
            self._keys, self._values = [k for k, _ in grown], [v for _, v in grown]
        for buf_k, buf_v, (k, v) in zip(self._keys, self._values, new, strict=True):
            buf_k[:, self.n_ctx : end], buf_v[:, self.n_ctx : end] = k, v
        self.n_ctx = end

    @torch.inference_mode()
    def draft_lattice(self, root: int) -> DraftLattice:
        g = self.config.gamma
        last = self.last_features if self.last_features is not None else self.model.feature_mean
        x = self.model.block_inputs(self.embed[root][None], last[None], self.embed[self.config.mask_token_id])[0]
        x = x.to(self.model.fc.weight.dtype)
        pos = torch.arange(self.n_ctx, self.n_ctx + g, device=x.device)
        h = self.model(x, pos, self.ctx_kv)
        self.last_hidden = h[1:]  # the block's states and logits per depth, for TreeFlash's AR approximation
        self.last_logits = self.lm_head(h[1:])
        return DraftLattice.from_logits(self.last_logits, self.top_k, self.lm_head.vocab)

    def observe(self, ctx: DraftContext) -> None:
        if ctx.features is not None and len(ctx.features):
            self._pending.append(ctx.features)  # projected in one batch when drafting resumes

    def lattice(self, ctx: DraftContext) -> DraftLattice | None:
        """Take in the newly committed features, then draft this step's top-k lattice (None: nothing to draft)."""
        if self._pending:
            self._append(torch.cat(self._pending + ([ctx.features] if ctx.features is not None else [])))
            self._pending = []
        else:
            self._append(ctx.features)
        if self.n_ctx != len(ctx.tokens) - 1:  # e.g. a one-token prompt: no context yet
            raise BlockdraftError(f"block drafter context out of step: {self.n_ctx} features for "
                                  f"{len(ctx.tokens) - 1} committed tokens")
        if min(self.depth, ctx.max_depth) <= 0:
            return None
        lattice = self.draft_lattice(ctx.tokens[-1])
        self.last_lattice = DraftLattice(lattice.tokens[: self.depth], lattice.logp[: self.depth],
                                         lattice.entropy[: self.depth])
        return self.last_lattice
