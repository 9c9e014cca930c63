"""Training precision: float32 weights (trainable and frozen copies), forward passes autocast to a bf16 target."""

from __future__ import annotations

import torch


def mixed_precision(target):
    """Autocast the forward passes to the target's dtype when it is bfloat16: the trainable weights stay
    float32 (and are saved as before), the matmuls run in bf16 (about 2x faster with AMX). float16 has no
    loss scaling here, so with a float16 target (and in float32) drafters train in float32."""
    return torch.autocast(target.device.type, dtype=torch.bfloat16, enabled=target.dtype == torch.bfloat16)


def frozen_float32(weight: torch.Tensor) -> torch.Tensor:
    """A float32 copy of a frozen target matrix (embeddings, LM head) on its device, for training."""
    return weight.detach().to(torch.float32)


def for_training(drafter):
    """A drafter loaded for a target (in its dtype) back in float32 on the same device: fine-tuning starts
    from float32 weights, and a frozen base mixes with the float32 module trained on top of it."""
    drafter.model.float()
    drafter.lm_head.float()
    if getattr(drafter, "embed", None) is not None:
        drafter.embed = frozen_float32(drafter.embed)
    if hasattr(drafter, "reset"):
        drafter.reset([])
    return drafter
