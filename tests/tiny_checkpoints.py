"""Every shipped kind of checkpoint, trained in seconds for the tiny test target, laid out like
src/blockdraft/checkpoints/<target>/<method> so that every method in METHODS loads by its bare name."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from conftest import conversations

from blockdraft import NoDrafter, SpeculativeDecoder, Target
from blockdraft.train.bpd import BPDTrainConfig, train_bpd
from blockdraft.train.datastore import build_datastore
from blockdraft.train.dflash import DFlashTrainConfig, train_dflash
from blockdraft.train.neural import NeuralTrainConfig, train_neural
from blockdraft.train.ngram import train_ngram
from blockdraft.train.treeflash import TreeFlashTrainConfig, train_treeflash


def build_checkpoints(target: Target, stores, root: Path) -> Path:
    """root/<target name>/{bpd,dflash,treeflash,hydra,neural,ngram,datastore}; returns root (for
    methods.CHECKPOINTS)."""
    train, valid = stores
    out = Path(root) / target.name
    train_bpd(target, train, None, out / "bpd",
              BPDTrainConfig(num_heads=3, inner_size=64, draft_vocab=0, epochs=1, batch=64, lr=5e-3))
    train_dflash(target, train, None, out / "dflash",
                 DFlashTrainConfig(gamma=4, draft_vocab=20, epochs=1, lr=5e-3, anchors_per_seq=12, seqs_per_step=2))
    for method, base in (("treeflash", "dflash"), ("hydra", "bpd")):
        train_treeflash(target, train, None, out / method,
                        TreeFlashTrainConfig(init=str(out / base), inner_size=32, epochs=1, lr=3e-3,
                                             anchors_per_seq=12, batch=64))
    train_neural(target, train, None, out / "neural",
                 NeuralTrainConfig(width=32, num_layers=1, window=8, draft_vocab=0, epochs=2, batch=16, lr=3e-3))
    data = Path(root) / "conversations.json"
    data.write_text(json.dumps(conversations(80)))
    train_ngram(target, out / "ngram", data=str(data), order=3, max_tokens=2000, min_count=1)
    # The datastore also holds one reply that continues the sampling tests' prompt the way the target
    # itself does (greedily), so that retrieval has something the target accepts at T > 0 too.
    prompt = "abcab abcab abc"
    own = SpeculativeDecoder(target, NoDrafter()).generate(target.encode(prompt, chat_template=False), 16)
    reply = {"id": "own", "conversations": [{"from": "human", "value": "tell me"},
                                            {"from": "gpt", "value": prompt + own.text}]}
    build_datastore(target, out / "datastore", conversations(80, seed=2) + [reply])
    return Path(root)


def in_dtype(target: Target, dtype: torch.dtype) -> Target:
    """The same target (same name, weights rounded once) in another dtype: it accepts the same checkpoints."""
    return Target(copy.deepcopy(target.model).to(dtype), target.tokenizer, name=target.name)
