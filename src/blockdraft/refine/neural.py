"""A small neural LM that rescores draft tokens: a 2-layer transformer over the last few tokens.

It borrows the target's frozen input embeddings and LM head (projected down to and up from a
narrow width), so the checkpoint holds only its own few layers and the draft-vocabulary map,
and it scores exactly the target's token ids. It reads a short window of recent tokens and is
recomputed from scratch on every call: with a 32-token window and width 256 a call costs well
under a millisecond on a CPU, far below the bookkeeping a KV cache would need.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from ..drafters.checkpoint import load_checkpoint, load_weights, save_drafter
from ..drafters.layers import FrozenLMHead


@dataclass
class NeuralLMConfig:
    embed_size: int  # the target's embedding width
    width: int = 256
    num_layers: int = 2
    num_heads: int = 4
    window: int = 32
    draft_vocab: int = 0
    training: dict = field(default_factory=dict)


class NeuralLM(nn.Module):
    """Causal transformer: token embeddings (target's, frozen) -> width -> layers -> target width -> LM head."""

    def __init__(self, c: NeuralLMConfig):
        super().__init__()
        self.config = c
        self.inp = nn.Linear(c.embed_size, c.width, bias=False)
        self.pos = nn.Parameter(torch.zeros(c.window, c.width))
        layer = nn.TransformerEncoderLayer(c.width, c.num_heads, 3 * c.width, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.layers = nn.TransformerEncoder(layer, c.num_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(c.width)
        self.out = nn.Linear(c.width, c.embed_size, bias=False)

    def forward(self, emb: torch.Tensor) -> torch.Tensor:
        """emb [B, T, E] (T <= window) -> states [B, T, E] for the LM head; position t sees tokens <= t."""
        T = emb.shape[1]
        x = self.inp(emb) + self.pos[:T]
        mask = nn.Transformer.generate_square_subsequent_mask(T, device=x.device, dtype=x.dtype)
        return self.out(self.norm(self.layers(x, mask=mask, is_causal=True)))


class NeuralRescorer:
    """The `Rescorer` protocol over a NeuralLM: log-probs of candidate tokens after each context."""

    kind = "neural-lm"

    def __init__(self, model: NeuralLM, embed: torch.Tensor, lm_head: FrozenLMHead):
        self.model = model.eval()
        self.config = model.config
        self.embed, self.lm_head = embed, lm_head
        self.order = model.config.window + 1
        self.t2d = lm_head.target_to_draft(embed.shape[0])

    @classmethod
    def from_pretrained(cls, folder, target) -> "NeuralRescorer":
        config, state = load_checkpoint(folder, cls.kind, target)
        vocab = state.pop("draft_vocab", None)
        cfg = NeuralLMConfig(**{k: v for k, v in config.items() if k in NeuralLMConfig.__dataclass_fields__})
        model = NeuralLM(cfg)
        load_weights(model, state, folder, target)  # in the target's dtype, on its device
        return cls.for_target(model, target, vocab)

    @classmethod
    def for_target(cls, model: NeuralLM, target, vocab: torch.Tensor | None = None) -> "NeuralRescorer":
        embed = target.model.get_input_embeddings().weight.detach()
        return cls(model, embed, FrozenLMHead(target.model.get_output_embeddings().weight, vocab))

    def save_pretrained(self, folder, target) -> None:
        save_drafter(folder, self.kind, self.model, self.lm_head, target)

    @torch.inference_mode()
    def score(self, contexts: np.ndarray, candidates: np.ndarray) -> np.ndarray:
        out = np.empty(candidates.shape)
        device = self.embed.device
        for i, (ctx, cand) in enumerate(zip(contexts, candidates, strict=True)):
            ctx = torch.as_tensor(ctx[ctx >= 0][-self.config.window:], dtype=torch.long, device=device)
            if len(ctx) == 0:
                out[i] = 0.0  # nothing to condition on: no opinion
                continue
            h = self.model(self.embed[ctx][None].to(self.model.inp.weight.dtype))[0, -1]
            logp = torch.log_softmax(self.lm_head(h).float(), -1)
            d = self.t2d[torch.as_tensor(cand, dtype=torch.long, device=device)]
            # a token outside the draft vocabulary gets the floor of the distribution; k scores go to the CPU
            out[i] = torch.where(d >= 0, logp[d.clamp_min(0)], logp.min()).cpu().numpy()
        return out
