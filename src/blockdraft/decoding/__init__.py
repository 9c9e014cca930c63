"""The decoding loop: draft, verify, accept, commit; with stopping rules and per-call statistics."""

from .batch import BatchDecoder
from .decoder import SpeculativeDecoder
from .stats import GenerationResult, GenerationStats

__all__ = ["BatchDecoder", "GenerationResult", "GenerationStats", "SpeculativeDecoder"]
