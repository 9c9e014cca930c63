"""One runner per benchmarked method: our decoder by method name, or transformers' own generate()."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import torch

from ..decoding import SpeculativeDecoder
from ..errors import BlockdraftError
from ..methods import METHODS, check_method, make_drafter, parse_method
from ..model import Target
from ..verify import SamplingParams

HF_METHODS = {
    "hf": "transformers generate() (greedy or sampling)",
    "hf-lookup": "transformers generate(prompt_lookup_num_tokens=10)",
    "hf-compiled": "transformers generate() with a static cache and torch.compile (inductor, freezing)",
}


@dataclass
class RunRecord:
    tokens: list[int]
    time_s: float
    target_calls: int
    draft_s: float | None = None
    verify_s: float | None = None
    accepted_hist: Counter = field(default_factory=Counter)
    plain_steps: int = 0  # target calls the pacer made plain one-token steps


def split_pace(spec: str, default: bool) -> tuple[str, bool]:
    """A method spec's `pace=` option belongs to the decoder, not the drafter ('treeflash:pace=false'
    beside 'treeflash' compares the two in one run): the spec without it, and the pacing to use."""
    name, *pairs = spec.split(":")
    paces = [p.partition("=")[2].lower() for p in pairs if p.startswith("pace=")]
    if any(v not in ("true", "false") for v in paces):
        raise BlockdraftError(f"pace must be true or false in '{spec}'")
    drafter_spec = ":".join([name] + [p for p in pairs if not p.startswith("pace=")])
    return drafter_spec, (paces[-1] == "true") if paces else default


class DecoderRunner:
    def __init__(self, name: str, target: Target, params: SamplingParams, acceptor: str | None = None,
                 pace: bool = False):
        self.name = name
        drafter_spec, pace = split_pace(name, pace)
        self.decoder = SpeculativeDecoder(target, make_drafter(drafter_spec, target), params, acceptor, pace=pace)
        self.lossless = self.decoder.acceptor.lossless

    def forget(self) -> None:
        """Drop what the drafter learnt across generations (e.g. suffix's global tree) during the warm-up."""
        self.decoder.drafter.forget()

    def run(self, prompt_ids: list[int], max_new_tokens: int, seed: int) -> RunRecord:
        r = self.decoder.generate(prompt_ids, max_new_tokens, seed=seed)
        s = r.stats
        return RunRecord(r.tokens, s.total_s, s.target_calls, s.draft_s, s.verify_s, Counter(s.accepted_hist),
                         s.plain_steps)


class HFRunner:
    """transformers' generate() on the very same loaded model (same dtype, same device): the external yardstick."""

    lossless = True

    def __init__(self, name: str, target: Target, params: SamplingParams):
        self.name, self.target = name, target
        eos = sorted(target.eos_token_ids)
        self.kwargs = dict(eos_token_id=eos or None, pad_token_id=eos[0] if eos else 0)
        if target.stop_strings:  # a base model's end of turn: both stop after the token that completes it
            self.kwargs.update(stop_strings=list(target.stop_strings), tokenizer=target.tokenizer)
        if params.greedy:
            self.kwargs.update(do_sample=False)
        else:
            # top_k=0 and top_p=1 switch those filters off (the model's generation_config may set others)
            self.kwargs.update(do_sample=True, temperature=params.temperature, top_k=params.top_k,
                               top_p=params.top_p)
        if name == "hf-lookup":
            self.kwargs.update(prompt_lookup_num_tokens=10)
        if name == "hf-compiled":
            from transformers import CompileConfig

            # transformers compiles the forward itself once the cache is static; on a CPU only when asked
            # (`_compile_all_devices`). Freezing lets inductor prepack the weights, as for our engine.
            config = CompileConfig(dynamic=None, mode=None, options={"freezing": True})
            config._compile_all_devices = True
            self.kwargs.update(cache_implementation="static", compile_config=config)
        self.calls = 0

    def _count(self, *_):
        self.calls += 1

    @torch.inference_mode()
    def run(self, prompt_ids: list[int], max_new_tokens: int, seed: int) -> RunRecord:
        torch.manual_seed(seed)
        x = torch.tensor([prompt_ids], device=self.target.device)
        self.calls = 0
        hook = self.target.model.register_forward_hook(self._count)  # target calls, prefill included
        try:
            t0 = time.perf_counter()
            out = self.target.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens,
                                             **self.kwargs)
            dt = time.perf_counter() - t0
        finally:
            hook.remove()
        return RunRecord(out[0, len(prompt_ids):].tolist(), dt, self.calls)


def check_methods(methods: list[str], weights: str = "full") -> None:
    """Refuse unknown method names, `quantized` on int4 weights, and a run without `ar` (every speedup is measured
    against it)."""
    from ..drafters.quantized import refuse_int4_target

    for m in methods:
        name = check_method(m, also=tuple(HF_METHODS))  # registered (methods.py), or transformers' own
        if name in METHODS and not METHODS[name].int4_target:
            refuse_int4_target(weights)
    if "ar" not in methods:
        raise BlockdraftError("the benchmark needs 'ar' among the methods: every speedup is measured against it")


def make_runner(name: str, target: Target, params: SamplingParams, acceptor: str | None = None, pace: bool = False):
    if name in HF_METHODS:
        return HFRunner(name, target, params)
    if parse_method(name)[0] in METHODS:
        return DecoderRunner(name, target, params, acceptor, pace)
    known = ", ".join([*METHODS, *HF_METHODS])
    raise BlockdraftError(f"unknown method '{name}': choose from {known}")
