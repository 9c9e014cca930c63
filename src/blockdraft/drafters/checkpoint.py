"""Drafter checkpoints: safetensors weights + config.json that records the target they were trained for."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ..errors import BlockdraftError

CONFIG, WEIGHTS = "config.json", "model.safetensors"
def target_signature(target) -> dict:
    """What a checkpoint remembers about its target; loading with any other target is refused."""
    return {"name": target.name, "vocab_size": target.vocab_size, "hidden_size": target.hidden_size,
            "num_layers": target.num_layers}


def save_checkpoint(folder, kind: str, config: dict, state: dict[str, torch.Tensor], target_sig: dict,
                    dtype: torch.dtype = torch.float16) -> Path:
    """Write config.json + model.safetensors. Float weights are stored as `dtype` (fp16 halves the size)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: (v.to(dtype) if v.is_floating_point() else v).detach().cpu().contiguous() for k, v in state.items()}
    save_file(tensors, str(folder / WEIGHTS), metadata={"format": "pt"})
    full = {"blockdraft_drafter": kind, "target": target_sig, **config}
    (folder / CONFIG).write_text(json.dumps(full, indent=1) + "\n")
    return folder


def read_config(folder) -> dict:
    """A checkpoint folder's config.json (its drafter kind is under "blockdraft_drafter"), checked."""
    folder = Path(folder)
    if not (folder / CONFIG).is_file() or not (folder / WEIGHTS).is_file():
        raise BlockdraftError(f"'{folder}' is not a drafter checkpoint (needs {CONFIG} and {WEIGHTS})")
    try:
        config = json.loads((folder / CONFIG).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BlockdraftError(f"corrupt drafter checkpoint '{folder}': {CONFIG} is not valid JSON ({e})") from None
    return config if isinstance(config, dict) else {}


def load_checkpoint(folder, kind: str, target=None) -> tuple[dict, dict[str, torch.Tensor]]:
    """Read and check a checkpoint folder: right drafter kind, right target, readable weights."""
    folder = Path(folder)
    config = read_config(folder)
    found = config.get("blockdraft_drafter")
    if found != kind:
        raise BlockdraftError(f"'{folder}' holds a '{found}' drafter, not a '{kind}' drafter")
    if target is not None:
        check_target(config.get("target") or {}, target, folder)
    try:
        state = load_file(str(folder / WEIGHTS))
    except (SafetensorError, OSError, ValueError) as e:
        raise BlockdraftError(f"corrupt drafter checkpoint '{folder}': cannot read {WEIGHTS} ({e})") from None
    return config, {k: v.float() if v.is_floating_point() else v for k, v in state.items()}


def check_target(recorded: dict, target, folder, what: str = "drafter") -> None:
    """Refuse a checkpoint whose recorded target differs from `target` in name, vocabulary, width or depth."""
    have = target_signature(target)
    wrong = [k for k in ("vocab_size", "hidden_size", "num_layers") if recorded.get(k) != have[k]]
    if recorded.get("name") != have["name"]:
        wrong.insert(0, "name")
    if wrong:
        def show(sig):
            return f"'{sig.get('name')}' (vocab {sig.get('vocab_size')}, hidden {sig.get('hidden_size')}, " \
                   f"{sig.get('num_layers')} layers)"
        raise BlockdraftError(f"the {what} '{folder}' was trained for target {show(recorded)}, "
                              f"not for {show(have)}: train one for this target with `blockdraft train`")


def load_weights(module: torch.nn.Module, state: dict[str, torch.Tensor], folder, target=None) -> None:
    """load_state_dict with a readable error for checkpoints whose tensors do not fit the config; with a
    `target`, the module is then cast to the target's dtype and moved to its device (`on_target`)."""
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as e:
        first = str(e).strip().splitlines()
        raise BlockdraftError(f"corrupt drafter checkpoint '{folder}': weights do not match its config "
                              f"({' '.join(first[:2])[:300]})") from None
    if target is not None:
        on_target(module, target)


def on_target(module: torch.nn.Module, target) -> torch.nn.Module:
    """Cast a module's float weights and buffers to the target's dtype, on the target's device: drafters
    take both from the target (one source of truth), never from a setting of their own."""
    return module.to(device=target.device, dtype=target.dtype)


def save_drafter(folder, kind: str, model: torch.nn.Module, lm_head, target) -> Path:
    """Save a neural drafter: its module's weights and config, plus the draft->target vocabulary map."""
    state = dict(model.state_dict())
    if lm_head.vocab is not None:
        state["draft_vocab"] = lm_head.vocab
    config = asdict(model.config)
    config["draft_vocab"] = 0 if lm_head.vocab is None else len(lm_head.vocab)
    return save_checkpoint(folder, kind, config, state, target_signature(target))
