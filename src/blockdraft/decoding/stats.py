"""Per-call statistics of one generation: tau, tokens/s, accepted lengths, where the time went."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field


@dataclass
class GenerationStats:
    method: str = ""
    new_tokens: int = 0
    target_calls: int = 0  # verification passes (the prefill is counted in prefill_s, not here)
    plain_steps: int = 0  # of those, one-token steps the pacer chose because drafting did not pay
    accepted_hist: Counter = field(default_factory=Counter)  # drafts accepted per call -> count
    tree_nodes: int = 0  # nodes verified in total, root included
    prefill_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    total_s: float = 0.0
    stop_reason: str = ""

    @property
    def tau(self) -> float:
        """Tokens emitted per target call, bonus token included (plain decoding: 1.0)."""
        return self.new_tokens / self.target_calls if self.target_calls else 0.0

    @property
    def tokens_per_s(self) -> float:
        """End to end, prefill included, as a user experiences it."""
        return self.new_tokens / self.total_s if self.total_s > 0 else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["accepted_hist"] = {int(k): v for k, v in sorted(self.accepted_hist.items())}
        d.update(tau=self.tau, tokens_per_s=self.tokens_per_s)
        return d


@dataclass
class GenerationResult:
    tokens: list[int]  # the new tokens only
    text: str
    stats: GenerationStats

    def to_dict(self) -> dict:
        return {"text": self.text, "tokens": self.tokens, **self.stats.to_dict()}
