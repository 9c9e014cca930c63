"""Distillation from the target: its top-K teacher distributions, the loss towards them, and depth weights."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .features import FeatureStore


@dataclass
class Teacher:
    """Soft targets in draft-vocabulary ids: ids [..., K] (-1: outside the draft vocabulary), probs [..., K]."""

    ids: torch.Tensor
    probs: torch.Tensor
    top1: torch.Tensor  # [...] the teacher's most likely token, in *target* ids (for accuracy)

    @classmethod
    def gather(cls, store: FeatureStore, rows: np.ndarray, target_to_draft: torch.Tensor) -> "Teacher":
        """The teacher at store rows, on the device of `target_to_draft` (the drafter's)."""
        device = target_to_draft.device
        ids = torch.from_numpy(np.asarray(store.topk_ids[rows.reshape(-1)], dtype=np.int64)).to(device)
        logp = torch.from_numpy(np.asarray(store.topk_logp[rows.reshape(-1)], dtype=np.float32)).to(device)
        d = target_to_draft[ids]
        p = logp.exp() * (d >= 0)
        p = p / p.sum(-1, keepdim=True).clamp_min(1e-9)  # the teacher's top-K, renormalised over the draft vocabulary
        shape = (*rows.shape, ids.shape[-1])
        return cls(d.view(shape), p.view(shape), ids[:, 0].view(rows.shape))


def distill_loss(logits: torch.Tensor, teacher: Teacher, weight: torch.Tensor) -> torch.Tensor:
    """Forward KL to the teacher's (top-K) distribution, up to a constant: -sum_j p_j log q(j).

    logits [..., V'], teacher [..., K], weight [...] (0 where there is no target). Returns the weighted mean.
    """
    logq = torch.log_softmax(logits.float(), -1)
    picked = logq.gather(-1, teacher.ids.clamp_min(0))
    per_row = -(teacher.probs * picked).sum(-1)
    weight = weight.to(per_row.device)
    return (per_row * weight).sum() / weight.sum().clamp_min(1e-9)


def depth_weights(depth: int, decay: float) -> torch.Tensor:
    """w_k = exp(-(k-1)/decay): early drafts matter most, since a miss there ends the accepted run."""
    return torch.exp(-torch.arange(depth, dtype=torch.float32) / decay)
