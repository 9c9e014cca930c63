"""Pacer: draft only while drafting pays, judged by measured time per token against plain one-token steps."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class _Kind:
    """Exponential averages of one kind of step's seconds and emitted tokens."""

    decay: float
    seconds: float | None = None
    tokens: float = 0.0
    last_step: int = -1  # step index of its latest sample
    last_context: int = 0  # context length at its latest sample

    def add(self, seconds: float, tokens: int, step: int, context: int) -> None:
        if self.seconds is None:
            self.seconds, self.tokens = seconds, float(tokens)
        else:
            self.seconds = self.decay * self.seconds + (1 - self.decay) * seconds
            self.tokens = self.decay * self.tokens + (1 - self.decay) * tokens
        self.last_step, self.last_context = step, context

    @property
    def per_token(self) -> float:
        return self.seconds / max(self.tokens, 1e-9)

    def stale(self, step: int, context: int, every: int, growth: float) -> bool:
        return step - self.last_step >= every or context >= growth * self.last_context


class Pacer:
    """Chooses before each step between drafting (a speculative step) and a plain one-token step.

    Speculation pays while its time per emitted token is below a plain step's. Both change as the
    context grows: a tree pass attends every node to the whole context, so a tree costs more one-token
    steps at ~4,000 tokens than at ~100, and a drafter's own attention over the context grows too
    (BENCHMARKS.md, "Decisions": --pace). So both are measured as the generation goes: the decoder
    reports every step, the pacer keeps an exponential average of seconds and tokens per kind, runs the
    faster kind, and samples the slower one again after `every` steps or once the context has grown by
    the factor `growth` since its last sample. Plain steps take over only when they are faster by more
    than `margin`: a retrieval drafter that finds nothing for a while costs little more than a plain
    step, and pacing it out would miss its next match.
    A plain step is a tree of the root alone, verified and accepted like any other: lossless.
    """

    def __init__(self, every: int = 32, growth: float = 1.5, margin: float = 0.1, warmup: int = 2):
        self.every, self.growth, self.margin, self.warmup = every, growth, margin, warmup
        self.draft = _Kind(decay=0.8)  # noisy: the accepted length varies step to step
        self.plain = _Kind(decay=0.5)  # steady: one token, a cost that moves only with the context
        self.steps = 0

    def should_draft(self, context: int) -> bool:
        if self.draft.seconds is None or self.steps < self.warmup:
            return True
        if self.plain.seconds is None:
            return False
        drafting_wins = self.plain.per_token >= (1 - self.margin) * self.draft.per_token
        slower = self.plain if drafting_wins else self.draft
        if slower.stale(self.steps, context, self.every, self.growth):
            return not drafting_wins
        return drafting_wins

    def record(self, drafted: bool, seconds: float, tokens: int, context: int) -> None:
        (self.draft if drafted else self.plain).add(seconds, tokens, self.steps, context)
        self.steps += 1
