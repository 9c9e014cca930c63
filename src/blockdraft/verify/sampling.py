"""SamplingParams: temperature, top-k and top-p turned into the target distribution we sample from."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import BlockdraftError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 means greedy
    top_k: int = 0  # 0 means no top-k filter
    top_p: float = 1.0

    def __post_init__(self):
        t, k, p = self.temperature, self.top_k, self.top_p
        if not isinstance(t, (int, float)) or t != t or t < 0:
            raise BlockdraftError(f"temperature must be >= 0 (0 = greedy), got {t}")
        if not isinstance(k, int) or k < 0:
            raise BlockdraftError(f"top_k must be a non-negative integer (0 = off), got {k}")
        if not isinstance(p, (int, float)) or not 0 < p <= 1:
            raise BlockdraftError(f"top_p must be in (0, 1], got {p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """The distribution the *target* samples from at T > 0, after temperature, top-k and top-p.

        Same rules as transformers' TemperatureLogitsWarper, TopKLogitsWarper and TopPLogitsWarper
        (applied in that order), so `hf` sampling baselines target the same distribution.
        """
        if self.greedy:
            return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
        scores = logits.float() / self.temperature
        if self.top_k:
            kth = torch.topk(scores, min(self.top_k, scores.shape[-1]), dim=-1).values[..., -1:]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        if self.top_p < 1.0:
            sorted_scores, order = torch.sort(scores, descending=False, dim=-1)
            cum = sorted_scores.softmax(-1).cumsum(-1)
            drop_sorted = cum <= (1 - self.top_p)
            drop_sorted[..., -1] = False  # always keep the most likely token
            drop = drop_sorted.scatter(-1, order, drop_sorted)
            scores = scores.masked_fill(drop, float("-inf"))
        probs = scores.softmax(-1)
        # A NaN or +inf score makes its whole row NaN (the softmax's max and sum carry it), so one column tells;
        # sampling from it would draw garbage tokens without a word
        if torch.isnan(probs[..., :1]).any():
            raise BlockdraftError(f"the target's distribution at temperature {self.temperature} is not finite (its "
                                  "logits divided by the temperature overflow, or the model produced NaN)")
        return probs
