"""Method names (`ar`, `lookup`, ...) -> drafters, so the CLI, the API and the benchmark agree."""

from __future__ import annotations

from typing import Callable

from pathlib import Path

from .drafters import BlockDrafter, Drafter, HeadsDrafter, NoDrafter, PromptLookupDrafter
from .errors import BlockdraftError
from .target import Target

CHECKPOINTS = Path(__file__).parent / "checkpoints"  # shipped drafters: CHECKPOINTS/<target name>/<method>


def shipped_checkpoint(target: Target, method: str, train_as: str) -> Path:
    folder = CHECKPOINTS / target.name / method
    if not (folder / "config.json").is_file():
        raise BlockdraftError(
            f"no '{method}' drafter ships for target '{target.name}': train one with `blockdraft train --drafter "
            f"{train_as} --target {target.name} --out DIR`, then use --method {method}:checkpoint=DIR")
    return folder


def trained(cls, method: str, train_as: str) -> Callable[..., Drafter]:
    """Factory for a trained drafter: the shipped checkpoint for this target, or `checkpoint=DIR`."""
    def factory(target: Target, checkpoint: str | None = None, **options) -> Drafter:
        return cls.from_pretrained(checkpoint or shipped_checkpoint(target, method, train_as), target, **options)
    return factory


# name -> (factory(target, **options) -> Drafter, one-line description)
METHODS: dict[str, tuple[Callable[..., Drafter], str]] = {
    "ar": (lambda target, **kw: NoDrafter(), "plain autoregressive decoding through the same Target code (baseline)"),
    "lookup": (lambda target, **kw: PromptLookupDrafter(**kw), "prompt lookup decoding (training-free n-gram copy)"),
    "bpd": (trained(HeadsDrafter, "bpd", "heads"), "blockwise parallel decoding heads on the target's state (chain)"),
    "dflash": (trained(BlockDrafter, "dflash", "block"), "one-shot block drafter fed with target features (chain)"),
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
