"""What every `blockdraft` command shares: the parser's error format, common flags, the target, error handling.

Its own module so that a command defined elsewhere (`python -m blockdraft.data.selfdistill`) runs exactly as under
`blockdraft` without importing cli.py, which imports the commands.
"""

from __future__ import annotations

import argparse
import sys

from .errors import BlockdraftError


class Parser(argparse.ArgumentParser):
    """argparse with the CLI's one-line error format (`blockdraft ...: error: ...`, exit code 2)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def positive_int(value: str) -> int:
    """argparse type: a positive integer, else a one-line usage error (exit code 2)."""
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got '{value}'") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {n}")
    return n


def add_precision_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dtype", default="auto",
                   help="auto (default: bfloat16 on CUDA and on CPUs with AMX or AVX512-BF16, else float32), "
                        "float32 (bitwise-exact reference), bfloat16 or float16")
    p.add_argument("--device", default="auto", help="auto (default: cuda if available, else cpu), cpu, cuda or cuda:N")
    p.add_argument("--weights", default="auto",
                   help="the target's projection weights: auto (default: full), full (the --dtype copy), int8 or "
                        "int4 (quantized; from a GGUF file, its own blocks where they convert exactly): every method "
                        "is lossless against the target with these weights (docs/cli.md)")


def add_compile_arg(p: argparse.ArgumentParser, default: bool) -> None:
    on_off = "on" if default else "off"
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=default,
                   help=f"compile the engine's decoding steps with torch.compile (default {on_off} here): ~1.5 min "
                        "once at load on 2 cores, then ~20-35%% faster steps; pays off after a few thousand tokens")


def load_target(args):
    """The target in the --dtype and --device that run() resolved and checked before anything else."""
    from .api import load_target as load

    return load(args.target, args.dtype, args.device, compile=getattr(args, "compile", False),
                weights=getattr(args, "weights", "auto"))


def parse_and_run(parser: argparse.ArgumentParser, argv: list[str] | None, command) -> int:
    """Parse `argv` (default: sys.argv[1:]) and run command(args); --help and usage errors exit as argparse's."""
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, or a usage error already printed by Parser.error
        return int(e.code or 0)
    return run(command, args)


def run(command, args) -> int:
    """Run a parsed command: --threads and --dtype/--device first, then the command; a BlockdraftError is one
    line on stderr and exit code 2, Ctrl-C exit code 130."""
    try:
        if getattr(args, "threads", None):
            import torch

            torch.set_num_threads(args.threads)
        if hasattr(args, "dtype"):  # bad --dtype / --device / --weights values fail first, in one line
            from .model import resolve_precision
            from .model.precision import check_weights, resolve_weights

            args.dtype, args.device = resolve_precision(args.dtype, args.device)
            if hasattr(args, "weights"):  # `auto` is resolved with the target (Target.load)
                args.weights = check_weights(args.weights)
                if args.weights != "auto":
                    args.weights = resolve_weights(args.weights, args.device)
        return command(args)
    except BlockdraftError as e:
        print(f"blockdraft: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nblockdraft: interrupted", file=sys.stderr)
        return 130
