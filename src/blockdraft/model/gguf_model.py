"""Build a target straight from a GGUF file, one tensor at a time: no float32 copy of the model in memory or on disk.

transformers reads a GGUF file by dequantizing every tensor to float32 at once: a 1.1 GB Q4_K_M file of a 1.5B model
became a 7.5 GB folder on disk and a 15 GB peak in memory (issue 65). Here the model is made on the meta device
(accelerate's `init_empty_weights`), and each tensor of the file is then placed on its own:

- a projection the engine runs quantized (`weights` int8/int4) becomes planes (model/quantized_weights.py) and its
  `nn.Linear` keeps no weight at all (it stays on the meta device; the engine's `Linear` holds the planes and
  transformers' forward is routed through it, model/engine.py);
- every other tensor (norms, biases, the embedding, all projections with `weights` full) is dequantized alone and
  cast to the target's dtype.

The planes are computed once (minutes for a 1.5B model: gguf-py dequantizes in numpy) and kept in the cache, one
safetensors file per layer (model/loading.py `PLANES_FOLDER`), so that neither the computing nor a later load ever
holds more than one layer's planes unpacked. Which block types convert exactly, and what happens to the others:
model/gguf_weights.py.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..errors import BlockdraftError
from . import gguf_weights
from . import qkernel

# tensor processors that map one GGUF tensor to one HF tensor (so tensors can be read one at a time); the static
# engine's families use only these (Llama: q/k rows permuted; Gemma: norms stored plus one)
STREAMABLE = ("TensorProcessor", "LlamaTensorProcessor", "Gemma2TensorProcessor")
ARCH_NAMES = {"gemma3_text": "gemma3", "qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe"}


def _processor(config):
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    arch = ARCH_NAMES.get(config.model_type, config.model_type)
    return TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=config.to_dict())


def streamable(config) -> bool:
    """Whether this model type's GGUF tensors map one to one onto its parameters (else transformers converts it)."""
    return type(_processor(config)).__name__ in STREAMABLE


def _layer_key(name: str) -> str:
    """The cache file a module's planes go to: 'layer12' for model.layers.12.*, else 'other'."""
    match = re.search(r"\.layers\.(\d+)\.", name)
    return f"layer{int(match.group(1)):03d}" if match else "other"


class CachedWeights(Mapping):
    """nn.Linear -> QWeight (model/qkernel.py), read from the cache folder when asked for, one at a time."""

    def __init__(self, folder: Path, modules: dict[str, nn.Module], ours: bool):
        self.folder, self.by_module = folder, {m: name for name, m in modules.items()}
        self.ours = ours  # our kernel runs them (qkernel.preferred, decided once at load for the whole model)

    def __getitem__(self, module) -> qkernel.QWeight:
        from safetensors import safe_open

        name = self.by_module[module]
        with safe_open(self.folder / f"{_layer_key(name)}.safetensors", "pt") as f:
            kind, group = f.metadata()[name].split(":")
            t = {field: f.get_tensor(f"{name}.{field}") for field in qkernel.FIELDS}
            return qkernel.QWeight(kind, t["w"], t["d"], t["c"], int(group), t["hi"], t["sc"])

    def __iter__(self):
        return iter(self.by_module)

    def __len__(self) -> int:
        return len(self.by_module)


def _weight_for(raw: np.ndarray, type_name: str, shape: tuple[int, int], weights: str, values) -> qkernel.QWeight:
    """A projection's quantized weight: the file's own blocks where they convert exactly (qkernel.EXACT); else
    quantized from its values, at 8 bits for a K-quant of more than 4 bits (int4 would throw away what it holds)."""
    if type_name in qkernel.EXACT:
        return qkernel.from_blocks(raw, type_name, shape)
    kind = "int8" if weights == "int8" or type_name in gguf_weights.EIGHT_BIT_TYPES else "int4"
    return qkernel.from_float(torch.from_numpy(values()), kind)


