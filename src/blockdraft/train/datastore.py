"""Building REST's datastore: ShareGPT's training split in the target's chat template, with a suffix array."""

from __future__ import annotations

import hashlib
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..data.sharegpt import data_sources, split_sources
from ..drafters.rest import Datastore
from ..errors import BlockdraftError
from ..model.loading import cache_dir
from .ngram import token_sequences

WHOLE = 10**9  # no cut: whole conversations


@dataclass
class DatastoreTrainConfig:
    """The datastore has no options beyond --data and --max-tokens (default: every training conversation)."""


def build_datastore(target, out, records, max_tokens: int | None = None, source: str = "") -> Datastore:
    """Tokenise conversations whole in the target's chat template, index them and save the datastore to `out`."""
    t0 = time.perf_counter()
    seqs, _ = token_sequences(target, records, max_tokens, max_len=WHOLE, desc="datastore")
    if not seqs:
        raise BlockdraftError("no usable conversation for the datastore (each needs a user turn and a reply)")
    # uint16 halves the file for vocabularies that fit it (SmolLM2: 49,152); the separator is never a token id
    small = target.vocab_size < 2**16 - 1
    separator = 2**16 - 1 if small else -1
    parts = []
    for ids in seqs:
        parts += [ids, np.array([separator])]
    tokens = np.concatenate(parts).astype(np.uint16 if small else np.int32)
    store = Datastore(tokens, separator)
    seconds = time.perf_counter() - t0
    store.save(out, target, {"data": source, "conversations": len(seqs), "build_s": round(seconds, 1)})
    size = sum(f.stat().st_size for f in Path(out).iterdir())
    print(f"datastore: {len(tokens):,} tokens from {len(seqs):,} conversations, {size / 2**20:.1f} MB, "
          f"built in {seconds:.0f} s -> {out}", file=sys.stderr)
    return store


def train_datastore(target, out, data: str = "sharegpt", max_tokens: int | None = None) -> Datastore:
    """`blockdraft train --drafter datastore`: the training split of `data` (held-out conversations never)."""
    paths = data_sources(data)
    return build_datastore(target, out, split_sources(paths).train, max_tokens,
                           ",".join(Path(p).name for p in paths))


def default_datastore(target, data: str = "sharegpt") -> Datastore:
    """The datastore for `target` in the cache, built on first use (~1 minute for ShareGPT)."""
    key = hashlib.sha1(f"{target.name}:{target.vocab_size}:{data}".encode()).hexdigest()[:8]
    folder = cache_dir() / "datastore" / f"{target.name}-{key}"
    if not (folder / "config.json").is_file():
        print(f"rest: building the datastore for '{target.name}' once (cached in {folder})", file=sys.stderr)
        return train_datastore(target, folder, data)
    return Datastore.load(folder, target)


TRAINING = (DatastoreTrainConfig, train_datastore)  # `blockdraft train --drafter datastore`
