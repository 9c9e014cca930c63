"""The DFlash drafter: one DFlashModel pass drafts gamma-1 tokens a step, from the target's features.

The network and its two styles are in dflash_model.py and dflash_styles.py; this is the drafting: the
context cache of projected target features (accepted tokens only), and the top-k lattice of each step.
"""

from __future__ import annotations

import torch

from ..errors import BlockdraftError
from .base import DraftContext, LatticeDrafter
from .checkpoint import load_checkpoint, load_weights, save_drafter
from .dflash_model import DFlashConfig, DFlashModel
from .lattice import DraftLattice
from .layers import FrozenLMHead

CONTEXT_CHUNK = 256  # the drafter's context cache grows in steps of this many tokens


class DFlashDrafter(LatticeDrafter):
    """Drafts gamma-1 tokens per step with one DFlashModel pass; proposes the chain of top-1 tokens."""

    name = "dflash"
    kind = "dflash"  # its checkpoints' kind (drafters/checkpoint.py)

    def __init__(self, model: DFlashModel, embed: torch.Tensor, lm_head: FrozenLMHead, top_k: int = 8,
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
    def from_pretrained(cls, folder, target, **kw) -> "DFlashDrafter":
        config, state = load_checkpoint(folder, cls.kind, target)
        vocab = state.pop("draft_vocab", None)
        fields = set(DFlashConfig.__dataclass_fields__)
        model = DFlashModel(DFlashConfig(**{k: v for k, v in config.items() if k in fields}))
        load_weights(model, state, folder, target)  # in the target's dtype, on its device
        return cls.for_target(model, target, vocab, **kw)

    @classmethod
    def for_target(cls, model: DFlashModel, target, vocab: torch.Tensor | None = None, **kw) -> "DFlashDrafter":
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
            raise BlockdraftError(f"the DFlash drafter expects {self.model.fc.in_features} feature values per token, "
                                  f"got {f.shape[-1]}: the target was set up with other feature layers")
        pos = torch.arange(self.n_ctx, self.n_ctx + len(f), device=f.device)
        h = self.model.project(f)
        self.last_features = f[-1]
        new = self.model.context(h, pos)
        end = self.n_ctx + len(f)
        # Written in place into buffers grown in chunks, not by concatenating the whole cache every step (an
        # O(context) copy). Even at ~4,000 tokens this measured no faster: the drafter's attention over the context
        # is what grows; the copy is simply not needed (BENCHMARKS.md, "Decisions": drafters' context cache).
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
            raise BlockdraftError(f"DFlash drafter context out of step: {self.n_ctx} features for "
                                  f"{len(ctx.tokens) - 1} committed tokens")
        if min(self.depth, ctx.max_depth) <= 0:
            return None
        lattice = self.draft_lattice(ctx.tokens[-1])
        self.last_lattice = DraftLattice(lattice.tokens[: self.depth], lattice.logp[: self.depth],
                                         lattice.entropy[: self.depth])
        return self.last_lattice
