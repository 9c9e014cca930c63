"""Self-speculation: a float16 or int8 copy of the target drafts a chain on the target's own KV cache.

A one-row matmul reads every weight byte to use it once, so on a CPU a one-token step is bound by the
bytes it reads. A copy of the target's decoder with its projections in float16 (or int8 per output
channel) reads half (a quarter) of them, so its step costs about half the target's, and its greedy
token is nearly always the target's (BENCHMARKS.md, "Decisions": quantized). The copy needs no
training and exists for any target the static engine runs. What it drafts is verified by the target as
usual, so the output is the target's; the copy only decides how much gets accepted (QSpec, Zhao et al.
2024, drafts the same way with a W4A4 copy of the verifier).

The copy reads the target's own keys and values for the committed prefix, so it has no cache or prefill
of its own: its draft tokens' keys and values go to the slots after the prefix, where the verification
pass that follows overwrites them (`StaticEngine.draft_step`). The chain can stop early at a token the
copy itself is unsure of (top probability below `min_prob`), but by default it does not: on held-out
ShareGPT the float16 copy's drafts were nearly all accepted, at every depth, so a stop loses more
accepted tokens than it saves drafting (BENCHMARKS.md, "Decisions": quantized). Each draft costs
about half a target step, which caps the method near 2x `ar` and leaves it behind `suffix` where the text
repeats (suffix's drafts are nearly free).

At T > 0 the chain is sampled from the copy's own tempered distribution, reported in `DraftTree.q` for
rejection sampling; whether to go on depends only on the tokens drawn so far, which keeps the output
distribution the target's.
"""

from __future__ import annotations

import math
import time

import torch

from ..errors import BlockdraftError
from ..model.compiled import _Step, compiled_step
from ..model.engine import Decoder, StaticEngine
from ..model.linear import Linear
from ..trees import DraftTree
from ..trees.sampled import drafting_generator
from ..verify.base import sample
from .base import DraftContext, Drafter

WEIGHTS = ("auto", "float16", "int8", "int4")


def lowered_decoder(model, weights: str) -> Decoder:
    """A copy of the static engine's decoder with every projection and the LM head in `weights`."""
    decoder = Decoder(model, share_weights=False)  # its full weights go: the model must keep its own
    for module in decoder.modules():
        if isinstance(module, Linear):
            module.lower(weights)
    return decoder


def refuse_int4_target(weights: str) -> None:
    """An int4 target has no cheaper copy to draft with (checked before a slow load too: `bench`)."""
    if weights == "int4":
        raise BlockdraftError("quantized: the target already runs int4 weights, and there is no cheaper copy to "
                              "draft with: choose another method, or load the target with --weights int8 or full")


class QuantizedDrafter(Drafter):
    """Drafts up to `depth` tokens, one lowered step each, on the target's cache (see the module docstring).

    weights: "float16", "int8", "int4" (planes, model/linear.py), or "auto": int4 for a target with int8 weights,
    float16 for a float32 target (its one-row matmuls on AVX2 ran as fast as int8's and it is closer to the
    target), int8 for a bf16 or fp16 one. A target with int4 weights has no cheaper copy: refused.
    """

    name = "quantized"
    single_sequence = True

    def __init__(self, target, depth: int = 6, min_prob: float = 0.0, weights: str = "auto"):
        engine = target.forwarder
        if not isinstance(engine, StaticEngine):
            raise BlockdraftError(
                f"method 'quantized' drafts with a lowered copy of the static engine's decoder, and this target "
                f"({target.config.model_type}) runs on transformers' forward")
        if weights not in WEIGHTS:
            raise BlockdraftError(f"quantized: weights must be one of {', '.join(WEIGHTS)}, got '{weights}'")
        if not isinstance(depth, int) or depth < 1:
            raise BlockdraftError(f"quantized: depth must be a positive integer, got {depth}")
        if not 0.0 <= float(min_prob) <= 1.0:
            raise BlockdraftError(f"quantized: min_prob must be in [0, 1], got {min_prob}")
        refuse_int4_target(target.weights)
        if any(p.is_meta for p in target.model.parameters()):
            raise BlockdraftError(
                "quantized: this target holds its projections only as the GGUF file's quantized blocks (int8 "
                "weights from a GGUF file), with no float copy to lower; load it with --weights full to use it")
        if weights == "auto":
            weights = "int4" if target.weights == "int8" else "float16" if target.dtype == torch.float32 else "int8"
        try:
            decoder = lowered_decoder(target.model, weights)
        except ValueError as e:
            raise BlockdraftError(f"quantized: weights={weights}: {e}") from None
        self.engine, self.weights = engine, weights
        self.depth, self.min_prob = depth, float(min_prob)
        self.step = compiled_step(decoder) if target.compiled else _Step(decoder)
        self.compile_seconds = self._compile() if target.compiled else 0.0

    def _compile(self) -> float:
        """One throwaway step, so that compiling (~70 s on 2 cores) happens at load and not in a request. It
        writes past the committed prefix, which nothing reads; the odd offset keeps dynamo from specialising
        the context length to a value it would have to recompile for."""
        t0 = time.perf_counter()
        self.engine.draft_step(self.step, 0, 13)
        return time.perf_counter() - t0

    def propose(self, ctx: DraftContext) -> DraftTree:
        if ctx.temperature > 0:
            return self._sampled_chain(ctx)
        return self.scored_tree(ctx)[0]

    def scored_tree(self, ctx: DraftContext) -> tuple[DraftTree, list[float]]:
        """The greedy chain and each draft's cumulative log-probability under the copy (what the hybrid ranks)."""
        root, drafts, scores = ctx.tokens[-1], [], []
        token, total = root, 0.0
        for offset in range(min(self.depth, ctx.max_depth)):
            logp = torch.log_softmax(self.engine.draft_step(self.step, token, offset).float(), -1)
            token = int(logp.argmax())
            total += float(logp[token])
            drafts.append(token)
            scores.append(total)
            if logp[token] < math.log(max(self.min_prob, 1e-30)):
                break
        return DraftTree.chain(root, drafts), scores

    def _sampled_chain(self, ctx: DraftContext) -> DraftTree:
        """Each draft drawn from the copy's distribution at the decoder's temperature, which goes into q."""
        generator = drafting_generator(ctx)
        root, drafts, q = ctx.tokens[-1], [], []
        token = root
        for offset in range(min(self.depth, ctx.max_depth)):
            logits = self.engine.draft_step(self.step, token, offset).float().cpu()
            probs = torch.softmax(logits / ctx.temperature, -1)
            token = sample(probs, generator)
            drafts.append(token)
            q.append(probs)
            if probs[token] < self.min_prob:
                break
        return DraftTree.chain(root, drafts, torch.stack(q) if q else None)
