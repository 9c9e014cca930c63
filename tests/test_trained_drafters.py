"""The bpd and dflash drafters on a tiny random Llama: training, checkpoints, losslessness."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from conftest import char_tokenizer, conversations, tiny_llama

from blockdraft import Target
from blockdraft.decoding import SpeculativeDecoder
from blockdraft.drafters import BPDDrafter, DFlashDrafter, DraftContext
from blockdraft.errors import BlockdraftError
from blockdraft.methods import make_drafter
from blockdraft.train.bpd import BPDTrainConfig, train_bpd
from blockdraft.train.dflash import DFlashTrainConfig, block_batch, block_forward, pick_anchors, train_dflash


@pytest.fixture(scope="module")
def trained(tiny, stores, tmp_path_factory):
    root = tmp_path_factory.mktemp("drafters")
    train, valid = stores
    bpd = train_bpd(tiny, train, valid, root / "bpd",
                    BPDTrainConfig(num_heads=3, inner_size=64, draft_vocab=0, epochs=6, batch=64, lr=3e-3))
    dflash = train_dflash(tiny, train, valid, root / "dflash",
                          DFlashTrainConfig(gamma=4, draft_vocab=20, epochs=6, lr=3e-3, anchors_per_seq=12,
                                            seqs_per_step=2, init_from_target=False))
    return root, bpd, dflash


def logged_losses(folder) -> list[float]:
    return [json.loads(line)["loss"] for line in (folder / "train_log.jsonl").read_text().splitlines()]


def test_feature_store_matches_the_target(tiny, stores):
    train, _ = stores
    a, b = next(train.sequences())
    ids = torch.tensor(np.asarray(train.tokens[a:b], dtype=np.int64))[None]
    with torch.no_grad():
        out = tiny.model(ids, output_hidden_states=True)
    expect = torch.cat([out.hidden_states[i][0] for i in train.layers], -1)
    assert torch.allclose(torch.from_numpy(np.asarray(train.features[a:b], dtype=np.float32)), expect, atol=2e-3)
    rows = np.nonzero(np.asarray(train.assistant[a:b]))[0]
    assert len(rows) > 0
    top1 = out.logits[0, rows].argmax(-1).numpy()
    assert (np.asarray(train.topk_ids[a + rows, 0]) == top1).all()
    reference = torch.log_softmax(out.logits[0, rows].float(), -1).topk(train.topk_ids.shape[1], -1)
    stored = torch.from_numpy(np.asarray(train.topk_logp[a + rows], dtype=np.float32))
    assert torch.allclose(stored, reference.values, atol=2e-3)  # full-vocabulary log-probs, in fp16


def test_teacher_top_k_in_row_chunks_equals_the_full_softmax():
    from blockdraft.train.features import teacher_topk

    head = torch.nn.Linear(16, 300, bias=False)
    states = torch.randn(150, 16, generator=torch.Generator().manual_seed(0))  # three chunks of 64
    ids, logp = teacher_topk(head, states, 5)
    with torch.no_grad():
        reference = torch.log_softmax(head(states), -1).topk(5, -1)
    assert torch.equal(ids, reference.indices) and torch.allclose(logp, reference.values, atol=1e-5)
    assert teacher_topk(head, states[:0], 5)[0].shape == (0, 5)


@pytest.mark.parametrize("kind", ["bpd", "dflash"])
def test_training_lowers_the_loss(trained, kind):
    root, _, _ = trained
    losses = logged_losses(root / kind)
    assert len(losses) >= 3
    # The teacher's own entropy is the floor of this loss (high for a random tiny model): ask for a clear drop.
    assert losses[-1] < losses[0] - 0.2, losses


def test_trained_drafters_beat_untrained_ones(tiny, stores, trained):
    from blockdraft.drafters.bpd import BPDModel
    from blockdraft.drafters.dflash_model import DFlashModel
    from blockdraft.train.bpd import evaluate_bpd
    from blockdraft.train.dflash import evaluate_dflash

    _, valid = stores
    _, bpd, dflash = trained
    fresh_bpd = BPDDrafter(BPDModel(bpd.config), bpd.lm_head)
    assert bpd.config.training["valid_tau_tf"] > evaluate_bpd(fresh_bpd, valid).tau + 0.05
    fresh_dflash = DFlashDrafter(DFlashModel(dflash.config), dflash.embed, dflash.lm_head)
    cols = valid.layer_slice(dflash.feature_layers)
    assert dflash.config.training["valid_tau_tf"] > evaluate_dflash(fresh_dflash, valid, cols).tau + 0.1


def test_checkpoint_round_trip(tiny, trained):
    root, bpd, dflash = trained
    h = torch.randn(tiny.hidden_size)
    again = BPDDrafter.from_pretrained(root / "bpd", tiny)
    assert torch.equal(again.draft_lattice(h).tokens, bpd.draft_lattice(h).tokens)
    config = json.loads((root / "dflash" / "config.json").read_text())
    assert config["target"] == {"name": "tiny-llama", "vocab_size": 34, "hidden_size": 32, "num_layers": 2}
    assert config["draft_vocab"] == 20
    dflash2 = DFlashDrafter.from_pretrained(root / "dflash", tiny)
    feats = torch.randn(5, dflash.model.fc.in_features)
    for d in (dflash, dflash2):
        d.reset([])
        d._append(feats)
    assert torch.equal(dflash.draft_lattice(7).tokens, dflash2.draft_lattice(7).tokens)


WRONG_TARGETS = {  # each differs from `tiny` ('tiny-llama', vocab 34, hidden 32, 2 layers) in one respect only
    "name": dict(name="other-llama"),
    "vocabulary": dict(vocab_size=40),
    "hidden size": dict(hidden=48),
    "layers": dict(layers=3),
}


@pytest.fixture(scope="module")
def loaders(tiny, trained, tmp_path_factory):
    """A checkpoint of every kind, written for `tiny` by its own save code: kind -> load(target)."""
    from blockdraft.drafters.treeflash import ARApproxConfig, ARApproxModule, TreeFlashDrafter
    from blockdraft.methods import shipped_rescorer
    from blockdraft.refine.neural import NeuralLM, NeuralLMConfig, NeuralRescorer
    from blockdraft.train.run import train_command

    root, _, dflash = trained
    more = tmp_path_factory.mktemp("kinds")
    module = ARApproxModule(ARApproxConfig(tiny.hidden_size, 16, base_kind="dflash"))
    TreeFlashDrafter(dflash, module).save_pretrained(more / "treeflash", tiny)
    lm = NeuralLM(NeuralLMConfig(tiny.hidden_size, width=16, num_layers=1, window=4))
    NeuralRescorer.for_target(lm, tiny).save_pretrained(more / "neural", tiny)
    (more / "data.json").write_text(json.dumps(conversations(80)))
    train_command(tiny, "ngram", more / "ngram", data=str(more / "data.json"), max_tokens=2000, order=3, min_count=1)
    return {
        "bpd": lambda t: BPDDrafter.from_pretrained(root / "bpd", t),
        "dflash": lambda t: DFlashDrafter.from_pretrained(root / "dflash", t),
        "treeflash": lambda t: TreeFlashDrafter.from_pretrained(more / "treeflash", t, dflash),  # base is right
        "ngram": lambda t: shipped_rescorer(t, "ngram", str(more / "ngram")),
        "neural": lambda t: shipped_rescorer(t, "neural", str(more / "neural")),
    }


def describe(t: Target) -> str:
    return f"'{t.name}' (vocab {t.vocab_size}, hidden {t.hidden_size}, {t.num_layers} layers)"


@pytest.mark.parametrize("differs", list(WRONG_TARGETS))
@pytest.mark.parametrize("kind", ["bpd", "dflash", "treeflash", "ngram", "neural"])
def test_checkpoint_for_another_target_is_refused(tiny, loaders, kind, differs):
    assert loaders[kind](tiny) is not None  # the target it was made for loads it
    spec = {"vocab_size": 34, "hidden": 32, "layers": 2, "name": "tiny-llama", **WRONG_TARGETS[differs]}
    name = spec.pop("name")
    wrong = Target(tiny_llama(**spec), char_tokenizer(), name=name)
    with pytest.raises(BlockdraftError, match="was trained for target") as refused:
        loaders[kind](wrong)
    assert describe(tiny) in str(refused.value) and describe(wrong) in str(refused.value)


def test_checkpoint_of_another_kind_is_refused(tiny, trained):
    root, _, _ = trained
    with pytest.raises(BlockdraftError, match="not a 'bpd' drafter"):
        BPDDrafter.from_pretrained(root / "dflash", tiny)


def test_one_name_per_drafter_kind_everywhere(tiny, trained, tmp_path):
    """Every checkpoint, shipped ones included, records its drafter kind under the name of the method that trains it
    (no aliases): a checkpoint under another name is refused, saying what it holds."""
    from blockdraft.drafters.dflash_styles import STYLES
    from blockdraft.methods import CHECKPOINTS, METHODS

    trainers = {m.trainer for m in METHODS.values() if m.trainer} | {"neural-lm"}
    for config in CHECKPOINTS.glob("*/*/config.json"):
        recorded = json.loads(config.read_text())
        if "blockdraft_drafter" in recorded:
            assert recorded["blockdraft_drafter"] in trainers, config
            assert recorded.get("base_kind") in (None, "bpd", "dflash"), config
            assert recorded.get("style") is None or recorded["blockdraft_drafter"] != "dflash" or \
                recorded["style"] in STYLES, config
    root, _, _ = trained
    shutil.copytree(root / "bpd", tmp_path / "bpd")
    config = json.loads((tmp_path / "bpd" / "config.json").read_text())
    (tmp_path / "bpd" / "config.json").write_text(json.dumps({**config, "blockdraft_drafter": "heads"}))
    with pytest.raises(BlockdraftError, match="holds a 'heads' drafter, not a 'bpd' drafter"):
        BPDDrafter.from_pretrained(tmp_path / "bpd", tiny)


def test_corrupt_checkpoints_give_clear_errors(tiny, trained, tmp_path):
    root, _, _ = trained
    bad = tmp_path / "bad"
    shutil.copytree(root / "bpd", bad)
    (bad / "model.safetensors").write_bytes(b"not a safetensors file at all")
    with pytest.raises(BlockdraftError, match="corrupt drafter checkpoint"):
        BPDDrafter.from_pretrained(bad, tiny)
    (bad / "config.json").write_text("{ broken")
    with pytest.raises(BlockdraftError, match="not valid JSON"):
        BPDDrafter.from_pretrained(bad, tiny)
    with pytest.raises(BlockdraftError, match="not a drafter checkpoint"):
        DFlashDrafter.from_pretrained(tmp_path / "missing", tiny)


def test_dflash_drafter_inference_matches_training_masks(tiny, stores, trained):
    """The incremental context cache at decode time must give the very logits the training pass saw."""
    train, _ = stores
    _, _, dflash = trained
    a, b = next(train.sequences())
    cols = train.layer_slice(dflash.feature_layers)
    anchors = pick_anchors(train, a, b, 4, np.random.default_rng(0))
    feats, roots, pos, allowed, rows, ok = block_batch(train, a, b, cols, dflash.config.gamma, anchors)
    with torch.no_grad():
        batch_logits = block_forward(dflash.model, dflash.embed, dflash.lm_head, feats, roots, pos, allowed)
    for i, p in enumerate(anchors.tolist()):
        dflash.reset([])
        dflash._append(feats[: p // 2])  # arriving in two pieces, as over decoding steps
        dflash._append(feats[p // 2 : p])
        lattice = dflash.draft_lattice(int(roots[i]))
        expect = dflash.lm_head.to_target_ids(batch_logits[i].argmax(-1))
        assert torch.equal(lattice.best(), expect)


def test_dflash_drafter_context_cache_grows_in_place_and_takes_observed_features_late(tiny, stores, trained,
                                                                                     monkeypatch):
    """Pieces across several buffer growths, or held back by observe() until the next lattice(), give the
    cache (and the draft) of one append of the whole context."""
    from blockdraft.drafters import DraftContext, dflash as dflash_module

    monkeypatch.setattr(dflash_module, "CONTEXT_CHUNK", 4)  # grow often
    train, _ = stores
    _, _, dflash = trained
    a, b = next(train.sequences())
    feats = torch.from_numpy(np.asarray(train.features[a:b][:, train.layer_slice(dflash.feature_layers)])).float()
    n = min(len(feats), 23)
    feats = feats[:n]
    dflash.reset([])
    dflash._append(feats[:n])
    whole = [(k.clone(), v.clone()) for k, v in dflash.ctx_kv]
    expect = dflash.draft_lattice(5).best()
    dflash.reset([])
    for start in range(0, n, 3):
        dflash._append(feats[start : start + 3])
    assert dflash.n_ctx == n and all(torch.allclose(k, k2, atol=1e-6) and torch.allclose(v, v2, atol=1e-6)
                                     for (k, v), (k2, v2) in zip(dflash.ctx_kv, whole, strict=True))
    assert dflash._keys[0].shape[1] == 24  # grown in chunks of 4
    dflash.reset([])
    tokens = list(range(n + 1))
    dflash.observe(DraftContext(tokens[: n - 4], feats[: n - 5], 4))
    dflash.observe(DraftContext(tokens[: n - 1], feats[n - 5 : n - 2], 4))
    assert dflash.n_ctx == 0  # nothing projected while it only observes
    tokens[n] = 5
    assert dflash.lattice(DraftContext(tokens, feats[n - 2 : n], 4)) is not None and dflash.n_ctx == n
    assert torch.equal(dflash.last_lattice.best(), expect[: dflash.depth])


@pytest.mark.parametrize("kind", ["bpd", "dflash"])
def test_greedy_output_equals_ar(tiny, trained, kind):
    root, _, _ = trained
    prompt = tiny.encode("tell me more now\n", chat_template=False)
    ar = SpeculativeDecoder(tiny, make_drafter("ar", tiny)).generate(prompt, 40)
    drafter = make_drafter(f"{kind}:checkpoint={root / kind}", tiny)
    spec = SpeculativeDecoder(tiny, drafter).generate(prompt, 40)
    assert spec.tokens == ar.tokens
    assert spec.stats.target_calls < ar.stats.target_calls  # the drafts do get accepted


def test_missing_shipped_checkpoint_names_the_train_command(tiny):
    with pytest.raises(BlockdraftError, match="blockdraft train --drafter dflash"):
        make_drafter("dflash", tiny)


def test_train_command_rejects_bad_options(tmp_path, capsys):
    from blockdraft.cli import main

    assert main(["train", "--drafter", "bpd", "--gamma", "4", "--out", str(tmp_path / "x")]) == 2
    assert "gamma do not apply to the 'bpd' drafter" in capsys.readouterr().err
    assert main(["train", "--drafter", "dflash", "--inner-size", "64", "--out", str(tmp_path / "x")]) == 2
    assert "inner_size do not apply to the 'dflash' drafter" in capsys.readouterr().err
    assert main(["train", "--drafter", "bpd", "--init", "somewhere", "--inner-size", "64", "--out", "x"]) == 2
    assert "--inner-size applies to new heads" in capsys.readouterr().err
    assert main(["train", "--drafter", "dflash", "--resume", "--out", str(tmp_path / "y")]) == 2
    assert "no saved training state" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["dflash", "bpd"])  # TreeFlash, and the Hydra-like module on BPD heads
def test_ar_module_starts_as_identity_trains_and_stays_lossless(tiny, stores, trained, tmp_path, kind):
    from blockdraft.drafters.treeflash import ARApproxConfig, ARApproxModule, TreeFlashDrafter
    from blockdraft.train.treeflash import TreeFlashTrainConfig, evaluate_treeflash, train_treeflash

    root, bpd, dflash = trained
    cls, base = {"dflash": (DFlashDrafter, dflash), "bpd": (BPDDrafter, bpd)}[kind]
    train, valid = stores
    module = ARApproxModule(ARApproxConfig(tiny.hidden_size, 16, base_kind=kind))
    h, parent = torch.randn(5, tiny.hidden_size), torch.randn(5, tiny.hidden_size)
    assert torch.equal(module(h, parent), h)  # zero-initialised output: the base drafter's marginals
    before = evaluate_treeflash(TreeFlashDrafter(base, module), valid)
    drafter = train_treeflash(tiny, train, valid, tmp_path / "tf",
                              TreeFlashTrainConfig(init=str(root / kind), inner_size=32, epochs=4, lr=3e-3,
                                                   anchors_per_seq=12, batch=64))
    losses = logged_losses(tmp_path / "tf")
    assert losses[-1] < losses[0]
    after = evaluate_treeflash(drafter, valid)
    assert sum(after.accuracy[1:]) > sum(before.accuracy[1:])  # the true parent helps the later depths
    again = TreeFlashDrafter.from_pretrained(tmp_path / "tf", tiny, cls.from_pretrained(root / kind, tiny))
    ids = tiny.encode("tell me more now")
    ar = SpeculativeDecoder(tiny, make_drafter("ar", tiny)).generate(ids, 24)
    res = SpeculativeDecoder(tiny, again).generate(ids, 24)
    assert res.tokens == ar.tokens
    assert res.stats.tree_nodes > res.stats.target_calls  # real trees were verified
    from blockdraft.bench.analyze import analyze_prompt, teacher_forced_lattices

    lattices, hidden = teacher_forced_lattices(tiny, again.base, ids, res.tokens)
    lat, (again.base.last_hidden, again.base.last_logits) = lattices[3], hidden[3]  # one step's transition tables:
    parents, kids, _ = again.transitions(7, lat)  # depth 0's only parent is the root
    M, K = again.parents, again.children
    assert parents[0].eq(7).all() and torch.equal(parents[1:], lat.tokens[:-1, :M])
    assert any(not torch.equal(kids[d, 0], kids[d, 1]) for d in range(1, lat.depth))  # parent-conditioned
    untrained = TreeFlashDrafter(again.base, ARApproxModule(ARApproxConfig(tiny.hidden_size, 16, base_kind=kind)))
    _, kids, _ = untrained.transitions(7, lat)  # the identity module: every parent's children = the marginals
    assert all(torch.equal(kids[d, m], lat.tokens[d, :K]) for d in range(lat.depth) for m in range(M))
    costly = TreeFlashDrafter(again.base, again.module, cost_curve={0: 1.0, 1: 100.0, 64: 1e4})  # budget auto
    res = SpeculativeDecoder(tiny, costly).generate(ids, 24)
    assert res.tokens == ar.tokens and res.stats.tree_nodes == res.stats.target_calls  # nothing worth drafting
    res = SpeculativeDecoder(tiny, again).generate(ids, 24)
    other = {"dflash": (BPDDrafter, "bpd"), "bpd": (DFlashDrafter, "dflash")}[kind]
    with pytest.raises(BlockdraftError, match=f"trained on a '{kind}' drafter"):
        TreeFlashDrafter.from_pretrained(tmp_path / "tf", tiny, other[0].from_pretrained(root / other[1], tiny))

    base = cls.from_pretrained(root / kind, tiny, top_k=16)
    fresh = TreeFlashDrafter.from_pretrained(tmp_path / "tf", tiny, cls.from_pretrained(root / kind, tiny))
    row = analyze_prompt(tiny, base, {"tree": fresh}, ids, "toy", 24)
    assert row.replayed["tree"] == pytest.approx(res.stats.tau)  # the replay is exact for trees too


@pytest.mark.parametrize("kind", ["dflash", "bpd"])
def test_transition_rows_over_a_depths_likeliest_columns(tiny, trained, kind):
    """columns=N: each child comes from its depth's N likeliest marginal tokens, with the log-probs the full rows
    give those N tokens renormalised over them; greedy output stays the target's own."""
    from blockdraft.drafters.treeflash import ARApproxConfig, ARApproxModule, TreeFlashDrafter

    root, bpd, dflash = trained
    base = {"dflash": dflash, "bpd": bpd}[kind]
    module = ARApproxModule(ARApproxConfig(tiny.hidden_size, 16, base_kind=kind))
    torch.manual_seed(0)
    torch.nn.init.normal_(module.down.weight, std=0.5)  # not the identity: rows differ from the marginals
    full, narrow = TreeFlashDrafter(base, module), TreeFlashDrafter(base, module, columns=6)
    ids = tiny.encode("tell me more now")
    tiny.feature_layers = base.feature_layers
    base.reset(ids)
    lat = base.lattice(DraftContext(ids, tiny.prefill(ids[:-1]), max_depth=8))
    _, kids, logp = narrow.transitions(ids[-1], lat, width=4)
    parents, full_ids, full_logp = full.transitions(ids[-1], lat, width=base.lm_head.weight.shape[0])
    marginal = base.lm_head.to_target_ids(base.last_logits.topk(6, -1).indices)  # [D, 6], target ids
    for d in range(lat.depth):
        for m in range(parents.shape[1]):
            assert set(kids[d, m].tolist()) <= set(marginal[d].tolist())
            row = dict(zip(full_ids[d, m].tolist(), full_logp[d, m].tolist(), strict=True))
            expected = torch.log_softmax(torch.tensor([row[t] for t in marginal[d].tolist()]), -1).topk(4)
            assert torch.allclose(logp[d, m], expected.values, atol=1e-5)
            assert kids[d, m].tolist() == marginal[d][expected.indices].tolist()
    sampler = TreeFlashDrafter(base, module, columns=6, sample=True, vocab_size=tiny.vocab_size)
    sampler.SAMPLE_SUPPORT = 12  # at T > 0 a row is read over 12 columns, not 6: the draws' q cover 12 tokens
    base.reset(ids)
    tree = sampler.propose(DraftContext(ids, tiny.prefill(ids[:-1]), max_depth=8, temperature=1.0,
                                        generator=torch.Generator().manual_seed(0)))
    first_children = [kids[0] for kids in tree.children if kids]
    assert first_children and all(int((tree.q[c] > 0).sum()) == 12 for c in first_children)
    for bad in (-1, 2.5, "many"):
        with pytest.raises(BlockdraftError, match="columns must be 0"):
            TreeFlashDrafter(base, module, columns=bad)
    ar = SpeculativeDecoder(tiny, make_drafter("ar", tiny)).generate(ids, 24)
    res = SpeculativeDecoder(tiny, narrow).generate(ids, 24)
    assert res.tokens == ar.tokens and res.stats.tree_nodes > res.stats.target_calls


