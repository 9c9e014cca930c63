"""The AR module's copy input: one rule at decoding and training time, a module that reads it, and losslessness."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from blockdraft.decoding import SpeculativeDecoder
from blockdraft.drafters import BPDDrafter
from blockdraft.drafters.context_copy import NO_COPY, copy_tokens, extend_table, previous_same
from blockdraft.errors import BlockdraftError
from blockdraft.methods import make_drafter


def test_a_store_and_a_decoding_table_give_every_parent_the_same_copy_token():
    """For every root of every sequence, the copy token of each later parent, read from the store's arrays, is
    what the table over the tokens up to the root says: the context ends at the root (nothing drafted after it
    counts), and another conversation never does."""
    rng = np.random.default_rng(0)
    lengths = [1, 30, 2, 45, 17]
    tokens = rng.integers(0, 6, sum(lengths))  # six tokens: many repeats
    starts = np.concatenate([[0], np.cumsum(lengths)])
    prev = previous_same(tokens, starts)
    k, found = 4, 0
    for a, b in zip(starts[:-1], starts[1:], strict=True):
        for root in range(a, b):
            rows = np.arange(root, min(root + k, b))[None]
            got = copy_tokens(tokens, prev, np.array([root]), rows)[0]
            table = extend_table({}, tokens[a : root + 1].tolist(), 0)
            assert got.tolist() == [table.get(int(tokens[r]), NO_COPY) for r in rows[0]]
            found += int((got != NO_COPY).sum())
    assert found > 100  # the comparison is not over NO_COPY alone
    # [5, 9, 5, 7] with the root at 9: the parent 5 after it copies 9 (its occurrence before the root), not the 7
    # that follows it inside the drafted span; the first sequence's 9 -> 3 is not this one's context
    tokens, starts = np.array([9, 3, 5, 9, 5, 7]), np.array([0, 2, 6])
    prev = previous_same(tokens, starts)
    assert copy_tokens(tokens, prev, np.array([3]), np.array([[3, 4]])).tolist() == [[NO_COPY, 9]]


def test_an_incremental_table_equals_one_built_at_once_and_leaves_the_old_one_alone():
    tokens = [1, 2, 1, 3, 2, 4, 1, 5]
    table = {}
    seen = 0
    for n in (1, 3, 4, 8):
        old = dict(table)
        new = extend_table(table, tokens[:n], seen)
        assert table == old  # a fork holding the old table sees no change
        table, seen = new, n
    assert table == extend_table({}, tokens, 0) == {1: 5, 2: 4, 3: 2, 4: 1}


def test_a_copy_module_reads_the_context_trains_and_stays_lossless(tiny, stores, tmp_path):
    """--copy: the module's rows change with the context's copy tokens, training lowers its loss, the checkpoint
    records it and reloads, greedy output is the target's own with trees accepted; a module without copy is not
    fine-tuned into one."""
    from blockdraft.drafters.treeflash import ARApproxConfig, ARApproxModule, TreeFlashDrafter
    from blockdraft.train.bpd import BPDTrainConfig, train_bpd
    from blockdraft.train.treeflash import TreeFlashTrainConfig, train_treeflash

    train, valid = stores
    train_bpd(tiny, train, valid, tmp_path / "bpd",
              BPDTrainConfig(num_heads=3, inner_size=64, draft_vocab=0, epochs=4, batch=64, lr=3e-3))
    cfg = dict(init=str(tmp_path / "bpd"), inner_size=32, epochs=4, lr=3e-3, batch=64)
    drafter = train_treeflash(tiny, train, valid, tmp_path / "copy", TreeFlashTrainConfig(copy=True, **cfg))
    losses = [json.loads(line)["loss"] for line in (tmp_path / "copy" / "train_log.jsonl").read_text().splitlines()]
    assert losses[-1] < losses[0]
    config = json.loads((tmp_path / "copy" / "config.json").read_text())
    assert config["copy"] is True and drafter.module.gate.weight.shape[1] == 3 * tiny.hidden_size

    again = TreeFlashDrafter.from_pretrained(tmp_path / "copy", tiny, BPDDrafter.from_pretrained(tmp_path / "bpd",
                                                                                                 tiny))
    ids = tiny.encode("tell me more now, tell me more")
    ar = SpeculativeDecoder(tiny, make_drafter("ar", tiny)).generate(ids, 32)
    res = SpeculativeDecoder(tiny, again).generate(ids, 32)
    assert res.tokens == ar.tokens
    assert res.stats.new_tokens > res.stats.target_calls  # drafts were accepted

    parents = torch.tensor([[5, 6], [7, 8]])
    states = torch.randn(2, 2, tiny.hidden_size)
    again._copy_table = {}
    alone = again._rows(states, parents, 4, None, again._copies(parents))
    again._copy_table = {5: 9, 6: 9, 7: 9, 8: 9}
    copying = again._rows(states, parents, 4, None, again._copies(parents))
    assert not torch.equal(alone[1], copying[1])  # the same parents, other copy tokens: other rows
    columns = torch.tensor([0, 1, 2, 3])  # a depth's likeliest marginal tokens (draft ids = target ids here)
    again._copy_table = {5: 9, 6: 2}
    ids, logp = again._rows(states[0], parents[0], 5, columns, again._copies(parents[0]))  # parents 5, 6
    assert sorted(ids[0].tolist()) == [0, 1, 2, 3, 9]  # the copy token is a child though not a column
    ids, logp = again._rows(states[0, 1:], parents[0, 1:], 4, columns, again._copies(parents[0, 1:]))
    assert sorted(ids[0].tolist()) == [0, 1, 2, 3] and logp.isfinite().all()  # a copy already a column: once
    identity = TreeFlashDrafter(again.base, ARApproxModule(ARApproxConfig(tiny.hidden_size, 16, base_kind="bpd",
                                                                          copy=True)))
    h, emb = torch.randn(3, tiny.hidden_size), torch.randn(3, tiny.hidden_size)
    assert torch.equal(identity.module(h, emb, torch.randn(3, tiny.hidden_size)), h)  # starts as the base's marginals

    train_treeflash(tiny, train, None, tmp_path / "plain", TreeFlashTrainConfig(**{**cfg, "epochs": 1}))
    with pytest.raises(BlockdraftError, match="reads no copy tokens"):
        train_treeflash(tiny, train, None, tmp_path / "x",
                        TreeFlashTrainConfig(copy=True, init_module=str(tmp_path / "plain"), **cfg))
