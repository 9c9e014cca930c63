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


def parse_method(spec: str) -> tuple[str, dict]:
    """'lookup:min_ngram=1:num_tokens=6' -> ('lookup', {'min_ngram': 1, 'num_tokens': 6}).

    Options let one benchmark run compare variants of a method side by side.
    """
    name, *pairs = spec.strip().split(":")
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise BlockdraftError(f"bad method option '{pair}' in '{spec}': write NAME:key=value[:key=value]")
        for cast in (int, float):
            try:
                value = cast(value)
                break
            except ValueError:
                pass
        else:
            value = {"true": True, "false": False}.get(value.lower(), value)
        options[key] = value
    return name, options


def make_drafter(method: str, target: Target, **options) -> Drafter:
    """Build the drafter for a method name or spec ('lookup', 'lookup:max_branches=3')."""
    name, spec_options = parse_method(method)
    if name not in METHODS:
        raise BlockdraftError(f"unknown method '{name}': choose one of {', '.join(METHODS)}")
    try:
        drafter = METHODS[name][0](target, **{**spec_options, **options})
    except TypeError as e:
        raise BlockdraftError(f"bad option for method '{name}': {e}") from None
    drafter.name = method
    return drafter
