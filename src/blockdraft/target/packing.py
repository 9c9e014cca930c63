"""Weights prepacked for oneDNN (CPU, bf16/fp16): the same result as F.linear without re-laying out W per call.

A one-token step on this CPU is bound by per-call cost: aten's bf16 matmul re-lays the weight out on
every call. oneDNN's prepacked layout (what inductor's freezing does) keeps the kernel and the result
(checked bitwise in tests/test_engine.py) and drops that cost. Inference only: a packed copy does not
follow later updates of the weight, so packed paths run only under torch.inference_mode().
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


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, packed: torch.Tensor | None):
    """F.linear(x, weight, bias), through the packed weight when there is one and it may be used."""
    # under torch.compile the graph takes the plain weight (inductor's freezing packs it itself)
    if (packed is not None and x.dtype == weight.dtype and torch.is_inference_mode_enabled()
            and not torch.compiler.is_compiling()):
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    return F.linear(x, weight, bias)


def _packed_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return linear(x, self.weight, self.bias, self._packed)


def prepack_linears(obj, _seen=None) -> None:
    """Give every nn.Linear reachable from `obj` (a drafter, its base drafter, rescorer, modules) a packed
    inference forward; modules with a `prepack()` method (the frozen LM head) pack themselves."""
    seen = set() if _seen is None else _seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, nn.Module):
        for m in obj.modules():
            if isinstance(m, nn.Linear) and not hasattr(m, "_packed"):
                m._packed = pack(m.weight)
                if m._packed is not None:
                    m.forward = types.MethodType(_packed_forward, m)
            elif hasattr(m, "prepack"):
                m.prepack()
        return
    for value in getattr(obj, "__dict__", {}).values():
        # containers too: the hybrid keeps its learned drafter in a tuple and its sources in a dict
        items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else [value]
        for item in items:
            ours = hasattr(item, "__dict__") and type(item).__module__.startswith("blockdraft")
            if isinstance(item, nn.Module) or ours:
                prepack_linears(item, seen)