def test_ar_module_fine_tunes_from_an_earlier_module(tiny, stores, trained, tmp_path):
    """--init-module: training starts from the earlier module's weights (not from the identity) and records it."""
    from blockdraft.drafters.treeflash import TreeFlashDrafter
    from blockdraft.train.treeflash import TreeFlashTrainConfig, evaluate_treeflash, train_treeflash

    root, bpd, _ = trained
    train, valid = stores
    cfg = dict(init=str(root / "bpd"), inner_size=32, lr=3e-3, batch=64)
    first = train_treeflash(tiny, train, valid, tmp_path / "first", TreeFlashTrainConfig(epochs=4, **cfg))
    tuned = train_treeflash(tiny, train, valid, tmp_path / "tuned",
                            TreeFlashTrainConfig(epochs=4, init_module=str(tmp_path / "first"), **{**cfg, "lr": 1e-3}))
    assert logged_losses(tmp_path / "tuned")[0] < logged_losses(tmp_path / "first")[0]  # not from scratch
    assert sum(evaluate_treeflash(tuned, valid).accuracy) >= 0.9 * sum(evaluate_treeflash(first, valid).accuracy)
    config = json.loads((tmp_path / "tuned" / "config.json").read_text())
    assert config["training"]["init_training"]["steps"] > 0  # the first run's record is kept
    assert config["training"]["command_config"]["init_module"] == str(tmp_path / "first")
    TreeFlashDrafter.from_pretrained(tmp_path / "tuned", tiny, BPDDrafter.from_pretrained(root / "bpd", tiny))


