"""Stopping rules: end-of-sequence tokens and stop strings, applied to each step's emitted tokens."""

from __future__ import annotations

from typing import Callable


class Stopper:
    def __init__(self, eos_ids: set[int], stop_strings: tuple[str, ...] = (), decode: Callable | None = None):
        self.eos_ids = eos_ids
        self.stop_strings = tuple(s for s in stop_strings if s)
        self.decode = decode

    def cut_eos(self, emitted: list[int]) -> tuple[list[int], bool]:
        """Cut after the first EOS token (kept, as `generate()` keeps it)."""
        for i, t in enumerate(emitted):
            if t in self.eos_ids:
                return emitted[: i + 1], True
        return emitted, False

    def find_stop_string(self, new: list[int], n_before: int) -> tuple[int, int] | None:
        """If a stop string appeared in the text of `new`, return (tokens to keep, chars to keep).

        Only the tokens added after `n_before` can complete a stop string, so the search starts
        from there and finds the fewest tokens whose text contains one.
        """
        if not self.stop_strings or self.decode is None:
            return None
        for n in range(max(n_before, 1), len(new) + 1):
            text = self.decode(new[:n])
            hits = [text.find(s) for s in self.stop_strings if s in text]
            if hits:
                return n, min(hits)
        return None
