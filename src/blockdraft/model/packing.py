"""Weights made ready for CPU inference: prepacked for oneDNN (bf16/fp16), and int8 copies for drafters' few-row calls.

A one-token step on this CPU is bound by per-call cost: aten's bf16 matmul re-lays the weight out on
every call. oneDNN's prepacked layout (what inductor's freezing does) keeps the kernel and the result
(checked bitwise in tests/test_engine.py) and drops that cost. Inference only: a packed copy does not
follow later updates of the weight, so packed paths run only under torch.inference_mode().

A drafter may also keep an int8 copy of a weight (per output channel, symmetric) for calls of a few rows,
read by aten's int8 weight-only kernel with bf16 activations. Such a call reads every weight byte to use it
a few times, and after a target pass the drafter's weights come from memory, not cache: on a CPU without
bf16 hardware (AVX2 only) reading a quarter of the bytes makes such a call several times faster; from ~32
rows the int8 kernel is compute-bound and slower. With bf16 weights on an AMX CPU it gained nothing in the
loop, so `int8="auto"` quantizes float32 weights only (BENCHMARKS.md, "Decisions": drafters' int8). Drafts
may change slightly; what the target accepts never depends on them, so decoding stays lossless. Never used
for the target.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn


def _supported(dtype: torch.dtype) -> bool:
    """Whether oneDNN has native kernels for `dtype` on this CPU. Without them (a CPU with AVX2 only, say)
    its reorder raises "bf16 path needs the cpu support avx_ne_convert or avx512bw, ..."; F.linear still
    runs there, slowly, which is what `--dtype bfloat16` asked for."""
    if not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.bfloat16:
        return torch.ops.mkldnn._is_mkldnn_bf16_supported()
    return torch.ops.mkldnn._is_mkldnn_fp16_supported()


def pack(weight: torch.Tensor) -> torch.Tensor | None:
    """oneDNN's blocked copy of a [out, in] weight, or None where it does not apply (fp32, CUDA, no oneDNN,
    no bf16/fp16 kernels on this CPU)."""
    if weight.device.type != "cpu" or weight.dtype not in (torch.bfloat16, torch.float16):
        return None
    if not _supported(weight.dtype):
        return None
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 1)


# the int8 kernel serves calls up to this many rows: measured faster than float32 up to 16 rows on AVX2 and
# than packed bf16 up to 4 on AMX (BENCHMARKS.md, "Decisions": drafters' int8)
INT8_MAX_ROWS = {torch.float32: 16, torch.bfloat16: 4}
INT8_AUTO_MIN_ELEMENTS = 1 << 18  # int8="auto" skips smaller weights: they stay in cache, there is no traffic to save


def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(int8 [out, in], bf16 scales [out]): a per-output-channel symmetric copy of a float32 or bf16 CPU weight
    for aten's int8 weight-only kernel, or None where that kernel does not apply."""
    if (weight.device.type != "cpu" or weight.dtype not in INT8_MAX_ROWS
            or not hasattr(torch.ops.aten, "_weight_int8pack_mm")):
        return None
    w = weight.detach().float()
    scales = (w.abs().amax(1).clamp(min=1e-12) / 127).bfloat16()  # rounded first: the kernel reads these
    return torch.round(w / scales.float()[:, None]).clamp(-127, 127).to(torch.int8).contiguous(), scales


def wants_int8(weight: torch.Tensor, int8: bool | str) -> bool:
    """Whether a drafter weight gets an int8 copy: always with int8=True, never with False; "auto" for float32
    weights large enough that reading them costs (see the module docstring)."""
    if int8 == "auto":
        return weight.dtype == torch.float32 and weight.numel() >= INT8_AUTO_MIN_ELEMENTS
    return bool(int8)


def int8_linear(x: torch.Tensor, int8: tuple[torch.Tensor, torch.Tensor], bias: torch.Tensor | None):
    """x W^T + b through the int8 copy (`quantize`), bf16 activations, in x's dtype."""
    rows = x.reshape(-1, x.shape[-1]).to(torch.bfloat16).contiguous()
    y = torch.ops.aten._weight_int8pack_mm(rows, *int8).to(x.dtype).reshape(*x.shape[:-1], -1)
    return y if bias is None else y + bias


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, packed: torch.Tensor | None,
           int8: tuple[torch.Tensor, torch.Tensor] | None = None):
    """F.linear(x, weight, bias), through the int8 copy for a few rows, else the packed weight, when there is
    one and it may be used."""
    # under torch.compile the graph takes the plain weight (inductor's freezing packs it itself)
    if torch.compiler.is_compiling() or not torch.is_inference_mode_enabled() or x.dtype != weight.dtype:
        return F.linear(x, weight, bias)
    if int8 is not None and x.numel() <= INT8_MAX_ROWS[x.dtype] * x.shape[-1]:
        return int8_linear(x, int8, bias)
    if packed is not None:
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    return F.linear(x, weight, bias)


def _packed_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return linear(x, self.weight, self.bias, self._packed, self._int8)


def prepack_linears(obj, int8: bool | str = False, _seen=None) -> None:
    """Give every nn.Linear reachable from `obj` (a drafter, its base drafter, rescorer, modules) a packed
    inference forward, with an int8 copy for few-row calls where `wants_int8(weight, int8)`; modules with a
    `prepack(int8)` method (the frozen LM head) pack themselves."""
    seen = set() if _seen is None else _seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, nn.Module):
        for m in obj.modules():
            if isinstance(m, nn.Linear) and not hasattr(m, "_packed"):
                m._packed = pack(m.weight)
                m._int8 = quantize(m.weight) if wants_int8(m.weight, int8) else None
                if m._packed is not None or m._int8 is not None:
                    m.forward = types.MethodType(_packed_forward, m)
            elif hasattr(m, "prepack"):
                m.prepack(int8)
        return
    for value in getattr(obj, "__dict__", {}).values():
        # containers too: the hybrid keeps its learned drafter in a tuple and its sources in a dict
        items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else [value]
        for item in items:
            ours = hasattr(item, "__dict__") and type(item).__module__.startswith("blockdraft")
            if isinstance(item, nn.Module) or ours:
                prepack_linears(item, int8, seen)
