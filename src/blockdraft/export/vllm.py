"""The bpd drafter as a vLLM Medusa checkpoint, the dflash drafter as a vLLM DFlash one: exact, or refused (why).

Both formats were read off vLLM 0.32's loaders (vllm/model_executor/models/medusa.py, qwen3_dflash.py, the
proposers in vllm/v1/spec_decode/ and vllm/config/speculative.py). Each export is a folder with config.json
and model.safetensors (float32; vLLM casts to its own dtype on load). Where our architecture computes
something vLLM's cannot, nothing is written: the error names every mismatch and the compatible variant to
train (`blockdraft train --style medusa|vllm`). The one rewrite done is exact algebra: our per-dimension
feature scale s folds into the DFlash fc, W (s * f) = (W diag s) f, with its columns permuted to the
ascending layer order in which vLLM concatenates the target's states.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import save_file

from ..drafters.checkpoint import CONFIG, WEIGHTS, load_checkpoint, load_weights, target_signature
from ..drafters.bpd import BPDConfig, BPDModel
from ..drafters.dflash_model import DFlashConfig, DFlashModel
from ..errors import BlockdraftError
from .folder import check_output, write_files

VLLM_VERSION = "0.32"  # the vLLM whose loaders these formats follow


def _fields(cls, config: dict) -> dict:
    return {k: v for k, v in config.items() if k in cls.__dataclass_fields__}


def _lm_head_rows(target, vocab: torch.Tensor | None) -> torch.Tensor:
    """The target's LM head restricted to the draft vocabulary: the frozen head our drafters read."""
    w = target.model.get_output_embeddings().weight.detach().float().cpu()
    return w if vocab is None else w[vocab.long()]


# --- Medusa (the bpd drafter) --------------------------------------------------------------------------------
def medusa_mismatches(config: dict, state: dict, target) -> list[str]:
    """Why vLLM's MedusaModel cannot run these heads as they are (empty: it can)."""
    c = BPDConfig(**_fields(BPDConfig, config))
    if c.style == "medusa":
        return []
    return [f"head shape: our BPD heads are x + W2 SiLU(W1 x) with a {c.inner_size}-wide inner layer, vLLM's Medusa "
            f"heads x + SiLU(W x + b) with W square ({c.hidden_size}x{c.hidden_size}) and nothing after the SiLU "
            "(vllm/model_executor/models/medusa.py, ResidualBlock): no choice of weights turns one into the other"]


