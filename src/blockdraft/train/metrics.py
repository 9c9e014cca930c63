"""Teacher-forced draft quality on held-out data: top-1 agreement per depth and the chain's tau."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class DraftMetrics:
    """Teacher-forced draft quality: top-1 agreement with the target per depth, and the chain's tau.

    tau_tf = 1 + E[length of the run of depths whose draft equals the target's argmax]: the tau a
    chain would reach if the text so far were the target's own (an estimate, not a decoding run).
    """

    correct: list[float] = field(default_factory=list)
    counted: list[float] = field(default_factory=list)
    run_sum: float = 0.0
    n_anchors: int = 0

    def add(self, draft_top1: torch.Tensor, teacher_top1: torch.Tensor, valid: torch.Tensor) -> None:
        """[A, D] tensors: the drafted token, the target's argmax, and whether a teacher exists there."""
        hit = (draft_top1.cpu() == teacher_top1.cpu()) & valid.cpu()
        depth = hit.shape[1]
        if not self.correct:
            self.correct, self.counted = [0.0] * depth, [0.0] * depth
        for d in range(depth):
            self.correct[d] += float(hit[:, d].sum())
            self.counted[d] += float(valid[:, d].sum())
        full = valid.all(1)  # anchors whose whole block has teachers
        self.run_sum += float(hit[full].long().cumprod(1).sum())
        self.n_anchors += int(full.sum())

    @property
    def accuracy(self) -> list[float]:
        return [c / max(n, 1) for c, n in zip(self.correct, self.counted, strict=True)]

    @property
    def tau(self) -> float:
        return 1.0 + self.run_sum / max(self.n_anchors, 1)

    def summary(self) -> str:
        acc = " ".join(f"{a:.3f}" for a in self.accuracy)
        return f"top-1 agreement per depth: {acc}\nteacher-forced chain tau: {self.tau:.3f} ({self.n_anchors} blocks)"
