"""Weight-only quantized linear weights for the static engine: 4-bit planes in groups of 32, read by torch's CPU kernel.

A one-token step of a small model on a CPU is bound by the bytes of weights it reads: llama.cpp runs a 4-bit GGUF
file and reads a quarter of what a bf16 copy does. Here a weight is one or two *planes* of 4-bit values in groups
of 32 along the input dimension, each group with a scale and a zero point:

    w[n, k] = sum over planes p of (q[p, n, k] - 8) * scale[p, n, k // 32] + zero[p, n, k // 32],  q in 0..15

which is exactly what `torch.ops.aten._weight_int4pack_mm_for_cpu` computes with (its int4 weight-only kernel,
activations in float32, bf16 or fp16; torchao's CPU int4 layout wraps the same kernel). One plane holds a 4-bit
format (GGUF Q4_0, Q4_1, Q4_K's 32-value sub-blocks): 4 bits a weight. Two planes hold an 8-bit one (u = 16 h + l:
the high nibbles in one plane with a 16x scale, the low in the other) -- GGUF Q8_0, Q5_0, Q5_1, and our own int8
-- at 8 bits a weight, with the group scales the file has, which aten's int8 kernel (one scale per output row)
cannot hold. The kernel's two planes are one matrix of 2N rows; the halves of its output are summed.

Scales and zero points are kept in float32 and cast to the activations' dtype when packed: in float32 they are
the file's values exactly (fp16 scales fit), in bf16 they round to 8 significant bits (as the weights of a bf16
model do). Weights that come from no GGUF block (a model folder, or a tensor type no plane holds) are quantized
here: int4 asymmetric per group (as GGUF Q4_1), int8 symmetric per group (as GGUF Q8_0).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

GROUP = 32  # values per scale: GGUF's block size, and the smallest group the kernel takes
KINDS = ("full", "int8", "int4")


class Planes(NamedTuple):
    """A [N, K] weight as 4-bit planes (see the module docstring): q uint8 [P, N, K] in 0..15, scale and zero
    float32 [P, N, K / GROUP]."""

    q: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape[1:])

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The float32 [N, K] weight these planes hold, with scales and zero points rounded to `dtype` first (as
        `pack` gives them to the kernel): in float32, the exact values."""
        P, N, K = self.q.shape
        q = self.q.float().view(P, N, K // GROUP, GROUP) - 8
        scale, zero = self.scale.to(dtype).float(), self.zero.to(dtype).float()
        return (q * scale[..., None] + zero[..., None]).sum(0).view(N, K)

    def with_planes(self, count: int) -> "Planes":
        """The same weight in `count` planes (a plane of zeros added), so that weights can be concatenated."""
        if count == self.q.shape[0]:
            return self
        extra = count - self.q.shape[0]
        return Planes(torch.cat([self.q, torch.full((extra, *self.q.shape[1:]), 8, dtype=torch.uint8)]),
                      torch.cat([self.scale, self.scale.new_zeros(extra, *self.scale.shape[1:])]),
                      torch.cat([self.zero, self.zero.new_zeros(extra, *self.zero.shape[1:])]))


def from_unsigned(u: torch.Tensor, d: torch.Tensor, c: torch.Tensor, bits: int) -> Planes:
    """Planes for w = d * u + c per group: u [N, K] integers in 0 .. 2^bits - 1 (bits <= 8), d and c float32
    [N, K / GROUP]. 4 bits: one plane, scale d and zero 8d + c. More: u = 16h + l, so
    w = 16d (h - 8) + [d (l - 8) + 136d + c]: two planes."""
    u = u.to(torch.uint8)
    if bits <= 4:
        return Planes(u[None], d[None], (8 * d + c)[None])
    high, low = u >> 4, u & 15
    return Planes(torch.stack([high, low]), torch.stack([16 * d, d]), torch.stack([torch.zeros_like(d), 136 * d + c]))


def quantize(weight: torch.Tensor, kind: str) -> Planes:
    """A float weight [N, K] (K a multiple of GROUP) quantized per group of 32: int4 asymmetric (min and step,
    as GGUF Q4_1), int8 symmetric (as GGUF Q8_0). Scales rounded to fp16 first, as GGUF's are."""
    if kind not in ("int8", "int4"):
        raise ValueError(f"unknown quantized weights kind '{kind}'")
    N, K = weight.shape
    if K % GROUP:
        raise ValueError(f"an input dimension of {K} is not a multiple of {GROUP}")
    w = weight.detach().float().reshape(N, K // GROUP, GROUP)
    if kind == "int4":
        low, high = w.amin(-1), w.amax(-1)
        d = ((high - low) / 15).half().float()
        c = low.half().float()
        u = torch.where(d[..., None] > 0, (w - c[..., None]) / d[..., None], 0).round().clamp(0, 15)
        return from_unsigned(u.view(N, K), d, c, 4)
    d = (w.abs().amax(-1) / 127).half().float()
    q = torch.where(d[..., None] > 0, w / d[..., None], 0).round().clamp(-127, 127)
    return from_unsigned((q + 128).view(N, K), d, -128 * d, 8)


def concat(parts: list[Planes]) -> Planes:
    """Weights stacked along N (q|k|v fused into one matrix), in as many planes as the widest."""
    count = max(p.q.shape[0] for p in parts)
    parts = [p.with_planes(count) for p in parts]
    return Planes(*(torch.cat(field, dim=1) for field in zip(*parts, strict=True)))


def pack(planes: Planes, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed uint8 [P N', K / 2], scales_and_zeros [K / GROUP, P N', 2] in `dtype`): the kernel's operands, each
    plane's rows padded with zeros to N', a multiple of 16 (the kernel's row blocks)."""
    P, N, K = planes.q.shape
    rows = -(-N // 16) * 16
    q, scale, zero = planes
    if rows != N:
        q = torch.cat([q, q.new_full((P, rows - N, K), 8)], dim=1)
        scale, zero = (torch.cat([t, t.new_zeros(P, rows - N, t.shape[2])], dim=1) for t in (scale, zero))
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.reshape(P * rows, K).to(torch.int32), 1)
    scales_zeros = torch.stack([scale.reshape(P * rows, -1), zero.reshape(P * rows, -1)], dim=-1)
    return packed, scales_zeros.transpose(0, 1).contiguous().to(dtype)


def int4_linear(x: torch.Tensor, packed: torch.Tensor, scales_zeros: torch.Tensor, out_features: int,
                bias: torch.Tensor | None = None, planes: int = 1) -> torch.Tensor:
    """x W^T + b with W held as `planes` packed planes (`pack`); x in the dtype the scales were packed in."""
    rows = x.reshape(-1, x.shape[-1])
    y = torch.ops.aten._weight_int4pack_mm_for_cpu(rows.contiguous(), packed, GROUP, scales_zeros)
    if y.shape[-1] != out_features:  # padded rows, and the planes' outputs to add up
        width = y.shape[-1] // planes
        y = sum(y[:, p * width : p * width + out_features] for p in range(planes))
    y = y.reshape(*x.shape[:-1], out_features)
    return y if bias is None else y + bias


def available() -> bool:
    """Whether this torch has the CPU int4 kernel (torch >= 2.6)."""
    return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")