def medusa_convert(config: dict, state: dict, target, folder) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config.json, tensors) of vLLM's MedusaModel: blocks.{h}.layers.{l}.{weight,bias}, one shared LM head
    (original_lm_head) over the draft vocabulary and token_map, its draft -> target id map."""
    vocab = state.pop("draft_vocab", None)
    c = BPDConfig(**_fields(BPDConfig, config))
    model = BPDModel(c)
    load_weights(model, state, folder)
    tensors = {f"blocks.{k.removeprefix('heads.')}": v.float() for k, v in model.state_dict().items()}
    # Our heads all read the target's frozen LM head: vLLM's original_lm_head is exactly that (one
    # lm_head for every head, loaded from lm_heads.0.weight), already cut to the draft vocabulary.
    tensors["lm_heads.0.weight"] = _lm_head_rows(target, vocab)
    if vocab is not None:
        tensors["token_map"] = vocab.long()
    # vLLM 0.32 loads token_map (medusa.py:171-173) but leaves it out of the names load_weights returns (202),
    # so default_loader.py's strict track_weights_loading refuses the checkpoint ("Following weights were not
    # initialized from checkpoint: {'token_map'}"). The tensors are right; vLLM must be told
    # model_loader_extra_config={"enable_weights_track": False}, or the heads trained with --draft-vocab 0.
    bias = model.heads[0].layers[0].bias is not None
    # MedusaConfig.from_pretrained renames every top-level key holding "num" and "heads"/"layers": keep
    # ours to num_heads / num_hidden_layers (our own record sits under "blockdraft").
    out = {"architectures": ["MedusaModel"], "model_type": "medusa", "hidden_size": c.hidden_size,
           "vocab_size": target.vocab_size, "num_heads": c.num_heads, "num_hidden_layers": c.medusa_layers,
           "truncated_vocab_size": target.vocab_size if vocab is None else len(vocab), "original_lm_head": True,
           "medusa_fc_bias": bias, "dtype": "float32"}
    return out, tensors


# --- DFlash (the dflash drafter) ----------------------------------------------------------------------------
def dflash_mismatches(config: dict, state: dict, target) -> list[str]:
    """Why vLLM's DFlashDraftModel cannot run this DFlash drafter as it is (empty: it can)."""
    c = DFlashConfig(**_fields(DFlashConfig, config))
    out = []
    if c.style != "vllm":
        extra = " and the target's final state" if c.final_state_residual else ""
        out.append("block inputs: ours add the root's embedding, the projected last context state" + extra +
                   " to every block position and learn one MASK embedding per depth; vLLM's DFlash feeds plain "
                   "token embeddings, the bonus token's and then the embedding of mask_token_id at every depth "
                   "(vllm/model_executor/models/qwen3_dflash.py, DFlashQwen3Model.forward and embed_input_ids)")
        out.append("q/k norm: vLLM's DFlash attention RMS-normalises every query and key head (q_norm, k_norm, "
                   "the context keys too: qwen3_dflash.py DFlashQwen3Attention, _normalize_context_k); ours has no "
                   "such norm, and no weights undo a normalisation")
    final = [lay for lay in c.feature_layers if lay >= target.num_layers]
    if final:
        out.append(f"feature layer {final[0]}: ours reads the target's final normed state (hidden_states"
                   f"[{final[0]}]); vLLM hands a drafter residual-stream states before the final norm only "
                   "(vllm/model_executor/models/interfaces.py _maybe_add_hidden_state: hidden_states + residual)")
    mean = state.get("feature_mean")
    if mean is not None and bool(mean.abs().max() > 0):
        out.append("feature centring: ours subtracts a per-dimension mean from the target's states before fc; "
                   "vLLM's fc is a linear map without bias (qwen3_dflash.py, ReplicatedLinear(bias=False)) followed "
                   "by an RMSNorm, so a scale folds into it exactly but a shift does not")
    if not 0 <= c.mask_token_id < target.vocab_size:
        out.append(f"mask_token_id {c.mask_token_id} is not a token of the target (vocabulary {target.vocab_size})")
    return out


def dflash_convert(config: dict, state: dict, target, folder) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config.json, tensors) of vLLM's DFlashDraftModel (Qwen3-style layers, fc, hidden_norm, norm, lm_head,
    d2t); embed_tokens is left out, so vLLM shares the target's, which is what our drafter reads."""
    vocab = state.pop("draft_vocab", None)
    c = DFlashConfig(**_fields(DFlashConfig, config))
    model = DFlashModel(c)
    load_weights(model, state, folder)
    s = {k: v.float() for k, v in model.state_dict().items()}
    h = c.hidden_size
    # vLLM concatenates the states in layer order (it collects them while running the layers), and names
    # a state by the layer that produced it: our hidden_states[i] is its target_layer_ids i - 1.
    order = sorted(range(len(c.feature_layers)), key=lambda i: c.feature_layers[i])
    cols = torch.cat([torch.arange(h) + h * i for i in order])
    tensors = {"fc.weight": (s["fc.weight"] * s["feature_scale"][None])[:, cols].contiguous(),
               "hidden_norm.weight": s["context_norm.weight"], "norm.weight": s["norm.weight"],
               "lm_head.weight": _lm_head_rows(target, vocab)}
    names = {"q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj", "v_proj": "self_attn.v_proj",
             "o_proj": "self_attn.o_proj", "q_norm": "self_attn.q_norm", "k_norm": "self_attn.k_norm",
             "gate_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj", "down_proj": "mlp.down_proj",
             "input_norm": "input_layernorm", "post_norm": "post_attention_layernorm"}
    for i in range(c.num_layers):
        for ours, theirs in names.items():
            tensors[f"layers.{i}.{theirs}.weight"] = s[f"layers.{i}.{ours}.weight"]
    if vocab is not None:  # EAGLE-3's convention, which vLLM's DFlash shares: target id = draft id + d2t[draft id]
        tensors["d2t"] = vocab.long() - torch.arange(len(vocab))
    out = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": h,
           "num_hidden_layers": c.num_layers, "num_attention_heads": c.num_heads,
           "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim, "intermediate_size": c.intermediate_size,
           "hidden_act": "silu", "rms_norm_eps": c.rms_eps, "attention_bias": False, "use_sliding_window": False,
           "rope_parameters": {"rope_type": "default", "rope_theta": c.rope_theta}, "rope_theta": c.rope_theta,
           "max_position_embeddings": getattr(target.model.config, "max_position_embeddings", 8192),
           "vocab_size": target.vocab_size, "draft_vocab_size": target.vocab_size if vocab is None else len(vocab),
           "target_hidden_size": h, "tie_word_embeddings": False, "block_size": c.gamma,
           "dflash_config": {"target_layer_ids": [c.feature_layers[i] - 1 for i in order],
                             "mask_token_id": c.mask_token_id},
           "dtype": "float32"}
    return out, tensors


