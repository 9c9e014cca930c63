"""Weights prepacked for oneDNN (CPU, bf16/fp16): the same result as F.linear without re-laying out W per call.

A one-token step on this CPU is bound by per-call cost: aten's bf16 matmul re-lays the weight out on
every call. oneDNN's prepacked layout (what inductor's freezing does) keeps the kernel and the result
(checked bitwise in tests/test_engine.py) and drops that cost. Inference only: a packed copy does not
follow later updates of the weight, so packed paths run only under torch.inference_mode().

Drafters may also keep an int8 copy of each weight (per output channel, symmetric) for calls of a few
rows. Such a call reads every weight byte to use it once, and after a target pass the weights come from
memory, so half the bytes is nearly half the time: a 4 x 576 x 8192 matmul from memory took 0.62 ms
through aten's int8 weight-only kernel against 1.45 ms packed bf16 (and 2.6 vs 1.4 ms at 32 rows, where
the int8 kernel is compute-bound: it is only used up to INT8_MAX_ROWS). Drafts may change slightly;
what the target accepts never depends on them, so decoding stays lossless. Never used for the target.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn


def pack(weight: torch.Tensor) -> torch.Tensor | None:
    """oneDNN's blocked copy of a [out, in] weight, or None where it does not apply (fp32, CUDA, no oneDNN)."""
    if weight.device.type != "cpu" or weight.dtype not in (torch.bfloat16, torch.float16):
        return None
    if not torch.backends.mkldnn.is_available():
        return None
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 1)


INT8_MAX_ROWS = 4  # int8 weight-only calls up to this many rows (measured above: slower from 8 rows on)


def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(int8 [out, in], scales [out]): a per-output-channel symmetric copy of a bf16 CPU weight for aten's
    int8 weight-only kernel, or None where that kernel does not apply."""
    if (weight.device.type != "cpu" or weight.dtype != torch.bfloat16
            or not hasattr(torch.ops.aten, "_weight_int8pack_mm")):
        return None
    w = weight.detach().float()
    scales = (w.abs().amax(1).clamp(min=1e-12) / 127).to(weight.dtype)  # rounded first: the kernel reads these
    return torch.round(w / scales.float()[:, None]).clamp(-127, 127).to(torch.int8).contiguous(), scales


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, packed: torch.Tensor | None,
           int8: tuple[torch.Tensor, torch.Tensor] | None = None):
    """F.linear(x, weight, bias), through the int8 copy for a few rows, else the packed weight, when there is
    one and it may be used."""
    # under torch.compile the graph takes the plain weight (inductor's freezing packs it itself)
    if torch.compiler.is_compiling() or not torch.is_inference_mode_enabled() or x.dtype != weight.dtype:
        return F.linear(x, weight, bias)
    if int8 is not None and x.numel() <= INT8_MAX_ROWS * x.shape[-1]:
        y = torch.ops.aten._weight_int8pack_mm(x.reshape(-1, x.shape[-1]).contiguous(), *int8)
        y = y.reshape(*x.shape[:-1], y.shape[-1])
        return y if bias is None else y + bias
    if packed is not None:
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    return F.linear(x, weight, bias)


def _packed_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return linear(x, self.weight, self.bias, self._packed, self._int8)


def prepack_linears(obj, int8: bool = False, _seen=None) -> None:
    """Give every nn.Linear reachable from `obj` (a drafter, its base drafter, rescorer, modules) a packed
    inference forward, with an int8 copy for few-row calls if `int8`; modules with a `prepack()` method
    (the frozen LM head) pack themselves."""
    seen = set() if _seen is None else _seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, nn.Module):
        for m in obj.modules():
            if isinstance(m, nn.Linear) and not hasattr(m, "_packed"):
                m._packed = pack(m.weight)
                m._int8 = quantize(m.weight) if int8 else None
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
