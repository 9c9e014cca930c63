"""Which dtype, device and weights a target runs in: `auto` resolution, checked names, and the cache key they form."""

from __future__ import annotations

import hashlib
import platform
from pathlib import Path

import torch

from ..errors import BlockdraftError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}
CPUINFO = Path("/proc/cpuinfo")
BF16_PROBES = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")  # in torch.cpu


def cpu_has_fast_bf16() -> bool:
    """True on CPUs with AMX or AVX512-BF16 (bf16 matmuls in hardware): torch's own probes, else /proc/cpuinfo."""
    probes = [getattr(torch.cpu, name, None) for name in BF16_PROBES]
    try:
        if any(probe() for probe in probes if probe is not None):
            return True
    except RuntimeError:
        pass
    try:
        flags = CPUINFO.read_text().split()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def resolve_device(spec: str | torch.device | None = "auto") -> torch.device:
    """'auto' (cuda if available, else cpu), 'cpu', 'cuda' or 'cuda:N' -> torch.device, or a clear error."""
    if isinstance(spec, torch.device):
        spec = str(spec)
    spec = (spec or "auto").strip().lower()
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    if spec == "cpu":
        return torch.device("cpu")
    kind, _, index = spec.partition(":")
    if kind != "cuda" or (index and not index.isdigit()):
        raise BlockdraftError(f"unknown device '{spec}': use auto, cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        raise BlockdraftError(f"device '{spec}' asked for, but CUDA is not available here "
                              f"(torch {torch.__version__}, {torch.cuda.device_count()} GPUs): use --device cpu")
    if index and int(index) >= torch.cuda.device_count():
        raise BlockdraftError(f"device '{spec}' does not exist: this machine has {torch.cuda.device_count()} GPU(s)")
    # with its index, as a model's .device reports it, so that devices compare equal
    return torch.device("cuda", int(index) if index else torch.cuda.current_device())


def resolve_dtype(spec: str | torch.dtype | None = "auto", device: torch.device | str = "cpu") -> torch.dtype:
    """'auto' -> bfloat16 on CUDA (float16 on GPUs without bf16) and on CPUs with AMX / AVX512-BF16,
    float32 elsewhere; or one of float32, bfloat16, float16 (fp32, bf16, fp16)."""
    if isinstance(spec, torch.dtype):
        if spec not in DTYPES.values():
            raise BlockdraftError(f"unsupported dtype {spec}: use one of auto, {', '.join(DTYPES)}")
        return spec
    name = (spec or "auto").strip().lower()
    name = ALIASES.get(name, name)
    if name == "auto":
        if torch.device(device).type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.bfloat16 if cpu_has_fast_bf16() else torch.float32
    if name not in DTYPES:
        raise BlockdraftError(f"unknown dtype '{spec}': use one of auto, {', '.join(DTYPES)}")
    return DTYPES[name]


def resolve_precision(dtype="auto", device="auto") -> tuple[torch.dtype, torch.device]:
    """(dtype, device) from user input: the device first, since 'auto' dtype depends on it."""
    dev = resolve_device(device)
    return resolve_dtype(dtype, dev), dev


WEIGHTS = ("auto", "full", "int8", "int4")


def check_weights(spec: str | None) -> str:
    """A --weights value, checked: auto, full, int8 or int4 (model/linear.py, model/quantized_weights.py)."""
    name = (spec or "auto").strip().lower()
    if name not in WEIGHTS:
        raise BlockdraftError(f"unknown weights '{spec}': use one of {', '.join(WEIGHTS)}")
    return name


AUTO_INT4_BYTES = 300e6  # GGUF files at least this large get int4 from `auto` on CPUs without bf16 hardware


def resolve_weights(spec: str | None, device: torch.device, source=None) -> str:
    """'auto' -> int4 for a GGUF `source` of at least AUTO_INT4_BYTES on a CPU without bf16 hardware (AVX2 only),
    where full weights would compute in float32, twice a bf16 copy's bytes and ~8x the file's; there our kernel runs
    the file's own blocks (qkernel.preferred). Else full: with AMX / AVX512-BF16 a full bf16 copy makes a tree nearly
    as cheap as one token, and its methods were the faster (BENCHMARKS.md, "Decisions": --weights auto). int8 and
    int4 need the CPU."""
    name = check_weights(spec)
    if name == "auto":
        from .qkernel import preferred

        size = source.path.stat().st_size if source is not None and source.is_gguf else 0
        cpu = torch.device(device).type == "cpu"
        return "int4" if cpu and size >= AUTO_INT4_BYTES and not cpu_has_fast_bf16() and preferred(size) else "full"
    if name != "full" and torch.device(device).type != "cpu":
        raise BlockdraftError(f"--weights {name} runs on torch's CPU int4 kernel: use --device cpu or --weights full")
    return name


def dtype_name(dtype: torch.dtype) -> str:
    """torch.bfloat16 -> 'bfloat16'."""
    return str(dtype).removeprefix("torch.")


def processor(device: torch.device) -> str:
    """The chip a measurement ran on: the GPU's name, or the CPU's model and its bf16 instructions (the same
    VM image may land on an AMX Xeon one day and an EPYC with only AVX512-BF16 the next, and their relative
    costs differ: a 32-node tree cost 1.5 one-token steps on the first and 1.9 on the second)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        lines = CPUINFO.read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")
    flags = next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), [])
    return " ".join([model] + sorted(f for f in flags if f.startswith("amx") or f.endswith("bf16")))


def cache_key(target, threads: int | None = None) -> str:
    """What a measurement on this target depends on, as a file name: target, dtype, weights, device, CPU threads,
    whether the engine is compiled, and the processor (a short hash of `processor`)."""
    threads = threads or torch.get_num_threads()
    device = str(target.device).replace(":", "")
    compiled = "-compiled" if getattr(target, "compiled", False) else ""
    weights = getattr(target, "weights", "full")
    weights = "" if weights == "full" else f"-{weights}"  # quantized passes have their own cost curve
    chip = hashlib.sha1(processor(torch.device(target.device)).encode()).hexdigest()[:8]
    return f"{target.name}-{dtype_name(target.dtype)}{weights}-{device}-threads{threads}{compiled}-{chip}"
