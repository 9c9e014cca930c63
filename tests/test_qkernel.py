"""Our AVX2 W4A8/W8A8 kernel (model/qkernel.py): GGUF blocks kept as the file's integers exactly, the kernel's
arithmetic equal to its definition, each output independent of the other rows, and the engine lossless with it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from blockdraft.model import qkernel

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType  # noqa: E402
from gguf.quants import dequantize  # noqa: E402
from test_quantized_weights import _blocks  # noqa: E402

needs_kernel = pytest.mark.skipif(not qkernel.available(), reason="our kernel needs AVX2 and a C++ compiler")


def _q6k_blocks(rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Random Q6_K blocks (210 bytes a 256 values): random 6-bit values and int8 scales, a finite fp16 d."""
    rng = np.random.default_rng(seed)
    blocks = rows * cols // 256
    raw = rng.integers(0, 256, (blocks, 210), dtype=np.uint8)
    raw[:, 208:210] = (rng.random((blocks, 1)) * 0.01).astype(np.float16).view(np.uint8)
    return raw.reshape(rows, -1)


@pytest.mark.parametrize("type_name", qkernel.EXACT)
def test_every_gguf_type_keeps_the_files_values(type_name):
    rows, cols = 6, 512
    raw = _q6k_blocks(rows, cols) if type_name == "Q6_K" else _blocks(type_name, rows, cols)
    reference = dequantize(raw, GGMLQuantizationType[type_name]).reshape(rows, cols)
    q = qkernel.from_blocks(raw, type_name, (rows, cols))
    assert q.kind == ("q4" if type_name.startswith("Q4") else "q6" if type_name == "Q6_K" else "q8")
    assert torch.equal(q.values(), torch.from_numpy(reference))
    if q.kind != "q6":  # and torch's int4 kernel's planes hold them too (our kernel missing)
        assert torch.equal(qkernel.to_planes(q).dequantize(), torch.from_numpy(reference))


def test_a_type_without_an_exact_form_is_refused():
    raw = np.zeros((2, 256 // 256 * 84), dtype=np.uint8)  # Q2_K: 84 bytes a block
    with pytest.raises(ValueError, match="no exact form"):
        qkernel.from_blocks(raw, "Q2_K", (1, 256))


def _reference(x: torch.Tensor, q: qkernel.QWeight) -> torch.Tensor:
    """The kernel's definition in float64: activations rounded to int8 per block of 32 with scale max|x| / 127, times
    the weight's values (d u + c, per group: what the integer dot products and scales add up to)."""
    M, K = x.shape
    blocks = x.double().view(M, K // 32, 32)
    dx = blocks.abs().amax(-1, keepdim=True) / 127
    xq = torch.where(dx > 0, torch.round(blocks / dx), 0) * dx
    return xq.view(M, K) @ q.values().double().T


@needs_kernel
@pytest.mark.parametrize("type_name", qkernel.EXACT)
def test_the_kernel_computes_its_definition(type_name):
    rows, cols = 40, 512
    raw = _q6k_blocks(rows, cols, 1) if type_name == "Q6_K" else _blocks(type_name, rows, cols, 1)
    q = qkernel.from_blocks(raw, type_name, (rows, cols))
    x = torch.randn(5, cols)
    y = qkernel.linear(x, q)
    ref = _reference(x, q)
    assert torch.allclose(y.double(), ref, rtol=1e-4, atol=1e-4 * ref.abs().max().item())
    assert (y.double() - x.double() @ q.values().double().T).abs().max() > 0  # it is not float math: int8 activations


@needs_kernel
@pytest.mark.parametrize("kind", ["int4", "int8", "Q6_K"])
def test_each_row_gets_what_it_gets_alone(kind):
    """A tree's rows must get the logits one-row steps would (every method then equals `ar`): bit for bit, for every
    number of rows (tiles of 4 and their remainders)."""
    torch.manual_seed(0)
    if kind == "Q6_K":
        q = qkernel.from_blocks(_q6k_blocks(70, 512, 2), kind, (70, 512))
    else:
        q = qkernel.from_float(torch.randn(70, 96 * 3), kind)
    x = torch.randn(11, q.shape[1])
    alone = torch.cat([qkernel.linear(x[i : i + 1], q) for i in range(11)])
    for m in range(1, 12):
        assert torch.equal(qkernel.linear(x[:m], q), alone[:m]), m


@needs_kernel
def test_fused_projections_of_different_formats_concatenate():
    torch.manual_seed(0)
    parts = [qkernel.from_float(torch.randn(n, 64), kind) for n, kind in ((32, "int4"), (16, "int4"), (16, "int8"))]
    merged = qkernel.concat(parts)
    assert [p.kind for p in merged] == ["q4", "q8"] and merged[0].shape == (48, 64)
    x = torch.randn(3, 64)
    assert torch.equal(torch.cat([qkernel.linear(x, p) for p in merged], -1),
                       torch.cat([qkernel.linear(x, p) for p in parts], -1))
