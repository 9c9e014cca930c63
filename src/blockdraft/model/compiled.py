"""The static engine's decoding steps through torch.compile: one dynamic graph, or one graph per row bucket.

Full weights compile into one graph with every size symbolic (`compiled_step`). Quantized weights compile into one
graph per row count (`static_rows_step`, trees padded up to a bucket), because inductor's fast kernel for int4
weights -- a C++ GEMM template with AVX512/AMX micro-kernels that dequantizes each block in registers, chosen by
max-autotune -- needs the row count fixed: with symbolic rows it keeps aten's matrix-vector kernel, whose time grows
with every row. The fixed-row graphs make int4 steps and tree passes clearly faster than eager ones
(BENCHMARKS.md, "Decisions": PLANE_MAX_ROWS).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from .engine import Decoder

RECOMPILE_LIMIT = 256  # compiled graphs kept per process (2 per compiled target, 2 more per batch engine)


def in_order(states: list[torch.Tensor], hidden_layers) -> list[torch.Tensor]:
    """Decoder's hidden states (ascending layers) in the order `hidden_layers` asked for them."""
    ascending = sorted(set(hidden_layers))
    return [states[ascending.index(i)] for i in hidden_layers]


ROW_BUCKETS = (1, 4, 8, 16, 32)  # a quantized target's compiled passes: trees padded up to one of these


def row_bucket(n: int) -> int | None:
    """The smallest bucket holding n rows (None past the largest: such a pass runs eager)."""
    return next((b for b in ROW_BUCKETS if b >= n), None)


class _Step(nn.Module):
    """One sequence's decoding step (slot 0) on `decoder`, returning the hidden states of every layer."""

    def __init__(self, decoder: Decoder):
        super().__init__()
        self.decoder = decoder
        self.every_layer = frozenset(range(len(decoder.layers) + 1))

    def forward(self, tokens, cos, sin, mask, keys, values, write_slot, write_pos, end, window_mask=None):
        return self.decoder(tokens, cos, sin, mask, keys, values, write_slot, write_pos, 0, end, self.every_layer,
                            window_mask=window_mask)


def compiled_step(decoder: Decoder):
    """One sequence's decoding step (any tree size, any context) through torch.compile.

    Inductor fuses the ~30 small ops per layer that eager mode launches one by one, freezing prepacks the
    weights (it applies to the parameters of the module compiled, hence a module, not a function), and
    the C++ wrapper drops Python from the call path. dynamic=True: one graph for one-token steps and one
    for every tree size and context length (measured as fast as per-size graphs here, so there are no
    size buckets and no recompiles as a run goes on). The graph returns every layer's hidden state (it
    computes them anyway), so drafters that read different layers share it; the set of layers is a
    frozenset, since dynamo would turn the ints of a tuple symbolic. Freezing embeds the weights as
    constants, which torch's on-disk graph cache does not take: each process compiles each graph once,
    on its first call (~50 s for SmolLM2-135M on 2 cores).
    """
    step = torch.compile(_Step(decoder), dynamic=True)

    def call(*args):
        # inductor reads `freezing` outside the scope of torch.compile(options=...): patch it for the call
        # that compiles (and the ones that may recompile); the patch costs microseconds. Every compiled
        # engine's graphs hang on the one code object of _Step.forward, whose default limit (8) a process
        # with several compiled targets (or batch engines) would reach, and then run eager, silently.
        # No duck shapes: dynamo would otherwise give sizes that happen to be equal at the first call (a
        # batch of 3 and 3 KV heads) one symbol, and recompile when they part.
        with torch._inductor.config.patch(freezing=True, cpp_wrapper=True), \
                torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT), \
                torch.fx.experimental._config.patch(use_duck_shape=False):
            return step(*args)

    return call




def static_rows_step(decoder: Decoder):
    """One sequence's decoding step through torch.compile with max-autotune, one graph per row count (the caller
    pads trees to ROW_BUCKETS) and the context length symbolic, for quantized weights (see the module docstring).
    A Linear reads its planes here at every row count with one plane (4-bit), at one row with two (8-bit), else
    its full copy (linear.COMPILED_PLANE_MAX_ROWS)."""
    step = torch.compile(_Step(decoder), dynamic=True)

    def call(tokens, cos, sin, mask, keys, values, write_slot, write_pos, end, window_mask=None):
        # the row dimension of every per-row input is fixed; the context (keys' length, the mask's width) is not
        for t in (tokens, cos, sin):
            for d in range(t.dim()):
                torch._dynamo.mark_static(t, d)
        for t in (write_slot, write_pos):
            torch._dynamo.mark_static(t, 0)
        for t in (mask, window_mask):
            if t is not None:
                torch._dynamo.mark_static(t, 2)
        with torch._inductor.config.patch(freezing=True, cpp_wrapper=True, max_autotune=True,
                                          max_autotune_gemm_backends="CPP,ATEN"), \
                torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT), \
                torch.fx.experimental._config.patch(use_duck_shape=False):
            return step(tokens, cos, sin, mask, keys, values, write_slot, write_pos, end, window_mask)

    return call
