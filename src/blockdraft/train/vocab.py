"""The draft vocabulary: the target tokens a drafter may propose, picked from a feature store (and grown)."""

from __future__ import annotations

import numpy as np
import torch

from ..drafters.layers import FrozenLMHead, frequent_tokens
from ..errors import BlockdraftError
from .features import FeatureStore
from .precision import frozen_float32

DEFAULT_DRAFT_VOCAB = 8192  # covers 91% of held-out target top-1 tokens at a sixth of the LM head's cost


def draft_vocabulary(store: FeatureStore, size: int, always: list[int]) -> torch.Tensor | None:
    """The `size` target tokens that are most often the next reply token or the teacher's top-1."""
    if size <= 0 or size >= store.meta["vocab_size"]:
        return None
    v = store.meta["vocab_size"]
    mask = np.asarray(store.assistant, dtype=bool)
    counts = np.bincount(np.asarray(store.topk_ids[:, 0])[mask], minlength=v)
    counts += np.bincount(np.asarray(store.tokens[1:])[mask[:-1]], minlength=v)
    return frequent_tokens(torch.from_numpy(counts), size, always)


def grow_vocabulary(drafter, target, store: FeatureStore, size: int | None) -> None:
    """Fine-tuning (`--init` with `--draft-vocab`): a larger draft vocabulary than the checkpoint's, its
    tokens kept and the store's next most frequent added. The LM head is the target's own (frozen), so
    new tokens only add rows to it; the heads or block learn to rank them in the fine-tune."""
    old = drafter.lm_head.vocab
    full = store.meta["vocab_size"]
    have = full if old is None else len(old)
    want = full if size is None or size <= 0 or size >= full else size
    if size is None or want == have:
        return
    if want < have:
        raise BlockdraftError(f"--draft-vocab {size}: a fine-tune can only grow the checkpoint's draft vocabulary "
                              f"({have} tokens); train a new drafter for a smaller one")
    keep = sorted(set(old.tolist()) | set(target.eos_token_ids))
    vocab = draft_vocabulary(store, want, keep)
    drafter.lm_head = FrozenLMHead(frozen_float32(target.model.get_output_embeddings().weight), vocab)