@dataclass(frozen=True)
class VllmFormat:
    """One of vLLM's speculative methods (a Method's `exporter`) and how our checkpoints become its."""

    kind: str  # the checkpoint kind it reads (drafters.checkpoint), our method's name
    style: str  # our variant vLLM can run (`blockdraft train --style`)
    mismatches: Callable
    convert: Callable


FORMATS = {  # vLLM's speculative_config["method"] -> how to write it
    "medusa": VllmFormat("bpd", "medusa", medusa_mismatches, medusa_convert),
    "dflash": VllmFormat("dflash", "vllm", dflash_mismatches, dflash_convert),
}


def export_vllm(out, method: str, target, checkpoint=None, force: bool = False) -> Path:
    """Write `method`'s checkpoint (default: the one shipped for `target`) to `out` in vLLM's format. `out` must be
    new or empty; with `force` a non-empty folder too, where only an earlier export's files are replaced
    (export/folder.py). Nothing is ever deleted, and the source checkpoint's folder is refused."""
    from ..methods import METHODS, shipped_checkpoint

    exporter = METHODS[method].exporter if method in METHODS else None
    if exporter not in FORMATS:
        exportable = [m.name for m in METHODS.values() if m.exporter in FORMATS]
        raise BlockdraftError(f"cannot export method '{method}' to vLLM: choose one of {', '.join(exportable)}")
    e, train_as = FORMATS[exporter], METHODS[method].trainer
    folder = Path(checkpoint) if checkpoint else shipped_checkpoint(target, method, train_as)
    out = Path(out)
    check_output(out, folder, (CONFIG, WEIGHTS), force)  # before any work: a refusal costs nothing
    config, state = load_checkpoint(folder, e.kind, target)  # the right kind, made for this target
    problems = e.mismatches(config, state, target)
    if problems:
        raise BlockdraftError(
            f"'{folder}' cannot be written as vLLM's {exporter} drafter without changing what it computes: "
            + "; ".join(f"({i}) {p}" for i, p in enumerate(problems, 1))
            + f". Train the compatible variant with `blockdraft train --drafter {train_as} --style {e.style} "
            f"--out DIR` and export that (--checkpoint DIR)")
    vllm_config, tensors = e.convert(config, state, target, folder)
    vllm_config["blockdraft"] = {"method": method, "source": str(folder), "target": target_signature(target),
                                 "vllm_method": exporter, "vllm_version": VLLM_VERSION}
    # the weights first, config.json last: a folder with an export's config.json holds all of the export
    write_files(out, {
        WEIGHTS: lambda path: save_file({k: v.contiguous() for k, v in tensors.items()}, str(path),
                                        metadata={"format": "pt"}),
        CONFIG: lambda path: path.write_text(json.dumps(vllm_config, indent=1) + "\n")})
    return out