def test_ar_module_widens_without_changing_its_function(tiny, stores, trained, tmp_path):
    """--init-module with a larger --inner-size: the same function at first, then the added units train; the
    result loads and decodes losslessly; a narrower width is refused by name."""
    from blockdraft.drafters.treeflash import TreeFlashDrafter
    from blockdraft.train.treeflash import TreeFlashTrainConfig, train_treeflash, widen

    root, _, _ = trained
    train, valid = stores
    cfg = dict(init=str(root / "bpd"), lr=3e-3, batch=64, epochs=3)
    first = train_treeflash(tiny, train, valid, tmp_path / "first", TreeFlashTrainConfig(inner_size=16, **cfg))
    narrow = first.module.float()
    wide = widen(narrow, 40)
    assert wide.config.inner_size == 40 and wide.gate.weight.shape == (40, 2 * tiny.hidden_size)
    assert wide.up.weight[16:].abs().min() > 0  # the added units are live, only silent
    h, parent = torch.randn(6, tiny.hidden_size), torch.randn(6, tiny.hidden_size)
    assert torch.allclose(wide(h, parent), narrow(h, parent), atol=1e-6)
    assert widen(narrow, 16) is narrow
    tuned = train_treeflash(tiny, train, valid, tmp_path / "wide",
                            TreeFlashTrainConfig(inner_size=40, init_module=str(tmp_path / "first"), **cfg))
    assert tuned.module.config.inner_size == 40
    assert tuned.module.down.weight[:, 16:].abs().sum() > 0  # training moved the added units
    config = json.loads((tmp_path / "wide" / "config.json").read_text())
    assert config["inner_size"] == 40 and config["training"]["init_training"]["steps"] > 0
    bpd = BPDDrafter.from_pretrained(root / "bpd", tiny)
    again = TreeFlashDrafter.from_pretrained(tmp_path / "wide", tiny, bpd)
    ids = tiny.encode("tell me more now")
    ar = SpeculativeDecoder(tiny, make_drafter("ar", tiny)).generate(ids, 24)
    assert SpeculativeDecoder(tiny, again).generate(ids, 24).tokens == ar.tokens
    with pytest.raises(BlockdraftError, match="narrower than .*'s 40: a fine-tune can widen"):
        train_treeflash(tiny, train, valid, tmp_path / "narrow",
                        TreeFlashTrainConfig(inner_size=24, init_module=str(tmp_path / "wide"), **cfg))


