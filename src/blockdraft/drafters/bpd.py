"""The BPD drafter: blockwise parallel decoding heads (Stern et al. 2018; Kim et al. 2024) on the target's last state.

Head i reads h_t, the target's final (normed) hidden state at the last committed token, and
predicts the token i+1 places ahead (the target itself already gave the next one: the root).
h_t comes out of the verification pass that just ran, so drafting needs no extra target call:
verify of step t and predict of step t+1 are merged, as in the paper.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ..errors import BlockdraftError
from .base import DraftContext, LatticeDrafter
from .checkpoint import load_checkpoint, load_weights, save_drafter
from .lattice import DraftLattice
from .layers import FrozenLMHead, MedusaBlock, ResidualFFN

# Head bodies: "ffn" x + W2 SiLU(W1 x) (ours, an inner layer wider than the state), "medusa" x + SiLU(W x + b)
# (Medusa's ResidualBlock, the shape vLLM's MedusaModel runs: `blockdraft export --to vllm` needs it)
HEAD_STYLES = ("ffn", "medusa")


@dataclass
class BPDConfig:
    hidden_size: int
    feature_layer: int  # the target's hidden_states index of the final normed state (= num_layers)
    num_heads: int = 4
    inner_size: int = 1152  # the FFN's one hidden layer (style "ffn")
    draft_vocab: int = 0  # 0 = the target's full vocabulary
    style: str = "ffn"  # one of HEAD_STYLES
    medusa_layers: int = 1  # residual layers per head (style "medusa"; Medusa's medusa_num_layers)
    training: dict = field(default_factory=dict)


class BPDModel(nn.Module):
    """num_heads residual FFNs; head i maps h_t to a state the (frozen) LM head reads as token t+2+i."""

    def __init__(self, c: BPDConfig):
        super().__init__()
        if not 1 <= c.num_heads <= 16:
            raise BlockdraftError(f"BPD needs 1..16 heads, got {c.num_heads}")
        if c.style not in HEAD_STYLES:
            raise BlockdraftError(f"unknown BPD head style '{c.style}': choose one of {', '.join(HEAD_STYLES)}")
        self.config = c
        if c.style == "medusa":
            self.heads = nn.ModuleList(MedusaBlock(c.hidden_size, c.medusa_layers) for _ in range(c.num_heads))
        else:
            self.heads = nn.ModuleList(ResidualFFN(c.hidden_size, c.inner_size) for _ in range(c.num_heads))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """h [..., H] -> [..., num_heads, H]."""
        return torch.stack([head(h) for head in self.heads], dim=-2)


class BPDDrafter(LatticeDrafter):
    """Chain drafter: the top-1 token of every head (the lattice keeps the top-k for refiners)."""

    name = "bpd"
    kind = "bpd"  # its checkpoints' kind (drafters/checkpoint.py)

    def __init__(self, model: BPDModel, lm_head: FrozenLMHead, top_k: int = 8, num_heads: int | None = None,
                 embed: torch.Tensor | None = None):
        self.model = model.eval()
        self.embed = embed  # the target's input embeddings: what a parent-conditioned (Hydra-like) module reads
        self.last_hidden: torch.Tensor | None = None  # the heads' states of the last lattice [heads, H]
        self.last_logits: torch.Tensor | None = None  # and their logits [heads, draft vocabulary]
        self.config = model.config
        self.lm_head = lm_head
        self.top_k = top_k
        self.num_heads = min(num_heads or self.config.num_heads, self.config.num_heads)
        self.feature_layers = (self.config.feature_layer,)
        self.last_lattice: DraftLattice | None = None  # for analysis

    @classmethod
    def from_pretrained(cls, folder, target, **kw) -> "BPDDrafter":
        config, state = load_checkpoint(folder, cls.kind, target)
        vocab = state.pop("draft_vocab", None)
        cfg = BPDConfig(**{k: v for k, v in config.items() if k in BPDConfig.__dataclass_fields__})
        model = BPDModel(cfg)
        load_weights(model, state, folder, target)  # in the target's dtype, on its device
        head = FrozenLMHead(target.model.get_output_embeddings().weight, vocab)
        return cls(model, head, embed=target.model.get_input_embeddings().weight.detach(), **kw)

    def save_pretrained(self, folder, target) -> None:
        save_drafter(folder, self.kind, self.model, self.lm_head, target)

    @torch.inference_mode()
    def draft_lattice(self, h: torch.Tensor) -> DraftLattice:
        w = next(self.model.parameters())  # the heads' own dtype: the target's, once loaded for it
        states = self.model(h.to(w.dtype))[: self.num_heads]
        self.last_hidden = states
        self.last_logits = self.lm_head(states)  # over the draft vocabulary, on the device (TreeFlash's columns)
        return DraftLattice.from_logits(self.last_logits, self.top_k, self.lm_head.vocab)

    def lattice(self, ctx: DraftContext) -> DraftLattice | None:
        """The heads' top-k lattice for this step (None when there is no target state to read yet)."""
        if ctx.features is None or len(ctx.features) == 0 or min(self.num_heads, ctx.max_depth) <= 0:
            return None  # e.g. a one-token prompt
        self.last_lattice = self.draft_lattice(ctx.features[-1])
        return self.last_lattice
