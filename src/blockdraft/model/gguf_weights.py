"""A GGUF file's own quantized blocks as 4-bit planes (model/quantized_weights.py), so the target runs the user's file.

Each GGUF block type below stores w = d * u + c for a group of 32 values, with u an unsigned integer of a few
bits and d, c per group: that is exactly a plane's form, so the conversion keeps every value the file holds
(checked against the `gguf` package's dequantization in tests/test_quantized_weights.py, and against the
converted model's weights at every load). Where it rounds: nowhere in float32; scales cast to bf16 round to 8
significant bits (quantized_weights.pack). Types not listed (F16, BF16, F32, Q6_K with its groups of 16,
Q2_K/Q3_K, Q5_K...) have no exact plane form here: their tensors are quantized from the dequantized values instead
(`quantized_weights.quantize`), and `load_planes` says which.

| type | u | bits | d | c |
|---|---|---|---|---|
| Q4_0 | q | 4 | d | -8 d |
| Q4_1 | q | 4 | d | m |
| Q4_K | q | 4 | d * sc_j (6-bit sub-block scale) | -dmin * m_j |
| Q5_0 | q | 5 | d | -16 d |
| Q5_1 | q | 5 | d | m |
| Q8_0 | q + 128 | 8 | d | -128 d |

The integers u are recovered from the `gguf` package's own dequantization ((w - c) / d, which is exact: each w
is d * u + c rounded once to float32 with at most 21 significant bits) rather than by re-implementing each type's
bit layout, and every group is checked to reproduce the file's values bit for bit.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .quantized_weights import GROUP, Planes, from_unsigned

BITS = {"Q4_0": 4, "Q4_1": 4, "Q4_K": 4, "Q5_0": 5, "Q5_1": 5, "Q8_0": 8}
TYPES = tuple(BITS)


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


def planes_from_blocks(raw: np.ndarray, type_name: str, shape: tuple[int, int]) -> Planes:
    """Planes for a tensor of `shape` [N, K] stored as GGUF blocks `raw` (uint8 [N, bytes per row])."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    if type_name not in BITS:
        raise ValueError(f"GGUF {type_name} blocks have no exact 4-bit plane form")
    N, K = shape
    values = dequantize(raw, GGMLQuantizationType[type_name]).reshape(N, K // GROUP, GROUP)
    per_block = raw.shape[1] // (K // (256 if type_name.endswith("_K") else GROUP))
    d, c = _scales(type_name, raw.reshape(-1, per_block))
    d, c = d.reshape(N, K // GROUP), c.reshape(N, K // GROUP)
    with np.errstate(divide="ignore", invalid="ignore"):
        u = np.where(d[..., None] != 0, np.rint((values - c[..., None]) / d[..., None]), 0)
    bits = BITS[type_name]
    if u.min() < 0 or u.max() >= 1 << bits:
        raise ValueError(f"GGUF {type_name} blocks decoded outside 0..{(1 << bits) - 1}")
    planes = from_unsigned(torch.from_numpy(u.reshape(N, K)), torch.from_numpy(d), torch.from_numpy(c), bits)
    if not torch.equal(planes.dequantize(), torch.from_numpy(values.reshape(N, K))):
        raise ValueError(f"GGUF {type_name} blocks do not convert exactly")
    return planes


def _gguf_name_map(model) -> dict[str, str]:
    """HF module name (model.layers.0.self_attn.q_proj) -> GGUF tensor name (blk.0.attn_q), by gguf-py's table."""
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map

    arch_name = {"gemma3_text": "gemma3", "qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe"}.get(
        model.config.model_type, model.config.model_type)
    arch = next((key for key, value in MODEL_ARCH_NAMES.items() if value == arch_name), None)
    if arch is None:
        return {}
    table = get_tensor_name_map(arch, model.config.num_hidden_layers)
    names = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            gguf_name = table.get_name(name)
            if gguf_name is not None:
                names[name] = gguf_name
    return names


def _row_order(model, gguf_name: str, rows: int) -> np.ndarray | None:
    """The row permutation transformers applied when it read this tensor (llama.cpp stores Llama's q and k
    rows interleaved for its rotary layout), found by passing row indices through the same processor."""
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    config = model.config.to_dict()
    processor = TENSOR_PROCESSORS.get(model.config.model_type, TensorProcessor)(config=config)
    index = np.arange(rows, dtype=np.float64)[:, None]
    order = processor.process(index, gguf_name + ".weight").weights[:, 0].astype(np.int64)
    if sorted(order.tolist()) != list(range(rows)):
        raise ValueError(f"transformers changes the values of {gguf_name}, not only their order")
    return None if (order == np.arange(rows)).all() else order


def load_planes(model, gguf_path: Path) -> tuple[dict[str, Planes], dict[str, str]]:
    """Planes for every linear layer of `model` (converted from `gguf_path`) whose GGUF blocks have an exact plane
    form, keyed by module name; and the GGUF type of every linear layer (what the others are stored as). Each
    plane set is checked to equal the model's own (dequantized) weight in its dtype."""
    from gguf import GGUFReader

    reader = GGUFReader(gguf_path)
    tensors = {t.name.removesuffix(".weight"): t for t in reader.tensors}
    planes, types = {}, {}
    for name, gguf_name in _gguf_name_map(model).items():
        tensor = tensors.get(gguf_name)
        if tensor is None and gguf_name == "output":  # a tied LM head: the file stores the embedding only
            tensor = tensors.get("token_embd")
        if tensor is None:
            continue
        type_name = tensor.tensor_type.name
        types[name] = type_name
        if type_name not in BITS:
            continue
        weight = model.get_submodule(name).weight
        raw = np.asarray(tensor.data).reshape(weight.shape[0], -1)
        order = _row_order(model, gguf_name, weight.shape[0])
        if order is not None:
            raw = raw[order]
        p = planes_from_blocks(raw, type_name, tuple(weight.shape))
        if not torch.equal(p.dequantize().to(weight.dtype), weight.detach()):
            raise ValueError(f"{gguf_path.name}: {gguf_name}'s blocks do not match the converted weight of {name}")
        planes[name] = p
    return planes, types
