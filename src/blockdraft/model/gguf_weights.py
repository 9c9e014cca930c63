"""GGUF block types as (d, c, u) per group of 32 -- w = d * u + c -- and the row order transformers reads tensors in.

Each block type below stores w = d * u + c for a group of 32 values, with u an unsigned integer of a few bits and
d, c per group; model/qkernel.py keeps those integers and scales as they are (Q6_K, with a scale per 16, has its own
form there). The integers u are recovered from the `gguf` package's own dequantization ((w - c) / d, exact: each w is
d * u + c rounded once to float32 with at most 21 significant bits), rather than by re-implementing each type's bit
layout, and every group is checked to reproduce the file's values bit for bit (qkernel.from_blocks).

| type | u | bits | d | c |
|---|---|---|---|---|
| Q4_0 | q | 4 | d | -8 d |
| Q4_1 | q | 4 | d | m |
| Q4_K | q | 4 | d * sc_j (6-bit sub-block scale) | -dmin * m_j |
| Q5_0 | q | 5 | d | -16 d |
| Q5_1 | q | 5 | d | m |
| Q8_0 | q + 128 | 8 | d | -128 d |
"""

from __future__ import annotations

import numpy as np

# K-quants of more than 4 bits with no exact form in qkernel: quantized again from their values at 8 bits in groups
# of 32 (error at most half an int8 step), never at 4
EIGHT_BIT_TYPES = ("Q5_K", "Q8_K")


def _half(raw: np.ndarray, at: int) -> np.ndarray:
    """The fp16 field at byte `at` of every block, as float32."""
    return np.ascontiguousarray(raw[:, at : at + 2]).view(np.float16)[:, 0].astype(np.float32)


def _scales(type_name: str, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(d, c) float32 [blocks, groups per block]: each 32-value group's step and offset (see the table)."""
    if type_name == "Q4_K":
        from gguf.quants import Q4_K

        sc, m = Q4_K.get_scale_min(np.ascontiguousarray(blocks[:, 4:16]))
        d, dmin = _half(blocks, 0), _half(blocks, 2)
        return d[:, None] * sc.astype(np.float32), -dmin[:, None] * m.astype(np.float32)
    d = _half(blocks, 0)[:, None]
    if type_name in ("Q4_1", "Q5_1"):
        return d, _half(blocks, 2)[:, None]
    return d, {"Q4_0": -8.0, "Q5_0": -16.0, "Q8_0": -128.0}[type_name] * d


def row_order(processor, gguf_name: str, rows: int) -> np.ndarray | None:
    """The row permutation transformers' tensor `processor` applies to this tensor (llama.cpp stores Llama's q and k
    rows interleaved for its rotary layout), found by passing row indices through it; None when it keeps them."""
    index = np.arange(rows, dtype=np.float64)[:, None]
    order = processor.process(index, gguf_name + ".weight").weights[:, 0].astype(np.int64)
    if sorted(order.tolist()) != list(range(rows)):
        raise ValueError(f"transformers changes the values of {gguf_name}, not only their order")
    return None if (order == np.arange(rows)).all() else order
