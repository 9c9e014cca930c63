"""The Python API in one call: `blockdraft.generate("prompt", method="lookup")`."""

from __future__ import annotations

from functools import lru_cache
from typing import Callable

import torch

from .decoding import GenerationResult, SpeculativeDecoder
from .errors import BlockdraftError
from .methods import make_drafter
from .model import DEFAULT_TARGET, Target, resolve_precision
from .model.precision import resolve_weights
from .verify import SamplingParams


def load_target(name_or_path: str | None = DEFAULT_TARGET, dtype: str | torch.dtype = "auto",
                device: str | torch.device = "auto", compile: bool = False, weights: str = "auto") -> Target:
    """Load a target once per process and (dtype, device, compile, weights) (the first GGUF load converts and
    caches it, ~20 s).

    dtype: auto | float32 | bfloat16 | float16; device: auto | cpu | cuda[:N] (see model/precision.py);
    compile: compile the engine's decoding steps (~1.5 min at load, then ~20-35% faster steps);
    weights: auto | full | int8 | int4 (the target's projections; model/linear.py)."""
    dtype, device = resolve_precision(dtype, device)
    weights = resolve_weights(weights, device) if weights != "auto" else "auto"  # auto: with the target
    return _load_target(name_or_path or DEFAULT_TARGET, dtype, str(device), bool(compile), weights)


@lru_cache(maxsize=4)
def _load_target(name_or_path: str, dtype: torch.dtype, device: str, compile: bool, weights: str) -> Target:
    return Target.load(name_or_path, dtype=dtype, device=device, compile=compile, weights=weights)


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
    pace: bool = False,
    on_tokens: Callable[[list[int]], None] | None = None,
    dtype: str | torch.dtype = "auto",
    device: str | torch.device = "auto",
    weights: str = "auto",
    **method_options,
) -> GenerationResult:
    """Generate from a text prompt (or token ids) with a speculative method. Greedy by default.

    `dtype`/`device`/`weights` choose how a target given by name is loaded; a loaded `Target` keeps its own."""
    params = SamplingParams(temperature, top_k, top_p)  # validates before anything is loaded
    if isinstance(target, Target):
        tgt = target
        if (dtype, device) != ("auto", "auto") and resolve_precision(dtype, device) != (tgt.dtype, tgt.device):
            raise BlockdraftError(f"the target is already loaded in {tgt.dtype} on {tgt.device}: "
                                  "pass dtype/device only with a target name")
        if weights != "auto" and resolve_weights(weights, tgt.device) != tgt.weights:
            raise BlockdraftError(f"the target is already loaded with {tgt.weights} weights: "
                                  "pass weights only with a target name")
    else:
        tgt = load_target(target, dtype, device, weights=weights)
    drafter = make_drafter(method, tgt, **method_options)
    ids = tgt.encode(prompt, chat_template) if isinstance(prompt, str) else list(prompt)
    decoder = SpeculativeDecoder(tgt, drafter, params, acceptor, pace=pace)
    return decoder.generate(ids, max_new_tokens, stop_strings=tuple(stop), seed=seed, on_tokens=on_tokens)
