"""The Python API in one call: `blockdraft.generate("prompt", method="lookup")`."""

from __future__ import annotations

from functools import lru_cache
from typing import Callable

import torch

from .decoding import GenerationResult, SpeculativeDecoder
from .methods import make_drafter
from .target import DEFAULT_TARGET, Target
from .verify import SamplingParams


@lru_cache(maxsize=4)
def load_target(name_or_path: str = DEFAULT_TARGET, dtype: torch.dtype = torch.float32) -> Target:
    """Load a target once per process (the first GGUF load converts and caches it, ~20 s)."""
    return Target.load(name_or_path, dtype=dtype)


def generate(
    prompt: str | list[int],
    method: str = "lookup",
    target: str | Target = DEFAULT_TARGET,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: int | None = None,
    chat_template: bool = True,
    stop: tuple[str, ...] = (),
    acceptor: str | None = None,
    on_tokens: Callable[[list[int]], None] | None = None,
    **method_options,
) -> GenerationResult:
    """Generate from a text prompt (or token ids) with a speculative method. Greedy by default."""
    params = SamplingParams(temperature, top_k, top_p)  # validates before anything is loaded
    tgt = target if isinstance(target, Target) else load_target(target)
    drafter = make_drafter(method, tgt, **method_options)
    ids = tgt.encode(prompt, chat_template) if isinstance(prompt, str) else list(prompt)
    decoder = SpeculativeDecoder(tgt, drafter, params, acceptor)
    return decoder.generate(ids, max_new_tokens, stop_strings=tuple(stop), seed=seed, on_tokens=on_tokens)
