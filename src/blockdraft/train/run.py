"""`blockdraft train`: build (or reuse) the target's feature stores, then train one drafter."""

from __future__ import annotations

import hashlib
import json
from dataclasses import fields
from importlib import import_module
from pathlib import Path

from ..data.sharegpt import data_sources, source_names, split_sources
from ..errors import BlockdraftError
from ..model.loading import cache_dir
from .features import DEFAULT_MAX_LEN, build_store
from .trainer import saved_state


def train_kinds() -> list[str]:
    """The `--drafter` kinds: the trainers the registered methods name (Method.trainer), in registry order.
    All but ngram and datastore train from the feature store."""
    from ..methods import METHODS

    return list(dict.fromkeys(m.trainer for m in METHODS.values() if m.trainer))


def trainer_of(kind: str):
    """(options dataclass, train function) of a `--drafter` kind: TRAINING in train/KIND.py."""
    return import_module(f"{__package__}.{kind}").TRAINING


def store_folder(target, data: str, split: str, max_tokens: int, max_len: int = DEFAULT_MAX_LEN) -> Path:
    """Where a feature store lives by default: in the cache, keyed by target, data file, split, size and the
    conversation length kept."""
    key = hashlib.sha1(f"{target.name}:{data}".encode()).hexdigest()[:8]
    return cache_dir() / "features" / f"{target.name}-{key}-{split}-{max_tokens}-len{max_len}"


def prepare_stores(target, data: str = "sharegpt", max_tokens: int = 600_000, valid_tokens: int = 30_000,
                   store: str | None = None, max_len: int | None = None, valid_store: str | None = None):
    """(train store, validation store) for `target`, built on first use (reused as they are once complete).
    Validation conversations are held out by id (see data.sharegpt.split_conversations); Spec-Bench is never
    used for training. With several sources (`data` joined by commas) each store takes a source's conversations
    before the next one's. Conversations are kept whole up to `max_len` tokens (and the target's context)."""
    if max_tokens < 1000:
        raise BlockdraftError(f"--max-tokens must be at least 1000, got {max_tokens}")
    max_len = min(max_len or DEFAULT_MAX_LEN, target.max_length)
    paths = data_sources(data)
    path = ",".join(paths)
    train, valid, train_sizes, valid_sizes = split_sources(paths)
    train_dir = Path(store) if store else store_folder(target, path, "train", max_tokens, max_len)
    valid_dir = Path(valid_store) if valid_store else train_dir.parent / (train_dir.name + "-valid") if store else (
        store_folder(target, path, "valid", valid_tokens, max_len))
    if valid_tokens and not valid:
        # e.g. a later part of a self-distilled file, whose held-out replies were written at its start:
        # a validation figure over no data would read as tau 1.0
        print(f"{path} holds no held-out conversations: training without validation")
        valid_tokens = 0
    train_store = build_store(target, train, train_dir, max_tokens, max_len=max_len,
                              source_sizes=train_sizes)
    valid_store = build_store(target, valid, valid_dir, valid_tokens, max_len=max_len,
                              source_sizes=valid_sizes) if valid_tokens else None
    if valid_store is not None and valid_store.meta["n_tokens"] == 0:
        print(f"the validation store {valid_dir} is empty: training without validation")
        valid_store = None
    return train_store, valid_store


def training_config(drafter: str, out, resume: bool = False, **options):
    """Check the command's options before anything slow happens; returns (config, train function)."""
    kinds = train_kinds()
    if drafter not in kinds:
        raise BlockdraftError(f"unknown drafter '{drafter}': choose one of {', '.join(kinds)}")
    if resume and drafter in ("ngram", "datastore"):
        raise BlockdraftError(f"--resume does not apply to the {drafter} drafter (built in one pass over the tokens)")
    if resume and saved_state(out) is None:
        raise BlockdraftError(f"--resume: '{out}' has no saved training state (resume/state.json)")
    config_cls, train = trainer_of(drafter)
    known = {f.name for f in fields(config_cls)}  # its options (ClassVars such as `styles` are not)
    bad = [k for k, v in options.items() if v is not None and k not in known]
    if bad:
        raise BlockdraftError(f"option(s) {', '.join(bad)} do not apply to the '{drafter}' drafter")
    if options.get("inner_size") is not None and drafter == "bpd" and options.get("init"):
        raise BlockdraftError(f"--inner-size applies to new heads: '{options['init']}' keeps its own width "
                              f"(fine-tuning); leave out --inner-size, or train from scratch")
    style = options.get("style")
    if style is not None:
        styles = getattr(config_cls, "styles", ())
        if options["style"] not in styles:
            raise BlockdraftError(f"--style {style}: the '{drafter}' drafter's styles are {', '.join(styles)}")
    return config_cls(**{k: v for k, v in options.items() if v is not None}), train


RUN_FILE = "run.json"  # the command's arguments, so that `--resume DIR` alone continues the same run


def saved_run(out) -> dict:
    """The arguments a run in `out` was started with ({} if none were recorded)."""
    path = Path(out) / RUN_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def train_command(target, drafter: str, out, data="sharegpt", max_tokens=None, valid_tokens=30_000,
                  store=None, resume=False, target_arg: str | None = None, max_len: int | None = None, **options):
    """Train a drafter (`bpd`, `dflash`, `treeflash`), a rescoring LM (`neural`, `ngram`) or a datastore and save
    it to `out`.

    A resumed run reuses the feature stores it was started with (their paths are in OUT/run.json):
    they are complete, so nothing is recomputed."""
    cfg, train = training_config(drafter, out, resume, **options)
    if drafter == "datastore":  # token ids and a suffix array, no target features
        return train(target, out, data, max_tokens)
    if drafter == "ngram":  # counts tokens, needs no target features
        return train(target, out, data, cfg.order, max_tokens or 3_000_000, cfg.min_count)
    max_tokens = max_tokens or 600_000
    before = saved_run(out) if resume else {}
    train_store, valid_store = prepare_stores(target, data, max_tokens, valid_tokens, store or before.get("store"),
                                              max_len, valid_store=None if store else before.get("valid_store"))
    Path(out).mkdir(parents=True, exist_ok=True)
    record = {"drafter": drafter, "target": target.name, "target_arg": target_arg,
              "data": ",".join(n if n == "sharegpt" else str(Path(n).resolve()) for n in source_names(data)),
              "max_tokens": max_tokens, "max_len": train_store.meta["max_len"],
              "valid_tokens": valid_tokens, "store": str(train_store.path),
              "valid_store": str(valid_store.path) if valid_store else None,
              # --stop-at-step is where this invocation pauses, not part of the run: a resume would stop at once
              "options": {k: v for k, v in options.items() if v is not None and k != "stop_at_step"}}
    (Path(out) / RUN_FILE).write_text(json.dumps(record, indent=1))
    return train(target, train_store, valid_store, Path(out), cfg, resume=resume)
