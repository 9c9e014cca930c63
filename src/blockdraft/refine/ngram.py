"""Token-level n-gram LM (interpolated Kneser-Ney) over the target's token ids, queried for whole lattices.

Hand-written because no maintained library does what rescoring needs: KenLM and NLTK score
*words* one sentence at a time through Python calls (and KenLM needs a C++ build), while a
lattice needs thousands of (context, token id) pairs scored per decoding step. Here every
order is a few sorted numpy arrays, and one query scores any number of pairs with a handful of
vectorised `searchsorted` calls (~10 us per pair-batch per order, not per pair).

Model (Chen & Goodman's interpolated Kneser-Ney with one discount per order):
    P_n(w | c) = max(count_n(c, w) - D_n, 0) / total_n(c) + backoff_n(c) * P_{n-1}(w | c')
where c' drops the oldest token of c, count is the raw count at the highest order and the
continuation count N1+(. c w) below it, and P_0 is uniform over the vocabulary. `backoff_n(c)`
is whatever mass the kept n-grams leave, so every P_n(. | c) sums to one over the vocabulary,
also after pruning rare n-grams (pruning only moves mass to the lower order).

Storage per order n (context = the n-1 previous tokens, packed `bits` each into a uint64: 16 bits up to
a 65,536-token vocabulary, as the shipped LMs were saved; ceil(log2 V) above, e.g. 18 for Llama-3's 128k
or Qwen's 151k, which leaves room for 3 context tokens, i.e. order 4):
    ctx_keys [C] uint64 sorted, ctx_total [C] float32, ctx_backoff [C] float32
    pair_keys [M] int64 sorted (= context index * V + w), pair_count [M] float32
saved as one .npz (allow_pickle=False) next to a config.json that records the target.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..drafters.checkpoint import check_target
from ..errors import BlockdraftError

MAX_ORDER = 5  # with 16-bit tokens, a context of 4 tokens fills the 64 bits of a packed key


def key_bits(vocab_size: int) -> int:
    """Bits per token in a packed context key: 16 up to 65,536 tokens (the format of the shipped LMs)."""
    return max(16, int(vocab_size - 1).bit_length())


def max_order(vocab_size: int) -> int:
    """The highest order whose contexts (order - 1 tokens) fit a 64-bit key: 5 up to 65,536 tokens, 4 up to 2M."""
    return min(MAX_ORDER, 1 + 64 // key_bits(vocab_size))


def pack(ctx: np.ndarray, bits: int = 16) -> np.ndarray:
    """[Q, m] token ids (m * bits <= 64, each < 2**bits) -> [Q] uint64 keys; m == 0 gives key 0."""
    key = np.zeros(len(ctx), dtype=np.uint64)
    for j in range(ctx.shape[1]):
        key = (key << np.uint64(bits)) | ctx[:, j].astype(np.uint64)
    return key


@dataclass
class Order:
    ctx_keys: np.ndarray
    ctx_total: np.ndarray
    ctx_backoff: np.ndarray
    pair_keys: np.ndarray
    pair_count: np.ndarray
    discount: float


class NGramLM:
    """Interpolated Kneser-Ney LM of order 2..5 over token ids in [0, vocab_size)."""

    def __init__(self, orders: list[Order], vocab_size: int, meta: dict | None = None):
        self.orders = orders  # orders[n-1] holds the n-grams
        self.order = len(orders)
        self.vocab_size = vocab_size
        self.bits = key_bits(vocab_size)
        self.meta = meta or {}

    # --- training ---------------------------------------------------------------------
    @classmethod
    def fit(cls, sequences, vocab_size: int, order: int = 4, min_count: int = 1, meta: dict | None = None) -> "NGramLM":
        """Count n-grams inside each sequence (never across two) and build the smoothed model.

        `min_count` > 1 prunes n-grams of order >= 3 seen fewer times (their mass backs off).
        """
        top = max_order(vocab_size)
        if not 2 <= order <= top:
            raise BlockdraftError(f"n-gram order must be 2..{top} for a vocabulary of {vocab_size:,} tokens "
                                  f"(contexts are packed {key_bits(vocab_size)} bits a token into 64), got {order}")
        bits = key_bits(vocab_size)
        seqs = [np.asarray(s, dtype=np.int64) for s in sequences if len(s) > 0]
        if not seqs:
            raise BlockdraftError("the n-gram LM needs at least one non-empty training sequence")
        tokens = np.concatenate(seqs)
        if tokens.min() < 0 or tokens.max() >= vocab_size:
            raise BlockdraftError(f"training tokens must lie in [0, {vocab_size})")
        seq_id = np.repeat(np.arange(len(seqs)), [len(s) for s in seqs])

        # unique n-grams of every order with their raw counts: grams[n] = ([G, n] tokens, [G] counts)
        grams = {}
        for n in range(1, order + 1):
            if len(tokens) < n:
                grams[n] = (np.zeros((0, n), np.int64), np.zeros(0, np.int64))
                continue
            win = np.lib.stride_tricks.sliding_window_view(tokens, n)
            inside = seq_id[: len(win)] == seq_id[n - 1 :]  # window within one sequence
            uniq, counts = np.unique(win[inside], axis=0, return_counts=True)
            grams[n] = (uniq, counts)

        orders = []
        for n in range(1, order + 1):
            uniq, counts = grams[n]
            if n < order:  # continuation count: distinct tokens seen before the n-gram
                longer = grams[n + 1][0][:, 1:]
                suffix, cont = np.unique(longer, axis=0, return_counts=True)
                # an n-gram seen only at a sequence start has no left context: count it once
                counts = np.maximum(_lookup_rows(uniq, suffix, cont, bits), 1)
            counts = counts.astype(np.float64)
            n1, n2 = (counts == 1).sum(), (counts == 2).sum()
            discount = float(n1 / (n1 + 2 * n2)) if n1 + n2 > 0 else 0.5
            discount = min(max(discount, 0.1), 0.9)
            ctx = uniq[:, : n - 1]
            ctx_key = pack(ctx, bits)
            # totals over all n-grams, before pruning
            ctx_keys, inverse = np.unique(ctx_key, return_inverse=True)
            total = np.bincount(inverse, weights=counts)
            keep = counts >= min_count if n >= 3 else np.ones(len(counts), bool)
            kept_mass = np.bincount(inverse[keep], weights=np.maximum(counts[keep] - discount, 0),
                                    minlength=len(ctx_keys))
            backoff = 1.0 - kept_mass / total
            pair_keys = inverse[keep].astype(np.int64) * vocab_size + uniq[keep, -1]
            order_ = np.argsort(pair_keys, kind="stable")
            orders.append(Order(ctx_keys, total.astype(np.float32), backoff.astype(np.float32),
                                pair_keys[order_], counts[keep][order_].astype(np.float32), discount))
        return cls(orders, vocab_size, meta)

    # --- querying ---------------------------------------------------------------------
    def logprob(self, contexts: np.ndarray, words: np.ndarray) -> np.ndarray:
        """log P(words[q] | contexts[q]) for Q pairs at once.

        contexts [Q, m] int (any m; only the last order-1 tokens matter; -1 marks "no token",
        e.g. before the start of a sequence) and words [Q] int -> [Q] float64 natural-log probs.
        """
        contexts = np.asarray(contexts, dtype=np.int64).reshape(len(words), -1)
        words = np.asarray(words, dtype=np.int64)
        p = np.full(len(words), 1.0 / self.vocab_size)
        for n, o in enumerate(self.orders, start=1):
            m = n - 1
            if m > contexts.shape[1]:
                break
            ctx = contexts[:, contexts.shape[1] - m :]
            ok = (ctx >= 0).all(axis=1)
            key = pack(np.where(ctx >= 0, ctx, 0), self.bits)
            ci = np.searchsorted(o.ctx_keys, key)
            ci = np.minimum(ci, max(len(o.ctx_keys) - 1, 0))
            ok &= len(o.ctx_keys) > 0
            ok &= o.ctx_keys[ci] == key if len(o.ctx_keys) else False
            pk = ci.astype(np.int64) * self.vocab_size + words
            pi = np.minimum(np.searchsorted(o.pair_keys, pk), max(len(o.pair_keys) - 1, 0))
            hit = ok & (o.pair_keys[pi] == pk) if len(o.pair_keys) else np.zeros_like(ok)
            count = np.where(hit, o.pair_count[pi] if len(o.pair_count) else 0.0, 0.0)
            total, backoff = o.ctx_total[ci], o.ctx_backoff[ci]
            higher = np.maximum(count - o.discount, 0) / np.where(ok, total, 1.0) + backoff * p
            p = np.where(ok, higher, p)
        return np.log(p)

    def score(self, contexts: np.ndarray, candidates: np.ndarray) -> np.ndarray:
        """The `Rescorer` call: contexts [S, m], candidates [S, k] -> [S, k] log-probs."""
        S, k = candidates.shape
        return self.logprob(np.repeat(contexts, k, axis=0), candidates.reshape(-1)).reshape(S, k)

    def distribution(self, context: list[int]) -> np.ndarray:
        """P(. | context) over the whole vocabulary (for tests and analysis)."""
        words = np.arange(self.vocab_size)
        ctx = np.tile(np.asarray(context[-(self.order - 1):] or [-1], dtype=np.int64), (self.vocab_size, 1))
        return np.exp(self.logprob(ctx, words))

    # --- files ------------------------------------------------------------------------
    def save(self, folder) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        arrays = {}
        for n, o in enumerate(self.orders, start=1):
            for name in ("ctx_keys", "ctx_total", "ctx_backoff", "pair_keys", "pair_count"):
                arrays[f"{name}_{n}"] = getattr(o, name)
        np.savez_compressed(folder / "ngram.npz", **arrays)
        config = {"kind": "ngram", "order": self.order, "vocab_size": self.vocab_size, "key_bits": self.bits,
                  "discounts": [o.discount for o in self.orders], **self.meta}
        (folder / "config.json").write_text(json.dumps(config, indent=2))

    @classmethod
    def load(cls, folder, vocab_size: int | None = None, target=None) -> "NGramLM":
        """Read config.json + ngram.npz; refuse another vocabulary size, or (given `target`) an LM whose
        config records another target (name, vocabulary, hidden size, layers), as drafter checkpoints do."""
        folder = Path(folder)
        try:
            config = json.loads((folder / "config.json").read_text())
            data = np.load(folder / "ngram.npz", allow_pickle=False)
            orders = [Order(*(data[f"{name}_{n}"] for name in
                              ("ctx_keys", "ctx_total", "ctx_backoff", "pair_keys", "pair_count")), d)
                      for n, d in enumerate(config["discounts"], start=1)]
        except FileNotFoundError:
            raise BlockdraftError(f"'{folder}' holds no n-gram LM (config.json + ngram.npz): train one with "
                                  "`blockdraft train --drafter ngram --out DIR`") from None
        except (KeyError, ValueError, OSError) as e:
            raise BlockdraftError(f"the n-gram LM in '{folder}' is corrupt or incomplete ({e})") from None
        if config.get("kind") != "ngram":
            raise BlockdraftError(f"'{folder}' is a '{config.get('kind')}' checkpoint, not an n-gram LM")
        # LMs saved before key_bits was recorded all packed 16 bits (they refused larger vocabularies)
        if config.get("key_bits", 16) != key_bits(config["vocab_size"]):
            raise BlockdraftError(f"the n-gram LM in '{folder}' packs {config.get('key_bits', 16)}-bit token ids, "
                                  f"which cannot hold its vocabulary of {config['vocab_size']:,}")
        if target is not None:
            check_target(config.get("target") or {}, target, folder, what="n-gram LM")
            vocab_size = target.vocab_size
        if vocab_size is not None and config["vocab_size"] != vocab_size:
            raise BlockdraftError(f"the n-gram LM in '{folder}' was built for a vocabulary of {config['vocab_size']} "
                                  f"tokens, but the target has {vocab_size}")
        meta = {k: v for k, v in config.items() if k not in ("kind", "order", "vocab_size", "key_bits", "discounts")}
        return cls(orders, config["vocab_size"], meta)


def _lookup_rows(rows: np.ndarray, keys: np.ndarray, values: np.ndarray, bits: int) -> np.ndarray:
    """values of the `keys` rows equal to each of `rows`, 0 where absent ([*, n] int, n * bits <= 64, keys sorted)."""
    if len(keys) == 0:
        return np.zeros(len(rows), np.int64)
    rk, kk = pack(rows, bits), pack(keys, bits)  # packing keeps the lexicographic order of np.unique's rows
    i = np.minimum(np.searchsorted(kk, rk), len(kk) - 1)
    return np.where(kk[i] == rk, values[i], 0)
