"""Small building blocks the neural drafters share: residual FFN and the frozen target LM head."""

from __future__ import annotations

import torch
from torch import nn

from ..model import packing


class ResidualFFN(nn.Module):
    """x + W2 SiLU(W1 x). W2 starts at zero, so an untrained block is the identity (as in Medusa)."""

    def __init__(self, hidden: int, inner: int):
        super().__init__()
        self.up = nn.Linear(hidden, inner, bias=False)
        self.down = nn.Linear(inner, hidden, bias=False)
        nn.init.zeros_(self.down.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(nn.functional.silu(self.up(x)))


class MedusaBlock(nn.Module):
    """Medusa's head body, x <- x + SiLU(W x + b) per layer with W square (vLLM's ResidualBlock, medusa.py).

    W and b start at zero, so an untrained head is the identity and predicts what the target's own
    LM head reads from h_t, as in Medusa. Unlike ResidualFFN there is no projection after the SiLU.
    """

    def __init__(self, hidden: int, num_layers: int = 1, bias: bool = True):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(hidden, hidden, bias=bias) for _ in range(num_layers))
        for layer in self.layers:
            nn.init.zeros_(layer.weight)
            if bias:
                nn.init.zeros_(layer.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + nn.functional.silu(layer(x))
        return x


class FrozenLMHead(nn.Module):
    """The target's LM head, restricted to a draft vocabulary (EAGLE-3 style).

    The weights are the target's (never trained, never saved in a drafter checkpoint); only the
    draft->target id map `vocab` is the drafter's own. Scoring 8k instead of 49k tokens makes
    training and drafting several times cheaper; drafts outside the draft vocabulary are simply
    never proposed, which costs acceptance only when the target would pick such a rare token.
    """

    def __init__(self, weight: torch.Tensor, vocab: torch.Tensor | None):
        super().__init__()
        self.register_buffer("vocab", None if vocab is None else vocab.long().to(weight.device), persistent=False)
        w = weight.detach() if vocab is None else weight.detach()[vocab.long()]
        self.register_buffer("weight", w.clone(), persistent=False)
        self.packed = self.int8 = None

    def prepack(self, int8: bool | str = False) -> None:
        """Pack the weight for oneDNN inference, with an int8 copy for few-row calls as `int8` says (see
        model/packing.py); called for decoding only."""
        self.packed = packing.pack(self.weight)
        self.int8 = packing.quantize(self.weight) if packing.wants_int8(self.weight, int8) else None

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if (self.packed is not None or self.int8 is not None) and h.dtype == self.weight.dtype:
            return packing.linear(h, self.weight, None, self.packed, self.int8)
        return h @ self.weight.to(h.dtype).T

    def to_target_ids(self, ids: torch.Tensor) -> torch.Tensor:
        return ids if self.vocab is None else self.vocab[ids]

    def target_to_draft(self, vocab_size: int) -> torch.Tensor:
        """[V] long: the draft id of each target token, -1 for tokens outside the draft vocabulary (on the
        head's device)."""
        inv = torch.full((vocab_size,), -1, dtype=torch.long, device=self.weight.device)
        ids = torch.arange(vocab_size, device=inv.device) if self.vocab is None else self.vocab
        inv[ids] = torch.arange(len(ids), device=inv.device)
        return inv


def frequent_tokens(counts: torch.Tensor, size: int, always: list[int] = ()) -> torch.Tensor:
    """The `size` most frequent token ids (plus `always`, e.g. EOS), sorted by id."""
    counts = counts.clone().double()
    counts[list(always)] = float("inf")
    return counts.topk(min(size, counts.numel())).indices.sort().values
