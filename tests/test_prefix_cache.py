"""Prefix caching in the batch decoder: a prompt that starts like a finished sequence takes that sequence's KV
entries (and features) instead of prefilling them, and its output stays its batch-1 greedy output (float32)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from blockdraft import NoDrafter, SpeculativeDecoder
from blockdraft.decoding import BatchDecoder
from blockdraft.decoding.prefix_cache import CachedPrefix, PrefixCache, common_prefix
from blockdraft.errors import BlockdraftError
from test_batch import FeatureRecorder, make_target, prompt


def decode(decoder: BatchDecoder, prompt_ids: list[int], drafter, max_new: int):
    seq = decoder.add(prompt_ids, drafter, max_new_tokens=max_new)
    while not seq.done:
        decoder.step()
    assert seq.error is None
    return seq


def prefilled_rows(decoder: BatchDecoder) -> list[int]:
    """Records how many prompt tokens each prefill forward computes (alone or carried by a step)."""
    rows = []
    forward, carry = decoder.engine.forward, decoder.engine.forward_with_prompt

    def counting_forward(first, tokens, *args, **kw):
        if kw.get("last_logits_only"):
            rows.append(len(tokens[0]))
        return forward(first, tokens, *args, **kw)

    def counting_carry(*args):
        rows.append(len(args[-1]))
        return carry(*args)

    decoder.engine.forward, decoder.engine.forward_with_prompt = counting_forward, counting_carry
    return rows


@pytest.mark.parametrize("kind", ["ar", "features"])
def test_a_conversations_next_turn_prefills_only_what_is_new_and_keeps_its_output(kind):
    target, reference = make_target(layers=(0, 1)), make_target(layers=(0, 1))
    make = (lambda: NoDrafter()) if kind == "ar" else (lambda: FeatureRecorder((0, 1), seed=3))
    decoder = BatchDecoder(target, max_batch=2, max_rows=None)
    rows = prefilled_rows(decoder)
    turn1 = prompt(14, 0)
    first = decode(decoder, turn1, make(), 20)
    assert first.result.stats.stop_reason == "length"
    # turn 2 resends turn 1, its reply and a new message: all of it but the reply's last token (the last
    # step's bonus, never written to the cache) and the new tokens comes from the cache
    turn2 = turn1 + first.result.tokens + prompt(6, 1)
    rows.clear()
    second = decode(decoder, turn2, make(), 20)
    reused = len(turn1) + len(first.result.tokens) - 1
    assert decoder.prefix_cache.reused_tokens == reused and decoder.prefix_cache.hits == 1
    assert sum(rows) == len(turn2) - 1 - reused  # only the reply's last token and the new message: 6 tokens
    plain = SpeculativeDecoder(reference, NoDrafter()).generate(turn2, 20)
    assert second.result.tokens == plain.tokens
    if kind == "features":  # the drafter saw the features a fresh prefill gives (the cached ones, then its own)
        fresh = decode(BatchDecoder(make_target(layers=(0, 1)), max_batch=2, max_rows=None, prefix_cache_mb=0),
                       turn2, make(), 20)
        assert len(second.drafter.seen) == len(fresh.drafter.seen)
        assert second.drafter.seen[0].shape == (len(turn2) - 1, 2 * target.model.config.hidden_size)
        for a, b in zip(second.drafter.seen, fresh.drafter.seen, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        assert second.result.stats.accepted_hist == fresh.result.stats.accepted_hist


def test_a_prompt_sharing_part_of_a_cached_one_reuses_that_part_while_others_decode():
    """Two sequences in the batch: the newcomer's cached part is loaded into its (waiting) slot, the rest is
    carried by the running sequence's steps, and both outputs are their batch-1 outputs."""
    target, reference = make_target(), make_target()
    decoder = BatchDecoder(target, max_batch=2, max_rows=None, prefill_chunk=4)
    base = prompt(20, 5)
    decode(decoder, base, NoDrafter(), 8)
    running = decoder.add(prompt(9, 6), NoDrafter(), max_new_tokens=30)
    decoder.step()
    branch = base[:12] + prompt(10, 7)  # shares 12 tokens with the cached sequence
    newcomer = decoder.add(branch, NoDrafter(), max_new_tokens=15)
    reused = decoder.prefix_cache.reused_tokens
    decoder.step()  # the cache is asked when the newcomer is next in line for a chunk
    assert decoder.prefix_cache.reused_tokens - reused == 12 and newcomer.prefilled == 12 + 4
    while decoder.active:
        decoder.step()
    for seq, p, n in ((running, prompt(9, 6), 30), (newcomer, branch, 15)):
        assert seq.result.tokens == SpeculativeDecoder(reference, NoDrafter()).generate(p, n).tokens


