"""Quantized weights in a GGUF file's own integers, multiplied by 8-bit activations in our AVX2 kernel (kernels/).

A `QWeight` holds one projection as the file stores it, without a float copy: 4-bit values (Q4_0, Q4_1, Q4_K) as
`q4`, w = d * u + c per group of 32; 5- to 8-bit values (Q5_0, Q5_1, Q8_0, and Q6_K with a scale per 16) as `q8`,
w = d * s (+ c). Every GGUF type listed in `EXACT` converts exactly (checked value by value against gguf-py's own
dequantization); others are quantized again from their values (`from_float`).

`linear` runs x W^T through kernels/qmatmul.cpp, compiled once per machine with torch's C++ extension builder (about
a minute; kept in the cache) and registered as a torch custom op, so that torch.compile keeps it in its graph. Its
arithmetic is llama.cpp's on this CPU kind: activations quantized to int8 per block of 32, integer dot products,
float scales. Each output depends on its own row only, so a verified tree's rows get the logits that one-row steps
would: every method stays lossless against `ar` on the same weights.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

log = logging.getLogger("blockdraft")
SOURCE = Path(__file__).parent / "kernels" / "qmatmul.cpp"
EXACT = ("Q4_0", "Q4_1", "Q4_K", "Q5_0", "Q5_1", "Q8_0", "Q6_K")


EMPTY = torch.empty(0)
FIELDS = ("w", "d", "c", "hi", "sc")  # the tensors of a QWeight, as the cache stores them


class QWeight(NamedTuple):
    """One [N, K] weight: kind "q4" (w uint8 [N, K/2], two values a byte) or "q8" (w int8 [N, K]), d float32
    [N, K/group], c float32 [N, K/32] or empty (no offset); or kind "q6" (GGUF Q6_K: w the low nibbles as q4, hi the
    two high bits, 4 a byte, sc int8 [N, K/16], d float32 [N, K/256])."""

    kind: str
    w: torch.Tensor
    d: torch.Tensor
    c: torch.Tensor
    group: int
    hi: torch.Tensor = EMPTY
    sc: torch.Tensor = EMPTY

    @property
    def shape(self) -> tuple[int, int]:
        n = self.w.shape[0]
        return (n, self.w.shape[1] * (1 if self.kind == "q8" else 2))

    def values(self) -> torch.Tensor:
        """The float32 [N, K] weight (d * u + c; Q6_K: (d sc) (q - 32)), as the file's dequantization computes it."""
        N, K = self.shape
        if self.kind in ("q4", "q6"):
            b = self.w.view(N, K // 32, 16)
            u = torch.cat([b & 15, b >> 4], dim=-1).float()
        if self.kind == "q6":
            h = self.hi.view(N, K // 32, 1, 8)
            high = torch.cat([(h >> (2 * k)) & 3 for k in range(4)], dim=2).view(N, K // 32, 32).float()
            scale = (self.d.repeat_interleave(16, dim=1) * self.sc.float()).view(N, K // 32, 2, 1)
            q = (u + 16 * high - 32).view(N, K // 32, 2, 16)
            return (scale * q).view(N, K)
        if self.kind != "q4":
            u = self.w.float().view(N, K // 32, 32)
        d = self.d.repeat_interleave(self.group, dim=1).view(N, K // 32, 32)
        w = u * d
        if self.c.numel():
            w = w + self.c[..., None]
        return w.view(N, K)


def to_planes(q: QWeight):
    """The same weight as torch's int4 kernel's planes (model/quantized_weights.py), where our kernel cannot run:
    exact for q4 and for q8 in groups of 32; q8 in groups of 16 (Q6_K) is quantized again at 8 bits in groups of 32."""
    from . import quantized_weights as qw

    N, K = q.shape
    if q.kind == "q4":
        b = q.w.view(N, K // 32, 16)
        u = torch.cat([b & 15, b >> 4], dim=-1).reshape(N, K)
        return qw.from_unsigned(u, q.d, q.c, 4)
    if q.kind == "q6" or q.group != 32:
        return qw.quantize(q.values(), "int8")
    c = q.c if q.c.numel() else torch.zeros_like(q.d)
    return qw.from_unsigned((q.w.int() + 128).to(torch.uint8), q.d, c - 128 * q.d, 8)


def _pack4(u: np.ndarray) -> np.ndarray:
    """[N, K] values 0..15 -> [N, K/2] bytes, byte i of a group of 32: element i low, element i + 16 high."""
    N, K = u.shape
    g = u.reshape(N, K // 32, 2, 16).astype(np.uint8)
    return (g[:, :, 0] | (g[:, :, 1] << 4)).reshape(N, K // 2)


def from_blocks(raw: np.ndarray, type_name: str, shape: tuple[int, int]) -> QWeight:
    """The exact QWeight of a tensor of `shape` [N, K] stored as GGUF blocks `raw` (uint8 [N, bytes a row])."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    from .gguf_weights import _scales

    if type_name not in EXACT:
        raise ValueError(f"GGUF {type_name} blocks have no exact form here")
    N, K = shape
    values = dequantize(raw, GGMLQuantizationType[type_name]).reshape(N, K).astype(np.float32)
    if type_name == "Q6_K":  # 210-byte blocks of 256: ql[128] qh[64] scales int8[16] d fp16; w = d sc_j (q - 32)
        return _q6k(raw, N, K, values)
    else:
        per_block = raw.shape[1] // (K // (256 if type_name.endswith("_K") else 32))
        d, c = _scales(type_name, raw.reshape(-1, per_block))
        d, c, group = d.reshape(N, K // 32), c.reshape(N, K // 32), 32
    dd = np.repeat(d, group, axis=1)
    base = values if c is None else values - np.repeat(c, 32, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        u = np.where(dd != 0, np.rint(base / dd), 0)
    if type_name in ("Q4_0", "Q4_1", "Q4_K"):
        kind, w = "q4", _pack4(u)
    else:
        kind = "q8"
        if type_name in ("Q5_0", "Q8_0"):  # c = -16 d / -128 d: a signed value and no offset
            u, c = u - {"Q5_0": 16, "Q8_0": 128}[type_name], None
        w = u.astype(np.int8)
        if not np.array_equal(w.astype(np.float64), u):
            raise ValueError(f"GGUF {type_name} blocks decoded outside int8")
    q = QWeight(kind, torch.from_numpy(np.ascontiguousarray(w)), torch.from_numpy(np.ascontiguousarray(d)),
                torch.from_numpy(np.ascontiguousarray(c)) if c is not None else torch.empty(0), group)
    if not torch.equal(q.values(), torch.from_numpy(values)):
        raise ValueError(f"GGUF {type_name} blocks do not convert exactly")
    return q


def _q6k(raw: np.ndarray, N: int, K: int, values: np.ndarray) -> QWeight:
    blocks = raw.reshape(-1, 210)
    d = np.ascontiguousarray(blocks[:, 208:210]).view(np.float16)[:, 0].astype(np.float32).reshape(N, K // 256)
    sc = np.ascontiguousarray(blocks[:, 192:208]).view(np.int8).reshape(N, K // 16)
    step = np.repeat(np.repeat(d, 16, axis=1) * sc.astype(np.float32), 16, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(step != 0, np.rint(values / step), 0) + 32
    if q.min() < 0 or q.max() > 63:
        raise ValueError("GGUF Q6_K blocks decoded outside 0..63")
    q = q.astype(np.uint8)
    h = (q >> 4).reshape(N, K // 32, 4, 8)
    hi = h[:, :, 0] | (h[:, :, 1] << 2) | (h[:, :, 2] << 4) | (h[:, :, 3] << 6)
    result = QWeight("q6", torch.from_numpy(_pack4(q & 15)), torch.from_numpy(d), EMPTY, 16,
                     torch.from_numpy(np.ascontiguousarray(hi.reshape(N, K // 4))), torch.from_numpy(sc.copy()))
    if not torch.equal(result.values(), torch.from_numpy(values)):
        raise ValueError("GGUF Q6_K blocks do not convert exactly")
    return result


def from_float(weight: torch.Tensor, kind: str) -> QWeight:
    """A float [N, K] weight quantized per group of 32: int4 asymmetric (as GGUF Q4_1), int8 symmetric (Q8_0)."""
    from . import quantized_weights as qw

    planes = qw.quantize(weight, kind)
    N, K = weight.shape
    if kind == "int4":  # one plane: w = (q - 8) scale + zero = scale q + (zero - 8 scale)
        q, scale, zero = planes.q[0], planes.scale[0], planes.zero[0]
        return QWeight("q4", torch.from_numpy(_pack4(q.numpy())), scale.clone(), zero - 8 * scale, 32)
    u = (planes.q[0].int() * 16 + planes.q[1].int()) - 128  # two planes: u = 16 h + l, w = d (u - 128)
    return QWeight("q8", u.to(torch.int8), planes.scale[1].clone(), torch.empty(0), 32)


@functools.cache
def _extension():
    """The compiled kernels, or None (with the reason logged) where they cannot be built or run."""
    if "avx2" not in _cpu_flags():
        log.warning("no AVX2 on this CPU: quantized weights use torch's int4 kernel")
        return None
    from torch.utils import cpp_extension

    from .loading import cache_dir

    key = hashlib.sha1(SOURCE.read_bytes() + torch.__version__.encode()).hexdigest()[:10]
    folder = cache_dir() / "kernels" / key
    folder.mkdir(parents=True, exist_ok=True)
    try:
        return cpp_extension.load(name=f"blockdraft_qmatmul_{key}", sources=[str(SOURCE)], build_directory=str(folder),
                                  extra_cflags=["-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-ffp-contract=off"],
                                  extra_ldflags=["-fopenmp"], verbose=False)
    except Exception as e:  # no compiler, no ninja...: say so once, and use torch's kernel
        log.warning("the AVX2 quantized kernel could not be built (%s): using torch's int4 kernel", e)
        return None


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return set(next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), []))


def available() -> bool:
    return _extension() is not None


# A GGUF model at least this large runs in our kernel on every CPU where it builds: torch's int4 path keeps a full
# copy of the weights beside the planes (what its trees read), GBs for a 1.5B model, and its one-row kernel was the
# slower one for Qwen2.5-Coder-1.5B on the AMX Xeon too (BENCHMARKS.md, "Decisions": qkernel.preferred).
LARGE_MODEL_BYTES = 300e6


def preferred(file_bytes: float) -> bool:
    """Whether a GGUF file's quantized projections (`file_bytes` in all) run here, with no float copy, rather than as
    torch's int4 planes plus a full copy: on CPUs without AVX512, where torch's kernel has no fast path, always; on
    AVX512 / AMX CPUs for large models only (torch's compiled int4 template with a full copy for trees stays the
    faster path for a small model). BLOCKDRAFT_QKERNEL=1 / 0 decides."""
    choice = os.environ.get("BLOCKDRAFT_QKERNEL")
    if choice is not None:
        return choice == "1" and available()
    return ("avx512f" not in _cpu_flags() or file_bytes >= LARGE_MODEL_BYTES) and available()


@torch.library.custom_op("blockdraft::qlinear", mutates_args=())
def _qlinear(x: torch.Tensor, w: torch.Tensor, d: torch.Tensor, c: torch.Tensor, hi: torch.Tensor, sc: torch.Tensor,
             kind: str, group: int) -> torch.Tensor:
    ext = _extension()
    if kind == "q4":
        return ext.q4_linear(x, w, d, c)
    if kind == "q6":
        return ext.q6_linear(x, w, hi, sc, d)
    return ext.q8_linear(x, w, d, c, group)


@_qlinear.register_fake
def _(x, w, d, c, hi, sc, kind, group):
    return x.new_empty(x.shape[0], w.shape[0])


def linear(x: torch.Tensor, q: QWeight) -> torch.Tensor:
    """x W^T (float32 out, any leading shape; activations quantized to int8 inside)."""
    rows = x.reshape(-1, x.shape[-1]).float().contiguous()
    return _qlinear(rows, q.w, q.d, q.c, q.hi, q.sc, q.kind, q.group).reshape(*x.shape[:-1], q.w.shape[0])


class Embedding(torch.nn.Module):
    """An embedding table kept as the file's integers (a GGUF token_embd of 151,936 x 1,536: 175 MB as Q4_K, 933 MB
    in float32): the rows looked up are dequantized when asked for, exactly (QWeight.values), in `dtype`."""

    def __init__(self, q: QWeight, dtype: torch.dtype):
        super().__init__()
        self.q, self.dtype, self.device = q, dtype, torch.device("cpu")
        self.shape = q.shape

    def rows(self, index: torch.Tensor) -> torch.Tensor:
        q = self.q
        pick = [getattr(q, f)[index] if getattr(q, f).numel() else getattr(q, f) for f in FIELDS]
        return QWeight(q.kind, pick[0], pick[1], pick[2], q.group, pick[3], pick[4]).values().to(self.dtype)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.rows(tokens.reshape(-1)).view(*tokens.shape, self.shape[1])

    def __getitem__(self, index) -> torch.Tensor:  # embed[:1]: a row, for its dtype and device
        return self.rows(torch.arange(self.shape[0])[index])


def concat(parts: list[QWeight]) -> list[QWeight]:
    """Weights stacked along N (q|k|v), merged where their formats agree: one kernel call each."""
    merged: list[QWeight] = []
    for p in parts:
        last = merged[-1] if merged else None
        if last is not None and (last.kind, last.group, bool(last.c.numel())) == (p.kind, p.group, bool(p.c.numel())):
            merged[-1] = QWeight(p.kind, *(torch.cat([getattr(last, f), getattr(p, f)]) if getattr(p, f).numel()
                                           else getattr(p, f) for f in ("w", "d", "c")), p.group,
                                 *(torch.cat([getattr(last, f), getattr(p, f)]) if getattr(p, f).numel()
                                   else getattr(p, f) for f in ("hi", "sc")))
        else:
            merged.append(p)
    return merged
