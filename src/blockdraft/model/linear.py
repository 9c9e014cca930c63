"""The static engine's linear layer: fused projections, prepacked full weights, quantized planes, lowered copies.

One `Linear` holds one or several projections of the same input concatenated (q|k|v, gate|up). Its weight is
kept in one or two of these forms:

- full: the target's dtype, prepacked for oneDNN where that applies (model/packing.py);
- planes: 4-bit planes in groups of 32 (model/quantized_weights.py), when the target runs with int8 or int4
  weights. aten's int4 kernel is a matrix-vector kernel: its time grows with every row (about 12x from 1 to 32
  rows on the AMX Xeon; BENCHMARKS.md, "Decisions": PLANE_MAX_ROWS), while a full prepacked matmul costs about
  the same for 1 and 32 rows. So calls of up to `max_rows` rows (one-token steps, small trees) read the planes,
  and larger ones (prefills, large trees) the full weight *that the planes dequantize to*: the same model, bit
  for bit in float32; in bf16 the kernel multiplies by (q - 8) * scale + zero with scale and zero in bf16, and
  the full weight is those values rounded to bf16 (a divergence between the two is a numeric tie, measured as
  every bf16 one is). In float32 and float16 the kernel is slow (PLANE_MAX_ROWS) and every call reads the full
  weight. Compiled, inductor's int4 GEMM template takes over, faster at every row count with one plane and at one
  row only with two (COMPILED_PLANE_MAX_ROWS);
- lowered: a float16 or int8 copy in a drafting copy of the decoder (drafters/quantized.py), no full weight.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import packing, qkernel
from . import quantized_weights as qw

# Calls of up to this many rows read the planes, larger ones the full weight: the planes' kernel reads fewer bytes,
# so it wins at a few rows, but its time grows with every row while the full weight's stays nearly flat
# (benchmarks/weight_kernels.py; BENCHMARKS.md, "Decisions": PLANE_MAX_ROWS). torch 2.13's kernel has a
# fast path for bf16 activations only, and is many times slower in float32 and float16: in those dtypes every call
# reads the full weight, which in float32 is the planes' values exactly.
PLANE_MAX_ROWS = {(4, torch.bfloat16): 8, (8, torch.bfloat16): 4}  # (bits a weight: 4 per plane, dtype)
# Compiled (inductor's int4 GEMM template, one graph per row bucket), one plane beats the full weight at every bucket,
# but two planes only at one row: from 4 rows on, the template over Gemma 3 270M's 262,144 x 640 Q8_0 LM head falls
# behind its prepacked bf16 copy (BENCHMARKS.md, "Decisions": PLANE_MAX_ROWS).
COMPILED_PLANE_MAX_ROWS = {4: 1 << 30, 8: 1}


class Linear(nn.Module):
    """y = x W^T + b for the projections `linears` concatenated (see the module docstring). `planes`: the
    weight as quantized planes; the linears' weights must already hold the planes' values (Decoder makes the
    model the quantized one before building its Linears), and become the full copy."""

    def __init__(self, linears, planes: qw.Planes | None = None, dtype: torch.dtype | None = None,
                 qweights: list | None = None):
        """qweights: a GGUF file's own integers run by our kernel (model/qkernel.py), the only copy (the linears'
        weights are on the meta device); `dtype` is then the activations'."""
        super().__init__()
        weight = torch.cat([m.weight for m in linears]).detach()
        self.out_features = weight.shape[0]
        # a plain list: the kernel's operands must not be moved or cast by nn.Module's .to()
        self.qweights = qweights
        self.register_buffer("planes", None)
        self.register_buffer("plane_scales", None)
        self.max_rows = self.compiled_max_rows = self.plane_count = 0
        if planes is not None:
            if tuple(planes.shape) != tuple(weight.shape):
                raise ValueError(f"planes of shape {planes.shape} for a weight of shape {tuple(weight.shape)}")
            dtype = dtype or weight.dtype
            self.planes, self.plane_scales = qw.pack(planes, dtype)
            self.plane_count = planes.q.shape[0]
            self.max_rows = PLANE_MAX_ROWS.get((4 * planes.q.shape[0], dtype), 0)
            self.compiled_max_rows = COMPILED_PLANE_MAX_ROWS[4 * planes.q.shape[0]] if self.max_rows else 0
        biases = [m.bias if m.bias is not None else torch.zeros(m.out_features, dtype=dtype or weight.dtype)
                  for m in linears]
        has_bias = any(m.bias is not None for m in linears)
        self.bias = nn.Parameter(torch.cat(biases).detach(), requires_grad=False) if has_bias else None
        if qweights is not None:  # the only copy
            self.weight = self.packed = None
            self.register_buffer("low", None)
            self.register_buffer("scales", None)
            return
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.packed = packing.pack(self.weight)
        self.register_buffer("low", None)
        self.register_buffer("scales", None)

    def share_with(self, linears, tied: torch.Tensor | None = None) -> None:
        """Make the linears' weights views of this one's rows: transformers' forward (generate(), the float32 tie
        check) then reads the same memory, where a second full copy of a 1.5B model would cost GBs. A weight the
        model ties to its input embedding (`tied`) is left alone: the embedding keeps it."""
        start = 0
        for m in linears:
            n = m.out_features
            if m.weight is not tied:
                m.weight = nn.Parameter(self.weight[start : start + n], requires_grad=False)
            start += n

    @property
    def quantized(self) -> bool:
        return self.planes is not None

    def lower(self, weights: str) -> None:
        """Keep only a float16, int8 (per output channel) or int4 (planes) copy of the weight, for a drafting copy
        whose one-row calls read half, a quarter or an eighth of the bytes. Buffers, not plain attributes:
        torch.compile then folds them in as constants (as plain tensors they became graph inputs, and
        inductor's C++ failed on their sizes)."""
        if weights == "int4":
            self.planes, self.plane_scales = qw.pack(qw.quantize(self.weight, "int4"), self.weight.dtype)
            self.max_rows = self.compiled_max_rows = 1 << 30  # no full weight left
            self.plane_count = 1
        elif weights == "float16":
            self.low = self.weight.detach().half()
        else:
            low = packing.quantize(self.weight)
            if low is None:
                raise ValueError(f"no int8 kernel for {self.weight.dtype} weights on {self.weight.device}")
            self.low, self.scales = low
        del self.weight
        self.weight = self.packed = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.qweights is not None:
            y = torch.cat([qkernel.linear(x, q) for q in self.qweights], dim=-1).to(x.dtype)
            return y if self.bias is None else y + self.bias
        # compiled (model/compiled.py: one graph per row count, so the rows are a constant here)
        limit = self.compiled_max_rows if torch.compiler.is_compiling() else self.max_rows
        if limit and x.numel() <= limit * x.shape[-1]:
            return qw.int4_linear(x, self.planes, self.plane_scales, self.out_features, self.bias, self.plane_count)
        if self.low is not None:
            if self.scales is not None:
                return packing.int8_linear(x, (self.low, self.scales), self.bias)
            y = F.linear(x.half(), self.low).to(x.dtype)
            return y if self.bias is None else y + self.bias
        if torch.compiler.is_compiling():  # inductor's freezing prepacks the (constant) weight itself
            return F.linear(x, self.weight, self.bias)
        return packing.linear(x, self.weight, self.bias, self.packed)