@pytest.mark.parametrize("kind", ["ar", "features"])
def test_requests_arriving_together_with_a_shared_system_prompt_prefill_it_once(kind):
    """Three prompts added at once, each a 24-token shared prefix and its own question: the first is prefilled
    whole, its prompt is stored as soon as it is in the cache, and the next ones in line prefill only their own
    part; every output (and every feature a drafter sees) is what a run without the cache gives."""
    make = (lambda s: NoDrafter()) if kind == "ar" else (lambda s: FeatureRecorder((0, 1), seed=s))
    shared = prompt(24, 9)
    prompts = [shared + [3 + i] + prompt(5 + 3 * i, 20 + i) for i in range(3)]  # they differ right after the prefix

    def run(cache_mb):
        decoder = BatchDecoder(make_target(layers=(0, 1)), max_batch=3, max_rows=None, prefill_chunk=8,
                               prefix_cache_mb=cache_mb)
        rows = prefilled_rows(decoder)
        seqs = [decoder.add(p, make(i), max_new_tokens=12) for i, p in enumerate(prompts)]
        while decoder.active:
            decoder.step()
        return decoder, rows, seqs

    decoder, rows, seqs = run(256)
    assert sum(rows) == sum(len(p) - 1 for p in prompts) - 2 * len(shared)
    assert decoder.prefix_cache.hits == 2 and decoder.prefix_cache.reused_tokens == 2 * len(shared)
    _, plain_rows, plain = run(0)
    assert sum(plain_rows) == sum(len(p) - 1 for p in prompts)
    for a, b in zip(seqs, plain, strict=True):
        assert a.result.tokens == b.result.tokens
        if kind == "features":
            assert len(a.drafter.seen) == len(b.drafter.seen)
            for x, y in zip(a.drafter.seen, b.drafter.seen, strict=True):
                torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)


def test_prefix_cache_off_and_bad_budgets():
    target = make_target()
    assert BatchDecoder(target, max_batch=2, prefix_cache_mb=0).prefix_cache is None
    with pytest.raises(BlockdraftError, match="prefix_cache_mb"):
        BatchDecoder(target, max_batch=2, prefix_cache_mb=-1)