def test_block_drafter_fine_tunes_from_a_checkpoint(tiny, stores, trained, tmp_path):
    """train --drafter dflash --init DIR: starts from the checkpoint (its gamma, layers and vocabulary)."""
    root, _, dflash = trained
    train, valid = stores
    cfg = DFlashTrainConfig(gamma=6, epochs=1, lr=1e-3, anchors_per_seq=12, seqs_per_step=2,
                            init=str(root / "dflash"))
    tuned = train_dflash(tiny, train, valid, tmp_path / "tuned", cfg)
    assert tuned.config.gamma == dflash.config.gamma == 4  # the checkpoint's, not the option's
    assert torch.equal(tuned.lm_head.vocab, dflash.lm_head.vocab)
    fresh = logged_losses(root / "dflash")[0]  # the first run's first loss, from scratch
    assert logged_losses(tmp_path / "tuned")[0] < 0.9 * fresh
    config = json.loads((tmp_path / "tuned" / "config.json").read_text())
    assert config["training"]["init_training"]["steps"] > 0
    ids = tiny.encode("tell me more now")
    again = DFlashDrafter.from_pretrained(tmp_path / "tuned", tiny)
    ar = SpeculativeDecoder(tiny, make_drafter("ar", tiny)).generate(ids, 24)
    assert SpeculativeDecoder(tiny, again).generate(ids, 24).tokens == ar.tokens


