"""Method names (`ar`, `lookup`, ...) -> drafters, so the CLI, the API and the benchmark agree."""

from __future__ import annotations

from typing import Callable

from .drafters import Drafter, NoDrafter, PromptLookupDrafter
from .errors import BlockdraftError
from .target import Target

# name -> (factory(target, **options) -> Drafter, one-line description)
METHODS: dict[str, tuple[Callable[..., Drafter], str]] = {
    "ar": (lambda target, **kw: NoDrafter(), "plain autoregressive decoding through the same Target code (baseline)"),
    "lookup": (lambda target, **kw: PromptLookupDrafter(**kw), "prompt lookup decoding (training-free n-gram copy)"),
}


def make_drafter(method: str, target: Target, **options) -> Drafter:
    if method not in METHODS:
        raise BlockdraftError(f"unknown method '{method}': choose one of {', '.join(METHODS)}")
    try:
        return METHODS[method][0](target, **options)
    except TypeError as e:
        raise BlockdraftError(f"bad option for method '{method}': {e}") from None
