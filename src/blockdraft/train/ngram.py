"""Training the token n-gram LM for rescoring: count n-grams of the target's tokens over ShareGPT."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ..data.chat import check_chat_template
from ..data.sharegpt import data_sources, split_sources
from ..drafters.checkpoint import target_signature
from ..errors import BlockdraftError
from ..refine.ngram import NGramLM
from .features import conversation_ids


@dataclass
class NGramTrainConfig:
    order: int = 4
    min_count: int = 2  # n-grams of order >= 3 seen once are pruned (their mass backs off): 3-4x smaller


def token_sequences(target, records, max_tokens: int | None, max_len: int = 4096, desc: str = "tokenizing"):
    """Chat-template token ids of conversations (prompts and replies) until max_tokens (None: all of them);
    also the reply masks."""
    check_chat_template(target.tokenizer, f"target '{target.name}'")
    seqs, masks, n = [], [], 0
    limit = max_tokens if max_tokens is not None else float("inf")
    total, unit = (max_tokens, "tok") if max_tokens is not None else (len(records), "conv")
    with tqdm(total=total, unit=unit, desc=desc) as bar:
        for r in records:
            conv = conversation_ids(target.tokenizer, r, max_len, target.eos_token_ids)
            if conv is None:
                if max_tokens is None:  # the bar counts conversations then
                    bar.update(1)
                continue
            ids, mask = conv
            if max_tokens is not None:
                ids, mask = ids[: max_tokens - n], mask[: max_tokens - n]
            seqs.append(np.asarray(ids, dtype=np.int64))
            masks.append(np.asarray(mask, dtype=bool))
            n += len(ids)
            bar.update(len(ids) if max_tokens is not None else 1)
            if n >= limit:
                break
    return seqs, masks


def perplexity(lm: NGramLM, seqs, masks) -> float:
    """Per-token perplexity of reply tokens (position i predicts token i+1 where mask[i])."""
    total, count = 0.0, 0
    for ids, mask in zip(seqs, masks, strict=True):
        pos = np.flatnonzero(mask[:-1])
        if len(pos) == 0:
            continue
        ctx = np.stack([np.where(pos - j >= 0, ids[np.maximum(pos - j, 0)], -1) for j in range(lm.order - 2, -1, -1)],
                       axis=1)
        total -= lm.logprob(ctx, ids[pos + 1]).sum()
        count += len(pos)
    return math.exp(total / max(count, 1))


def train_ngram(target, out, data: str = "sharegpt", order: int = 4, max_tokens: int = 3_000_000,
                min_count: int = 2) -> NGramLM:
    """`blockdraft train --drafter ngram`: fit, report held-out perplexity, save config.json + ngram.npz."""
    if target.tokenizer is None:
        raise BlockdraftError("the n-gram LM is trained on text: the target needs a tokenizer")
    if max_tokens < 1000:
        raise BlockdraftError(f"--max-tokens must be at least 1000, got {max_tokens}")
    paths = data_sources(data)
    train, valid, _, _ = split_sources(paths)
    t0 = time.time()
    seqs, _ = token_sequences(target, train, max_tokens)
    vseqs, vmasks = token_sequences(target, valid, 50_000, desc="held-out")
    lm = NGramLM.fit(seqs, target.vocab_size, order, min_count,
                     meta={"target": target_signature(target), "train_tokens": int(sum(map(len, seqs))),
                           "min_count": min_count, "data": ",".join(Path(p).name for p in paths)})
    lm.meta["valid_perplexity"] = round(perplexity(lm, vseqs, vmasks), 2)
    lm.meta["minutes"] = round((time.time() - t0) / 60, 1)
    lm.save(out)
    sizes = ", ".join(f"{n}-grams {len(o.pair_keys):,}" for n, o in enumerate(lm.orders, start=1))
    print(f"order {order}: {sizes}; held-out reply perplexity {lm.meta['valid_perplexity']}")
    return lm


TRAINING = (NGramTrainConfig, train_ngram)  # `blockdraft train --drafter ngram`