ROWS_AT_ONCE = 8192  # rows of a tensor converted at a time: its float32 intermediates stay ~100 MB


def _converted(raw: np.ndarray, tensor, shape: tuple[int, int], weights: str) -> qkernel.QWeight:
    """A tensor's QWeight, converted ROWS_AT_ONCE rows at a time (a 151,936-row LM head would otherwise take GBs)."""
    from gguf.quants import dequantize

    parts = []
    for start in range(0, shape[0], ROWS_AT_ONCE):
        rows = raw[start : start + ROWS_AT_ONCE]
        part_shape = (rows.shape[0], shape[1])

        def values(rows=rows, part_shape=part_shape):
            return np.ascontiguousarray(dequantize(rows, tensor.tensor_type).reshape(part_shape), dtype=np.float32)

        parts.append(_weight_for(rows, tensor.tensor_type.name, part_shape, weights, values))
    if len(parts) == 1:
        return parts[0]
    joined = {f: torch.cat([getattr(p, f) for p in parts]) for f in qkernel.FIELDS}
    return qkernel.QWeight(parts[0].kind, joined["w"], joined["d"], joined["c"], parts[0].group, joined["hi"],
                           joined["sc"])


def _write_planes(model, reader, names: dict[str, str], folder: Path, weights: str) -> None:
    """Convert every quantized projection's blocks (qkernel.QWeight) and write them, a layer a file."""
    from safetensors.torch import save_file
    from tqdm import tqdm

    processor = _processor(model.config)
    by_layer: dict[str, list] = {}
    for tensor in reader.tensors:
        hf = names.get(tensor.name)
        if hf is None or not hf.endswith(".weight"):
            continue
        module_name = hf.removesuffix(".weight")
        module = model.get_submodule(module_name)
        if isinstance(module, nn.Linear):
            by_layer.setdefault(_layer_key(module_name), []).append((module_name, module, tensor))
    modules = {m: n for n, m in model.named_modules()}
    head, embed = modules.get(model.get_output_embeddings()), modules.get(model.get_input_embeddings())
    embedding = next(t for t in reader.tensors if names.get(t.name) == f"{embed}.weight")
    if head is not None and all(entry[0] != head for entry in by_layer.get("other", [])):
        # a tied LM head: the file stores the embedding only, and the head reads the same blocks
        by_layer.setdefault("other", []).append((head, model.get_submodule(head), embedding))
    # the embedding too, for where our kernel runs the model (qkernel.Embedding reads its rows as the file's integers)
    by_layer.setdefault("other", []).append((embed, model.get_submodule(embed), embedding))
    tmp = folder.with_name(folder.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    for key, entries in tqdm(sorted(by_layer.items()), desc="converting the GGUF blocks to planes (once)",
                             leave=False):
        flat, meta = {}, {}
        for module_name, module, tensor in entries:
            shape = tuple(module.weight.shape)
            raw = np.asarray(tensor.data).reshape(shape[0], -1)
            order = gguf_weights.row_order(processor, tensor.name.removesuffix(".weight"), shape[0])
            if order is not None:
                raw = raw[order]

            try:
                q = _converted(raw, tensor, shape, weights)
            except ValueError as e:
                raise BlockdraftError(f"{tensor.name} ({tensor.tensor_type.name}): {e}") from None
            for field in qkernel.FIELDS:
                flat[f"{module_name}.{field}"] = getattr(q, field).contiguous()
            meta[module_name] = f"{q.kind}:{q.group}"
        save_file(flat, tmp / f"{key}.safetensors", metadata=meta)
    tmp.replace(folder)


def build(folder: Path, gguf: Path, dtype: torch.dtype, weights: str, planes_folder: Path):
    """(model, planes): the model of `folder`'s config with the GGUF file's tensors; `planes` maps each quantized
    projection (weights int8/int4) to its planes (CachedPlanes), None with weights full."""
    from accelerate import init_empty_weights
    from gguf import GGUFReader
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig
    from transformers.modeling_gguf_pytorch_utils import get_gguf_hf_weights_map

    config = AutoConfig.from_pretrained(folder)
    with init_empty_weights(include_buffers=False):  # parameters on meta; buffers (rotary tables) real
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    if (folder / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(folder)
    reader = GGUFReader(gguf)
    processor = _processor(config)
    names = get_gguf_hf_weights_map(model, processor)  # "blk.0.attn_q.weight" -> "model.layers.0...q_proj.weight"
    quantized = weights != "full"
    if quantized and not (planes_folder / "other.safetensors").is_file():
        _write_planes(model, reader, names, planes_folder, weights)
    linears = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    cached = _cached_names(planes_folder) if quantized else set()
    # where our kernel runs the projections, the embedding stays the file's integers too; else a dense copy
    ours = quantized and qkernel.preferred(gguf.stat().st_size)
    cached_embedding = {n for n, m in model.named_modules() if isinstance(m, nn.Embedding) and n in cached and ours}
    for tensor in reader.tensors:
        hf = names.get(tensor.name)
        if hf is None:
            continue
        module_name, attr = hf.rsplit(".", 1)
        if quantized and attr == "weight" and (module_name in linears or (module_name in cached_embedding)):
            continue  # the planes hold it
        _place(model, hf, _dequantized(tensor, processor, dtype))
    if config.tie_word_embeddings:
        model.tie_weights()
    missing = [n for n, p in model.named_parameters()
               if p.is_meta and not (quantized and n.removesuffix(".weight") in cached)]
    if missing:
        raise BlockdraftError(f"{gguf.name} has no tensor for {len(missing)} parameters of this "
                              f"{config.model_type} model (the first: {missing[0]})")
    if not quantized:
        return model.eval(), None
    # a tied head's weight is the (dense) embedding; its planes are in the cache like every other projection's
    modules = dict(model.named_modules())
    return model.eval(), CachedWeights(planes_folder, {n: modules[n] for n in cached}, ours)


def _cached_names(folder: Path) -> set[str]:
    from safetensors import safe_open

    names = set()
    for path in folder.glob("*.safetensors"):
        with safe_open(path, "pt") as f:
            names.update(key.rsplit(".", 1)[0] for key in f.keys())
    return names


def _dequantized(tensor, processor, dtype: torch.dtype) -> torch.Tensor:
    """A tensor's values in `dtype`, dequantized ROWS_AT_ONCE rows at a time into the result (processors act on rows:
    Gemma's norms, and Llama's q/k rows, which are fewer than ROWS_AT_ONCE)."""
    from gguf.quants import dequantize

    data = np.asarray(tensor.data)
    if data.ndim == 1 or data.shape[0] <= ROWS_AT_ONCE:
        values = processor.process(weights=dequantize(data, tensor.tensor_type), name=tensor.name).weights
        return torch.from_numpy(np.array(values, dtype=np.float32)).to(dtype)
    parts = []
    for start in range(0, data.shape[0], ROWS_AT_ONCE):
        values = dequantize(data[start : start + ROWS_AT_ONCE], tensor.tensor_type)
        values = processor.process(weights=values, name=tensor.name).weights
        parts.append(torch.from_numpy(np.array(values, dtype=np.float32)).to(dtype))
    return torch.cat(parts)


def _place(model, name: str, value: torch.Tensor) -> None:
    module_name, attr = name.rsplit(".", 1)
    module = model.get_submodule(module_name)
    old = getattr(module, attr)
    if tuple(old.shape) != tuple(value.shape):
        raise BlockdraftError(f"the GGUF tensor for {name} has shape {tuple(value.shape)}, "
                              f"the model {tuple(old.shape)}")
    setattr(module, attr, nn.Parameter(value, requires_grad=False))
