"""Long runs: stopping (step, time limit) and resuming give the weights of an uninterrupted run, from the same
feature store, never rebuilt."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import conversations
from safetensors.torch import load_file

from blockdraft.train.bpd import BPDTrainConfig, train_bpd
from blockdraft.train.dflash import DFlashTrainConfig, train_dflash
from blockdraft.train.features import FeatureStore, build_store
from blockdraft.train.neural import NeuralTrainConfig, train_neural
from blockdraft.train.treeflash import TreeFlashTrainConfig, train_treeflash

KINDS = {  # each stops mid-epoch, so the data position matters
    "bpd": (train_bpd, lambda **k: BPDTrainConfig(num_heads=2, inner_size=32, draft_vocab=0, epochs=0.6,
                                                  batch=64, lr=5e-3, **k)),
    "dflash": (train_dflash, lambda **k: DFlashTrainConfig(gamma=4, draft_vocab=20, epochs=0.4, lr=5e-3,
                                                           anchors_per_seq=8, seqs_per_step=2, **k)),
    "neural": (train_neural, lambda **k: NeuralTrainConfig(width=16, num_layers=1, window=8, draft_vocab=0,
                                                           epochs=0.5, batch=16, lr=3e-3, **k)),
    "treeflash": (train_treeflash, lambda **k: TreeFlashTrainConfig(inner_size=16, epochs=0.4, lr=3e-3,
                                                                    anchors_per_seq=8, **k)),
}


@pytest.fixture(scope="module")
def base_block(tiny, stores, tmp_path_factory):
    """A small block drafter for the AR module to build on."""
    out = tmp_path_factory.mktemp("base") / "dflash"
    train_dflash(tiny, stores[0], None, out, DFlashTrainConfig(gamma=4, draft_vocab=20, epochs=0.2, lr=5e-3,
                                                               anchors_per_seq=8))
    return out


def resume_state(folder):
    return load_file(str(folder / "resume" / "model.safetensors")), json.loads(
        (folder / "resume" / "state.json").read_text())


@pytest.mark.parametrize("kind", list(KINDS))
def test_stopped_and_resumed_equals_uninterrupted(tiny, stores, base_block, tmp_path, kind):
    train, config = KINDS[kind]
    extra = {"init": str(base_block)} if kind == "treeflash" else {}
    store = stores[0]
    train(tiny, store, None, tmp_path / "whole", config(**extra))
    whole, whole_state = resume_state(tmp_path / "whole")
    steps = whole_state["step"]
    assert steps >= 6 and whole_state["total_steps"] == steps
    half = steps // 2
    train(tiny, store, None, tmp_path / "split", config(stop_at_step=half, **extra))
    first, first_state = resume_state(tmp_path / "split")
    assert first_state["step"] == half and first_state["batch"] > 0  # stopped in mid-epoch
    assert any(not torch.equal(first[k], whole[k]) for k in whole)  # not yet the same weights
    train(tiny, store, None, tmp_path / "split", config(**extra), resume=True)
    again, again_state = resume_state(tmp_path / "split")
    assert again_state["step"] == steps
    assert all(v.dtype == torch.float32 for v in whole.values() if v.is_floating_point())
    assert whole.keys() == again.keys() and all(torch.equal(whole[k], again[k]) for k in whole), kind
    training = json.loads((tmp_path / "split" / "config.json").read_text())["training"]
    assert training["steps"] == training["planned_steps"] == steps and training["stopped"] is None


def forward_counter(target):
    """How many times the target's body runs (the feature store's cost)."""
    calls = []
    target.model.base_model.register_forward_pre_hook(lambda *a: calls.append(1))
    return calls


def test_cli_resume_reuses_the_store_and_the_arguments(tiny_model_dir, tmp_path, monkeypatch, capsys):
    from blockdraft import Target, cli

    monkeypatch.setenv("BLOCKDRAFT_CACHE", str(tmp_path / "cache"))  # a store left by an earlier run is not ours
    (tmp_path / "data.json").write_text(json.dumps(conversations(60)))
    loaded = []

    def load(args):  # the CLI's own loader, with a counter on the target's forward
        target = Target.load(args.target, args.dtype, args.device)
        loaded.append(forward_counter(target))
        return target

    monkeypatch.setattr(cli, "load_target", load)
    out = tmp_path / "run"
    args = ["train", "--target", str(tiny_model_dir), "--drafter", "bpd", "--data", str(tmp_path / "data.json"),
            "--max-tokens", "3000", "--valid-tokens", "300", "--num-heads", "2", "--inner-size", "24",
            "--draft-vocab", "0", "--epochs", "2", "--lr", "0.003", "--stop-at-step", "5", "--out", str(out),
            "--dtype", "float32", "--max-len", "40"]
    assert cli.main(args) == 0
    assert sum(loaded[0]) > 0  # the first run built the stores
    assert json.loads((out / "resume" / "state.json").read_text())["step"] == 5
    config = json.loads((out / "config.json").read_text())
    assert config["training"]["stopped"] == "--stop-at-step" and config["inner_size"] == 24
    capsys.readouterr()
    assert cli.main(["train", "--resume", str(out)]) == 0  # nothing restated
    assert sum(loaded[1]) == 0  # no target forward at all: both stores were reused as they were
    assert capsys.readouterr().out.count("reusing the feature store") == 2
    state = json.loads((out / "resume" / "state.json").read_text())
    assert state["step"] == state["total_steps"] > 5
    run = json.loads((out / "run.json").read_text())
    assert run["drafter"] == "bpd" and run["options"]["num_heads"] == 2 and run["options"]["inner_size"] == 24
    assert json.loads((out / "config.json").read_text())["inner_size"] == 24  # the resumed run kept it
    store = FeatureStore.open(run["store"])  # --max-len reached the store: no conversation is longer
    assert run["max_len"] == store.meta["max_len"] == 40
    assert max(b - a for a, b in store.sequences()) == 40


def test_time_limit_stops_with_a_checkpoint_and_resumes(tiny, stores, tmp_path):
    from blockdraft.drafters import BPDDrafter

    cfg = dict(num_heads=2, inner_size=32, draft_vocab=0, epochs=0.3, batch=64, lr=5e-3)
    train_bpd(tiny, stores[0], None, tmp_path / "run", BPDTrainConfig(max_minutes=1e-9, **cfg))
    state = json.loads((tmp_path / "run" / "resume" / "state.json").read_text())
    assert state["step"] < state["total_steps"]  # stopped by the (tiny) time limit
    drafter = BPDDrafter.from_pretrained(tmp_path / "run", tiny)  # a usable checkpoint was written
    assert drafter.config.training["stopped"] == "time limit"
    train_bpd(tiny, stores[0], None, tmp_path / "run", BPDTrainConfig(max_minutes=60, **cfg), resume=True)
    state = json.loads((tmp_path / "run" / "resume" / "state.json").read_text())
    assert state["step"] == state["total_steps"]


def test_ctrl_c_stops_after_the_step_and_resumes(tiny, stores, tmp_path, monkeypatch):
    import os
    import signal

    from blockdraft.train import distill

    cfg = dict(num_heads=2, inner_size=32, draft_vocab=0, epochs=0.3, batch=64, lr=5e-3)
    gather, calls = distill.Teacher.gather, []

    def gather_then_interrupt(*a, **k):  # Ctrl-C arrives in the middle of the 4th step
        calls.append(1)
        if len(calls) == 4:
            os.kill(os.getpid(), signal.SIGINT)
        return gather(*a, **k)

    monkeypatch.setattr(distill.Teacher, "gather", staticmethod(gather_then_interrupt))
    before = signal.getsignal(signal.SIGINT)
    train_bpd(tiny, stores[0], None, tmp_path / "run", BPDTrainConfig(**cfg))  # no KeyboardInterrupt
    assert signal.getsignal(signal.SIGINT) is before  # the handler is put back
    weights, state = resume_state(tmp_path / "run")
    assert state["step"] == 4 < state["total_steps"]  # the step in progress was finished, then it stopped
    assert json.loads((tmp_path / "run" / "config.json").read_text())["training"]["stopped"] == "interrupted"
    monkeypatch.setattr(distill.Teacher, "gather", gather)
    train_bpd(tiny, stores[0], None, tmp_path / "run", BPDTrainConfig(**cfg), resume=True)
    train_bpd(tiny, stores[0], None, tmp_path / "whole", BPDTrainConfig(**cfg))
    (a, _), (b, _) = resume_state(tmp_path / "run"), resume_state(tmp_path / "whole")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_cli_resume_errors(tmp_path, capsys):
    from blockdraft.cli import main

    assert main(["train", "--resume"]) == 2
    assert "--resume needs the run's folder" in capsys.readouterr().err
    assert main(["train", "--resume", str(tmp_path / "none")]) == 2
    assert "no saved training state" in capsys.readouterr().err
    assert main(["train", "--drafter", "ngram", "--resume", "--out", str(tmp_path)]) == 2
    assert "does not apply to the ngram drafter" in capsys.readouterr().err


def test_store_time_limit_ends_a_complete_store_early(tiny, tmp_path):
    store = build_store(tiny, conversations(40), tmp_path / "store", max_tokens=6000, max_len=64, top_k=8,
                        max_minutes=1e-9)
    assert store.meta["n_seqs"] == 1 and store.meta["complete"]  # stopped after the first conversation
    again = build_store(tiny, conversations(40), tmp_path / "store", max_tokens=6000, max_len=64, top_k=8)
    assert again.meta["n_tokens"] == store.meta["n_tokens"]  # complete: reused as it is, not extended


def test_store_read_widens_exactly_what_numpy_would(stores):
    store = stores[0]
    every = np.arange(store.features.shape[1])
    some = store.layer_slice(store.layers[-1:])
    rows = np.array([5, 3, 40, 41])
    for r, cols in [(slice(10, 30), every), (slice(10, 30), some), (rows, every), (rows, some)]:
        want = torch.from_numpy(np.asarray(store.features[r][:, cols], dtype=np.float32))
        got = store.read(r, cols)
        assert got.dtype == torch.float32 and torch.equal(got, want)


def test_a_short_conversation_does_not_end_the_store(tiny, tmp_path):
    """Conversations under 16 tokens used to stop the build (a base model's "Question: hi" turns are that short):
    every conversation must be stored while there is room."""
    short = [{"id": f"s{i}", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "ab"}]}
             for i in range(5)]
    store = build_store(tiny, short + conversations(10), tmp_path / "store", max_tokens=6000, max_len=64, top_k=8)
    assert store.meta["n_seqs"] == 15 and store.meta["complete"]


def test_hidden_states_beyond_float16_are_stored_as_bfloat16(tmp_path):
    """Gemma's residual stream outgrows float16 (inf, then a NaN loss): its stores keep bfloat16 bits; a float16
    store that meets such states says so instead of storing inf."""
    from conftest import char_tokenizer, tiny_llama
    from tiny_architectures import tiny_model

    from blockdraft import Target
    from blockdraft.errors import BlockdraftError

    gemma = tiny_model("gemma3-text", 34)
    with torch.no_grad():
        gemma.model.embed_tokens.weight.mul_(1e5)
    target = Target(gemma, char_tokenizer(), name="tiny-gemma", feature_layers=(1, 2))
    store = build_store(target, conversations(4), tmp_path / "gemma", max_tokens=600, max_len=64, top_k=8)
    assert store.meta["feature_dtype"] == "bfloat16"
    got = store.read(slice(0, 20), np.arange(store.features.shape[1]))
    ids = torch.tensor([store.tokens[:20].tolist()])
    with torch.no_grad():
        states = gemma.model(input_ids=ids, output_hidden_states=True).hidden_states
    want = torch.cat([states[i][0] for i in store.layers], dim=-1)
    assert want.abs().max() > 65504 and torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)  # bfloat16's 8 bits of mantissa
    llama = tiny_llama(vocab_size=34)
    with torch.no_grad():
        llama.model.embed_tokens.weight.mul_(1e7)
    with pytest.raises(BlockdraftError, match="beyond float16's range"):
        build_store(Target(llama, char_tokenizer(), name="big"), conversations(4), tmp_path / "llama",
                    max_tokens=600, max_len=64, top_k=8)