def test_fine_tune_grows_the_draft_vocabulary(tiny, stores, trained, tmp_path):
    """--init with a larger --draft-vocab keeps the checkpoint's tokens, adds the store's next most frequent,
    trains, saves the larger vocabulary and stays lossless; a smaller one is refused."""
    root, bpd, dflash = trained
    train, valid = stores
    cfg = DFlashTrainConfig(draft_vocab=30, epochs=1, lr=1e-3, anchors_per_seq=12, seqs_per_step=2,
                            init=str(root / "dflash"))
    tuned = train_dflash(tiny, train, valid, tmp_path / "grown", cfg)
    old, new = set(dflash.lm_head.vocab.tolist()), set(tuned.lm_head.vocab.tolist())
    assert len(new) == 30 and old < new
    assert json.loads((tmp_path / "grown" / "config.json").read_text())["draft_vocab"] == 30
    again = DFlashDrafter.from_pretrained(tmp_path / "grown", tiny)
    assert torch.equal(again.lm_head.vocab, tuned.lm_head.vocab)
    ids = tiny.encode("tell me more now")
    ar = SpeculativeDecoder(tiny, make_drafter("ar", tiny)).generate(ids, 24)
    assert SpeculativeDecoder(tiny, again).generate(ids, 24).tokens == ar.tokens
    with pytest.raises(BlockdraftError, match="can only grow"):  # the heads use the full vocabulary
        train_bpd(tiny, train, valid, tmp_path / "shrunk",
                  BPDTrainConfig(draft_vocab=20, epochs=1, batch=64, init=str(root / "bpd")))
