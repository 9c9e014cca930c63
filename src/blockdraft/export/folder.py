"""An export's output folder: never anything but the export's own files is replaced, and nothing at all is deleted."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

from ..errors import BlockdraftError


def _written_by_export(config: Path) -> bool:
    """Whether `config` is the config.json of an earlier `blockdraft export` (its 'blockdraft' entry says so)."""
    try:
        return "vllm_method" in json.loads(config.read_text()).get("blockdraft", {})
    except (OSError, ValueError, AttributeError):
        return False


def check_output(out: Path, source: Path, names: tuple[str, ...], force: bool) -> None:
    """Refuse, naming why, an output folder the export could harm: the source checkpoint itself (even with
    `force`: its config.json and weights have the export's file names); a non-empty folder without `force`; with
    `force`, a folder holding files of the export's names (`names`, config.json first) that no export wrote
    (a model folder, a checkpoint), since replacing them would destroy what they are."""
    if out.exists() and not out.is_dir():
        raise BlockdraftError(f"'{out}' is a file: give a folder to export into")
    if out.exists() and source.exists() and out.resolve() == source.resolve():
        raise BlockdraftError(f"'{out}' is the checkpoint being exported: write the export to another folder")
    if not out.exists() or not any(out.iterdir()):
        return
    if not force:
        raise BlockdraftError(f"'{out}' is not empty: choose a new or empty folder, or pass --force to replace the "
                              f"files an export writes there ({', '.join(names)}) and keep everything else")
    config = out / names[0]
    taken = [n for n in names if (out / n).exists()]
    if taken and not _written_by_export(config):
        raise BlockdraftError(f"'{out}' holds {', '.join(taken)} that no blockdraft export wrote (a model's or a "
                              "checkpoint's?): --force replaces only an earlier export's files; choose another folder")


def write_files(out: Path, writers: dict[str, Callable[[Path], None]]) -> None:
    """Write each file (`writers[name](path)`) to a temporary name in `out`, then move them all into place in
    order, so that a failure leaves no half-written export (and a folder it created is removed again, if empty)."""
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    staged = {name: out / f".{name}.partial-{os.getpid()}" for name in writers}
    try:
        for name, write in writers.items():
            write(staged[name])
        for name, path in staged.items():
            path.replace(out / name)
    finally:
        for path in staged.values():
            path.unlink(missing_ok=True)
        if created and not any(out.iterdir()):
            out.rmdir()