def entry(tokens, layers=(), nbytes_per_token=16) -> CachedPrefix:
    n = len(tokens)
    kv = [torch.zeros(1, n, nbytes_per_token // 8)]  # float32: 4 bytes each, keys and values alike
    feats = torch.zeros(n, 1) if layers else None
    return CachedPrefix(np.asarray(tokens, dtype=np.int64), kv, [t.clone() for t in kv], layers, feats)


def sequence_entry(tokens, layers=()) -> CachedPrefix:
    """An entry whose keys, values and features at position i encode (token, i), so a gather that mixes up
    sequences or positions shows."""
    t = torch.tensor(tokens, dtype=torch.float32)
    code = t * 1000 + torch.arange(len(tokens))
    kv = [torch.stack([code, -code])[:, :, None].repeat(1, 1, 4) + layer for layer in range(2)]  # [2, n, 4]
    feats = torch.stack([code, code + 0.5], 1) if layers else None
    return CachedPrefix(np.asarray(tokens, dtype=np.int64), kv, [k * 2 for k in kv], layers, feats)


def test_sequences_sharing_a_long_prefix_hold_it_once_and_read_it_through_their_parent():
    rng = np.random.default_rng(0)
    header = rng.integers(3, 500, 80).tolist()
    a = header + rng.integers(3, 500, 40).tolist()
    b = a[:100] + [1] + rng.integers(3, 500, 30).tolist()  # shares 100 with a (past a's start: a's own part)
    c = b[:90] + [2] + rng.integers(3, 500, 20).tolist()  # shares 90 with b, at a's positions: a's child
    d = header[:70] + [2] + rng.integers(3, 500, 9).tolist()  # shares 70 with all three
    e = b[:110] + [3] + rng.integers(3, 500, 10).tolist()  # shares 110 with b, 10 of them b's own: b's child
    cache = PrefixCache(max_bytes=10**7)
    for tokens in (a, b, c, d, e):
        cache.store(sequence_entry(tokens, layers=(0,)))
    held = {len(e.tokens): (e.start, e.parent and len(e.parent.tokens)) for e in cache.entries.values()}
    assert held == {len(a): (0, None), len(b): (100, len(a)), len(c): (90, len(a)), len(d): (70, len(a)),
                    len(e): (110, len(b))}
    assert cache.nbytes == sum(sequence_entry(t, (0,)).nbytes * (len(t) - held[len(t)][0]) // len(t)
                               for t in (a, b, c, d, e))
    for tokens in (a, b, c, d, e):
        hit, n = cache.lookup(tokens + [7], feature_layers=(0,))
        assert n == len(tokens)
        keys, values, feats = hit.prefix(n, with_features=True)
        want = sequence_entry(tokens, layers=(0,))
        for got, exp in zip(keys + values + [feats], want.keys + want.values + [want.features], strict=True):
            assert torch.equal(got, exp)
    hit, n = cache.lookup(c[:95] + [9])  # a partial match inside c's own part
    assert n == 95 and torch.equal(hit.prefix(n)[0][1], sequence_entry(c).keys[1][:, :95])
    # a parent stays while a child needs it: over budget, only entries without children go
    # (recency, least first: d, b, e, a, c; a is the parent of b, c, d, and b of e)
    cache.max_bytes = cache.nbytes - 1
    cache.store(sequence_entry([5] * 3))  # the least recent goes
    assert sorted(len(x.tokens) for x in cache.entries.values()) == sorted([len(a), len(b), len(c), len(e), 3])
    cache.max_bytes = sequence_entry(a).nbytes - 1  # a must go too, after its children
    cache.store(sequence_entry([6] * 3))
    assert [len(x.tokens) for x in cache.entries.values()] == [3, 3]
    assert cache.nbytes == sum(x.nbytes for x in cache.entries.values())


def test_a_stored_prefix_that_another_entry_reads_through_is_kept():
    x = list(range(3, 83))
    y = x + list(range(100, 120))  # extends x: x's child, holding positions 80..99
    z = y[:90] + [7] * 5  # extends x too, but shares more with y: y's child
    cache = PrefixCache(max_bytes=10**7)
    for tokens in (x, y, z):
        cache.store(sequence_entry(tokens))
    assert sorted(len(e.tokens) for e in cache.entries.values()) == [80, 95, 100]  # x stays: y and z read it
    assert all(e.parent is None or id(e.parent) in cache.entries for e in cache.entries.values())
    hit, n = cache.lookup(z)
    assert torch.equal(hit.prefix(n)[1][0], sequence_entry(z).values[0])


def test_the_cache_matches_the_longest_prefix_and_evicts_the_least_recently_used():
    assert common_prefix(np.array([1, 2, 3]), np.array([1, 2, 4, 5])) == 2
    assert common_prefix(np.array([1, 2]), np.array([1, 2, 3])) == 2
    cache = PrefixCache(max_bytes=entry([0] * 10).nbytes * 2)
    cache.store(entry([1, 2, 3, 4, 5, 6, 7, 8, 9, 10]))
    cache.store(entry([1, 2, 7, 7, 7, 7, 7, 7, 7, 7]))
    hit, n = cache.lookup([1, 2, 3, 4, 9])
    assert n == 4 and hit.tokens[3] == 4  # the longer match of the two
    cache.store(entry([5, 5, 5, 5, 5, 5, 5, 5, 5, 5]))  # over budget: the least recently used goes
    assert cache.lookup([1, 2, 7, 7])[1] == 2  # [1, 2, 7, ...] was evicted, [1, 2, 3, ...] (looked up) kept
    assert cache.nbytes <= cache.max_bytes and len(cache.entries) == 2
    assert cache.lookup([9, 9])[1] == 0


def test_a_longer_sequence_replaces_its_prefix_and_features_must_match_the_drafters_layers():
    cache = PrefixCache(max_bytes=10**6)
    cache.store(entry([1, 2, 3], layers=(0, 1)))
    cache.store(entry([1, 2, 3, 4, 5], layers=(0, 1)))  # extends the first: it replaces it
    assert len(cache.entries) == 1
    assert cache.lookup([1, 2, 3, 4, 5, 6], feature_layers=(0, 1))[1] == 5
    assert cache.lookup([1, 2, 3, 4, 5, 6], feature_layers=(2,))[1] == 0  # other layers: no features to give
    assert cache.lookup([1, 2, 3], feature_layers=())[1] == 3  # a drafter without features takes the KV alone
    cache.store(entry([1, 2, 3, 4, 5, 6, 7]))  # no features: the featured entry stays for feature drafters
    assert len(cache.entries) == 2
    assert len(cache.entries) == 2
    cache.store(entry([1, 2, 3, 4]))  # a prefix of a stored entry: not kept a second time
    cache.store(entry([1, 2, 3], layers=(0, 1)))
    assert len(cache.entries) == 2
    big = PrefixCache(max_bytes=8)
    big.store(entry([1, 2, 3]))  # larger than the whole budget: not kept
    assert not big.entries and big.nbytes == 0
    with pytest.raises(ValueError, match="budget"):
        PrefixCache(-1)
