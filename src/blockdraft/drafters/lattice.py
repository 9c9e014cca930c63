"""DraftLattice: the top-k tokens and log-probs a drafter proposes at every depth."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class DraftLattice:
    """A "sausage lattice" (confusion network): depth d offers tokens[d, :k] with scores logp[d, :k].

    Depth 0 is the first token after the root. Token ids are the target's. Tree builders and
    refiners read this; a chain takes the best token at every depth. It lives on the CPU: the
    top-k is taken on the drafter's device and only these D x k values cross over, once per step.
    """

    tokens: torch.Tensor  # [D, k] long, best first
    logp: torch.Tensor  # [D, k] float, log-probabilities under the drafter
    entropy: torch.Tensor | None = None  # [D] entropy (nats) of each depth's full draft distribution

    @classmethod
    def from_logits(cls, logits: torch.Tensor, k: int, vocab_map: torch.Tensor | None = None) -> "DraftLattice":
        """Top-k of per-depth logits [D, V']; `vocab_map` maps draft-vocabulary ids to target ids."""
        logp = torch.log_softmax(logits.float(), dim=-1)
        top = logp.topk(min(k, logp.shape[-1]), dim=-1)
        tokens = top.indices if vocab_map is None else vocab_map[top.indices]
        entropy = -(logp.exp() * logp).sum(-1)
        return cls(tokens.cpu(), top.values.cpu(), entropy.cpu())

    @property
    def depth(self) -> int:
        return self.tokens.shape[0]

    def best(self) -> torch.Tensor:
        return self.tokens[:, 0]
