"""`blockdraft export --to vllm`: file layout, config fields, exactness against vLLM's forward, refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from blockdraft.cli import main
from blockdraft.decoding import SpeculativeDecoder
from blockdraft.drafters import BPDDrafter, DFlashDrafter
from blockdraft.drafters.dflash_model import DFlashConfig, DFlashModel
from blockdraft.drafters.bpd import BPDConfig, BPDModel
from blockdraft.drafters.layers import FrozenLMHead
from blockdraft.errors import BlockdraftError
from blockdraft.export import export_vllm
from blockdraft.methods import make_drafter
from blockdraft.train.dflash import DFlashTrainConfig, train_dflash
from blockdraft.train.bpd import BPDTrainConfig, train_bpd

VOCAB = torch.tensor([0, 2, 3, 5, 8, 9, 11, 13, 17, 20, 21, 25, 30, 33])  # a draft vocabulary (sorted ids)


def randomise(module: torch.nn.Module, seed: int = 0) -> None:
    """Random values everywhere, norms included (zero-initialised layers would hide a wrong mapping)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            base = 1.0 if name.endswith("norm.weight") else 0.0
            p.copy_(base + 0.3 * torch.randn(p.shape, generator=g))


def bpd_checkpoint(target, folder, style="medusa", vocab=VOCAB, layers=2):
    cfg = BPDConfig(target.hidden_size, target.num_layers, num_heads=3, inner_size=48, style=style,
                    medusa_layers=layers)
    model = BPDModel(cfg)
    randomise(model)
    head = FrozenLMHead(target.model.get_output_embeddings().weight, vocab)
    BPDDrafter(model, head).save_pretrained(folder, target)
    return BPDDrafter.from_pretrained(folder, target)  # what blockdraft itself runs (fp16-rounded weights)


def dflash_checkpoint(target, folder, style="vllm", layers=(1, 0), vocab=VOCAB, mask=7):
    cfg = DFlashConfig.for_target(target, layers, num_layers=2, gamma=4, style=style, mask_token_id=mask)
    model = DFlashModel(cfg)
    randomise(model, seed=1)
    n = len(layers) * target.hidden_size
    model.set_feature_stats(torch.randn(n), torch.rand(n) * 3 + 0.1)
    DFlashDrafter.for_target(model, target, vocab).save_pretrained(folder, target)
    return DFlashDrafter.from_pretrained(folder, target)


def exported(folder):
    return json.loads((folder / "config.json").read_text()), load_file(str(folder / "model.safetensors"))


# --- small re-implementations of vLLM 0.32's forward passes, written from its code ----------------------
def rms(x, w, eps):
    """vLLM's RMSNorm (layernorm.py forward_native): in float32, then times the weight."""
    x32 = x.float()
    return x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * w


def vllm_medusa(config, t, h):
    """MedusaModel.forward + compute_logits (medusa.py): per head x += SiLU(layer(x)), the shared lm_head
    (original_lm_head), logits scattered into the full vocabulary through token_map, -inf elsewhere."""
    out = []
    for i in range(config["num_heads"]):
        x = h
        for j in range(config["num_hidden_layers"]):
            w, b = t[f"blocks.{i}.layers.{j}.weight"], t[f"blocks.{i}.layers.{j}.bias"]
            x = x + torch.nn.functional.silu(x @ w.T + b)
        logits = x @ t["lm_heads.0.weight"].T
        full = torch.full((*logits.shape[:-1], config["vocab_size"]), -torch.inf)
        full[..., t["token_map"]] = logits
        out.append(full)
    return torch.stack(out, -2)


def vllm_rope(x, pos, theta):
    """get_rope(is_neox_style=True): rotate-half on the last dim."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = pos.float()[:, None] * inv[None]
    cos, sin = ang.cos()[:, None], ang.sin()[:, None]  # [n, 1, d/2] against [n, heads, d]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def vllm_dflash(config, t, embed, aux, bonus):
    """DFlashQwen3ForCausalLM (qwen3_dflash.py) for one request: aux [n, k*H] are the target's states at
    target_layer_ids + 1 in layer order; the query block is [bonus, mask_token_id x N] at positions n..n+N,
    attending non-causally to the n context K/V and to itself. Returns target-vocabulary logits [N, V]."""
    c, eps = config, config["rms_norm_eps"]
    nh, nkv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    theta = c["rope_parameters"]["rope_theta"]
    n, n_q = len(aux), c["block_size"]
    ctx = rms(aux @ t["fc.weight"].T, t["hidden_norm.weight"], eps)  # combine_hidden_states, then hidden_norm
    ids = torch.tensor([bonus] + [c["dflash_config"]["mask_token_id"]] * (n_q - 1))
    x, pos = embed[ids], torch.arange(n, n + n_q)
    residual = None
    for i in range(c["num_hidden_layers"]):
        p = f"layers.{i}."
        residual = x if residual is None else x + residual
        h = rms(residual, t[p + "input_layernorm.weight"], eps)

        def heads(z, w, k, p=p):
            return (z @ t[p + f"self_attn.{w}.weight"].T).view(len(z), k, hd)
        q = vllm_rope(rms(heads(h, "q_proj", nh), t[p + "self_attn.q_norm.weight"], eps), pos, theta)
        k = vllm_rope(rms(heads(h, "k_proj", nkv), t[p + "self_attn.k_norm.weight"], eps), pos, theta)
        v = heads(h, "v_proj", nkv)
        # precompute_and_store_context_kv: the context's K/V from the same projections, K-normed and rotated
        ck = vllm_rope(rms(heads(ctx, "k_proj", nkv), t[p + "self_attn.k_norm.weight"], eps), torch.arange(n), theta)
        cv = heads(ctx, "v_proj", nkv)
        k, v = torch.cat([ck, k]).repeat_interleave(nh // nkv, 1), torch.cat([cv, v]).repeat_interleave(nh // nkv, 1)
        att = torch.softmax(torch.einsum("qhd,khd->hqk", q, k) * hd ** -0.5, -1)
        o = torch.einsum("hqk,khd->qhd", att, v).reshape(n_q, nh * hd) @ t[p + "self_attn.o_proj.weight"].T
        residual = o + residual
        h = rms(residual, t[p + "post_attention_layernorm.weight"], eps)
        x = (torch.nn.functional.silu(h @ t[p + "mlp.gate_proj.weight"].T) * (h @ t[p + "mlp.up_proj.weight"].T)) \
            @ t[p + "mlp.down_proj.weight"].T
    out = rms(x + residual, t["norm.weight"], eps)[1:]  # token_indices_to_sample: the N mask positions
    logits = out @ t["lm_head.weight"].T
    full = torch.full((len(logits), c["vocab_size"]), -torch.inf)
    full[:, torch.arange(c["draft_vocab_size"]) + t["d2t"]] = logits  # compute_logits: target = draft id + d2t
    return full


# --- Medusa ---------------------------------------------------------------------------------------------
def test_medusa_export_files(tiny, tmp_path):
    bpd_checkpoint(tiny, tmp_path / "ck")
    config, t = exported(export_vllm(tmp_path / "out", "bpd", tiny, tmp_path / "ck"))
    h, v = tiny.hidden_size, tiny.vocab_size
    assert config["architectures"] == ["MedusaModel"] and config["model_type"] == "medusa"
    assert (config["num_heads"], config["num_hidden_layers"], config["hidden_size"]) == (3, 2, h)
    assert (config["vocab_size"], config["truncated_vocab_size"]) == (v, len(VOCAB))
    assert config["original_lm_head"] is True and config["medusa_fc_bias"] is True
    # MedusaConfig.from_pretrained renames any top-level key holding "num" + "heads"/"layers": none but ours
    assert [k for k in config if "num" in k] == ["num_heads", "num_hidden_layers"]
    expect = {f"blocks.{i}.layers.{j}.{p}": (h, h) if p == "weight" else (h,)
              for i in range(3) for j in range(2) for p in ("weight", "bias")}
    expect |= {"lm_heads.0.weight": (len(VOCAB), h), "token_map": (len(VOCAB),)}
    assert {k: tuple(x.shape) for k, x in t.items()} == expect
    assert t["token_map"].dtype == torch.int64 and torch.equal(t["token_map"], VOCAB)
    assert all(x.dtype == torch.float32 for k, x in t.items() if k != "token_map")
    assert torch.equal(t["lm_heads.0.weight"], tiny.model.get_output_embeddings().weight.detach()[VOCAB])


def test_medusa_export_reproduces_our_heads(tiny, tmp_path):
    ours = bpd_checkpoint(tiny, tmp_path / "ck")
    config, t = exported(export_vllm(tmp_path / "out", "bpd", tiny, tmp_path / "ck"))
    h = torch.randn(64, tiny.hidden_size) * 2
    theirs = vllm_medusa(config, t, h)  # [64, heads, V]
    with torch.no_grad():
        mine = ours.lm_head(ours.model(h))  # [64, heads, V'] over the draft vocabulary
    assert torch.allclose(theirs[..., VOCAB], mine, atol=1e-5)
    outside = torch.ones(tiny.vocab_size, dtype=torch.bool)
    outside[VOCAB] = False
    assert torch.isinf(theirs[..., outside]).all()  # tokens outside the draft vocabulary are never drafted
    for row in range(8):  # MedusaProposer.propose: argmax per head == our lattice's chain
        assert torch.equal(theirs[row].argmax(-1), ours.draft_lattice(h[row]).best())


def test_medusa_export_of_the_full_vocabulary(tiny, tmp_path):
    bpd_checkpoint(tiny, tmp_path / "ck", vocab=None, layers=1)
    config, t = exported(export_vllm(tmp_path / "out", "bpd", tiny, tmp_path / "ck"))
    assert config["truncated_vocab_size"] == config["vocab_size"] == tiny.vocab_size
    assert "token_map" not in t and t["lm_heads.0.weight"].shape == (tiny.vocab_size, tiny.hidden_size)


def test_ffn_heads_are_refused(tiny, tmp_path):
    bpd_checkpoint(tiny, tmp_path / "ck", style="ffn")
    with pytest.raises(BlockdraftError, match=r"head shape.*x \+ SiLU\(W x \+ b\).*--style medusa"):
        export_vllm(tmp_path / "out", "bpd", tiny, tmp_path / "ck")
    assert not (tmp_path / "out").exists()


# --- DFlash ---------------------------------------------------------------------------------------------
def test_dflash_export_files(tiny, tmp_path):
    dflash_checkpoint(tiny, tmp_path / "ck")
    config, t = exported(export_vllm(tmp_path / "out", "dflash", tiny, tmp_path / "ck"))
    h, hd = tiny.hidden_size, tiny.hidden_size // 4
    assert config["architectures"] == ["DFlashDraftModel"] and config["model_type"] == "qwen3"
    # our hidden_states[i] is vLLM's target layer i - 1, listed in the (ascending) order vLLM concatenates
    assert config["dflash_config"] == {"target_layer_ids": [-1, 0], "mask_token_id": 7}
    assert (config["num_hidden_layers"], config["num_attention_heads"], config["num_key_value_heads"],
            config["head_dim"], config["block_size"]) == (2, 4, 2, hd, 4)
    assert (config["vocab_size"], config["draft_vocab_size"], config["target_hidden_size"]) == (
        tiny.vocab_size, len(VOCAB), h)
    assert config["rope_parameters"]["rope_theta"] == tiny.model.config.rope_parameters["rope_theta"]
    layer = {"self_attn.q_proj": (4 * hd, h), "self_attn.k_proj": (2 * hd, h), "self_attn.v_proj": (2 * hd, h),
             "self_attn.o_proj": (h, 4 * hd), "self_attn.q_norm": (hd,), "self_attn.k_norm": (hd,),
             "mlp.gate_proj": (2 * h, h), "mlp.up_proj": (2 * h, h), "mlp.down_proj": (h, 2 * h),
             "input_layernorm": (h,), "post_attention_layernorm": (h,)}
    expect = {f"layers.{i}.{k}.weight": s for i in range(2) for k, s in layer.items()}
    expect |= {"fc.weight": (h, 2 * h), "hidden_norm.weight": (h,), "norm.weight": (h,),
               "lm_head.weight": (len(VOCAB), h), "d2t": (len(VOCAB),)}
    assert {k: tuple(x.shape) for k, x in t.items()} == expect  # no embed_tokens: vLLM shares the target's
    assert t["d2t"].dtype == torch.int64 and torch.equal(torch.arange(len(VOCAB)) + t["d2t"], VOCAB)
    assert all(x.dtype == torch.float32 for k, x in t.items() if k != "d2t")


def test_dflash_export_reproduces_our_drafter(tiny, tmp_path):
    """The fold of our feature scale into fc and the permutation to vLLM's layer order are exact."""
    ours = dflash_checkpoint(tiny, tmp_path / "ck", layers=(1, 0))
    config, t = exported(export_vllm(tmp_path / "out", "dflash", tiny, tmp_path / "ck"))
    embed = tiny.model.get_input_embeddings().weight.detach()
    g = torch.Generator().manual_seed(3)
    h = tiny.hidden_size
    for n, bonus in ((5, 4), (11, 7), (1, 30)):  # bonus 7 is the mask token itself: still exact
        states = {lay: torch.randn(n, h, generator=g) * 3 for lay in (0, 1)}  # hidden_states[0], [1]
        ours.reset([])
        ours._append(torch.cat([states[1], states[0]], -1))  # our order: feature_layers (1, 0)
        with torch.no_grad():
            lattice = ours.draft_lattice(bonus)
            mine = ours.lm_head(ours.last_hidden)
        theirs = vllm_dflash(config, t, embed, torch.cat([states[0], states[1]], -1), bonus)  # vLLM's order
        assert torch.allclose(theirs[:, VOCAB], mine, atol=1e-4), (theirs[:, VOCAB] - mine).abs().max()
        assert torch.equal(theirs.argmax(-1), lattice.best())


def test_seeded_style_is_refused_with_every_mismatch(tiny, tmp_path):
    cfg = DFlashConfig.for_target(tiny, (1, tiny.num_layers), gamma=4, final_state_residual=True)
    model = DFlashModel(cfg)
    model.set_feature_stats(torch.randn(2 * tiny.hidden_size), torch.ones(2 * tiny.hidden_size))
    DFlashDrafter.for_target(model, tiny, VOCAB).save_pretrained(tmp_path / "ck", tiny)
    with pytest.raises(BlockdraftError) as e:
        export_vllm(tmp_path / "out", "dflash", tiny, tmp_path / "ck")
    for part in ("block inputs", "q/k norm", f"feature layer {tiny.num_layers}", "feature centring",
                 "--drafter dflash --style vllm"):
        assert part in str(e.value)


def test_vllm_style_with_the_final_state_is_refused(tiny, tmp_path):
    dflash_checkpoint(tiny, tmp_path / "ck", layers=(1, tiny.num_layers))
    with pytest.raises(BlockdraftError, match=f"feature layer {tiny.num_layers}: ours reads the target's final"):
        export_vllm(tmp_path / "out", "dflash", tiny, tmp_path / "ck")


def test_vllm_style_centres_nothing_and_takes_no_extra_inputs(tiny):
    model = DFlashModel(DFlashConfig.for_target(tiny, (1,), gamma=4, style="vllm", mask_token_id=5))
    model.set_feature_stats(torch.full((tiny.hidden_size,), 3.0), torch.full((tiny.hidden_size,), 4.0))
    assert torch.equal(model.feature_mean, torch.zeros(tiny.hidden_size))
    assert torch.allclose(model.feature_scale, torch.full((tiny.hidden_size,), 0.2))  # 1 / sqrt(3^2 + 4^2)
    assert not hasattr(model, "mask_embedding")
    embed = torch.randn(3, tiny.hidden_size)
    x = model.block_inputs(embed, torch.randn(3, tiny.hidden_size), embed[0] * 0 + 1)
    assert torch.equal(x[:, 0], embed) and torch.equal(x[:, 1:], torch.ones(3, 3, tiny.hidden_size))
    with pytest.raises(BlockdraftError, match="no extra block inputs"):
        DFlashModel(DFlashConfig.for_target(tiny, (1,), gamma=4, style="vllm", final_state_residual=True))


# --- the compatible variants train with the same recipe and stay lossless -------------------------------
@pytest.mark.parametrize("kind", ["bpd", "dflash"])
def test_compatible_variants_train_and_decode_losslessly(tiny, stores, tmp_path, kind):
    train, _ = stores
    if kind == "bpd":
        drafter = train_bpd(tiny, train, None, tmp_path / kind, BPDTrainConfig(
            num_heads=3, draft_vocab=0, epochs=3, batch=64, lr=5e-3, style="medusa"))
        method = f"bpd:checkpoint={tmp_path / kind}"
    else:
        drafter = train_dflash(tiny, train, None, tmp_path / kind, DFlashTrainConfig(
            gamma=4, draft_vocab=20, epochs=3, lr=5e-3, anchors_per_seq=12, seqs_per_step=2, style="vllm"))
        assert drafter.feature_layers == (1,)  # the store's final normed layer 2 is left out
        assert drafter.config.mask_token_id == tiny.tokenizer.unk_token_id
        method = f"dflash:checkpoint={tmp_path / kind}"
    losses = [json.loads(line)["loss"] for line in (tmp_path / kind / "train_log.jsonl").read_text().splitlines()]
    assert losses[-1] < losses[0]
    prompt = tiny.encode("tell me more now\n", chat_template=False)
    ar = SpeculativeDecoder(tiny, make_drafter("ar", tiny)).generate(prompt, 40)
    spec = SpeculativeDecoder(tiny, make_drafter(method, tiny)).generate(prompt, 40)
    assert spec.tokens == ar.tokens
    assert spec.stats.target_calls < ar.stats.target_calls
    export_vllm(tmp_path / "out", kind, tiny, tmp_path / kind)


# --- the output folder: nothing but the export's own files is ever replaced, nothing deleted -------------
def snapshot(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_non_empty_folder_is_refused_without_force_and_a_models_files_even_with_it(tiny, tmp_path):
    bpd_checkpoint(tiny, tmp_path / "ck")
    model = tmp_path / "model"  # what a user might name by mistake: a model folder
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}')
    (model / "model.safetensors").write_bytes(b"weights")
    before = snapshot(model)
    with pytest.raises(BlockdraftError, match="is not empty.*--force"):
        export_vllm(model, "bpd", tiny, tmp_path / "ck")
    with pytest.raises(BlockdraftError, match="config.json, model.safetensors that no blockdraft export wrote"):
        export_vllm(model, "bpd", tiny, tmp_path / "ck", force=True)
    assert snapshot(model) == before


def test_force_replaces_only_the_exports_own_files(tiny, tmp_path):
    bpd_checkpoint(tiny, tmp_path / "ck")
    bpd_checkpoint(tiny, tmp_path / "ck2", vocab=None)
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    (out / "README.md").write_text("mine")
    (out / "sub" / "config.json").write_text("also mine")
    with pytest.raises(BlockdraftError, match="is not empty"):
        export_vllm(out, "bpd", tiny, tmp_path / "ck")
    export_vllm(out, "bpd", tiny, tmp_path / "ck", force=True)
    first = exported(out)[0]
    export_vllm(out, "bpd", tiny, tmp_path / "ck2", force=True)  # over an earlier export: replaced
    second = exported(out)[0]
    assert first["truncated_vocab_size"] == len(VOCAB) and second["truncated_vocab_size"] == tiny.vocab_size
    files = snapshot(out)
    assert set(map(str, files)) == {"README.md", "sub/config.json", "config.json", "model.safetensors"}  # no leftovers
    assert files[Path("README.md")] == b"mine" and files[Path("sub/config.json")] == b"also mine"


def test_the_source_checkpoint_is_never_touched(tiny, tmp_path):
    ck = tmp_path / "ck"
    bpd_checkpoint(tiny, ck)
    (tmp_path / "link").symlink_to(ck)
    before = snapshot(ck)
    for out in (ck, tmp_path / "link"):
        for force in (False, True):
            with pytest.raises(BlockdraftError, match="is the checkpoint being exported"):
                export_vllm(out, "bpd", tiny, ck, force=force)
    assert snapshot(ck) == before
    export_vllm(ck / "vllm", "bpd", tiny, ck)  # a new folder inside it is fine, and adds only itself
    assert {p for p in snapshot(ck) if p.parts[0] != "vllm"} == set(before)
    assert snapshot(ck) != before and all(snapshot(ck)[p] == b for p, b in before.items())


# --- the command ----------------------------------------------------------------------------------------
def test_export_command(tiny_model_dir, tmp_path, capsys):
    from blockdraft.api import load_target

    target = load_target(str(tiny_model_dir), "float32", "cpu")
    bpd_checkpoint(target, tmp_path / "medusa")
    dflash_checkpoint(target, tmp_path / "ffn-free", style="seeded", layers=(1,))
    out = tmp_path / "export"
    assert main(["export", "--to", "vllm", str(out), "--method", "bpd", "--checkpoint", str(tmp_path / "medusa"),
                 "--target", str(tiny_model_dir)]) == 0
    assert '"method": "medusa"' in capsys.readouterr().out
    assert json.loads((out / "config.json").read_text())["blockdraft"]["method"] == "bpd"
    again = ["export", "--to", "vllm", str(out), "--method", "bpd", "--checkpoint", str(tmp_path / "medusa"),
             "--target", str(tiny_model_dir)]
    assert main(again) == 2
    err = capsys.readouterr().err.strip()
    assert "is not empty" in err and "--force" in err and len(err.splitlines()) == 1
    assert main([*again, "--force"]) == 0 and '"method": "medusa"' in capsys.readouterr().out
    assert main(["export", "--to", "vllm", str(tmp_path / "x"), "--method", "dflash", "--checkpoint",
                 str(tmp_path / "ffn-free"), "--target", str(tiny_model_dir)]) == 2
    err = capsys.readouterr().err.strip()
    assert "q/k norm" in err and len(err.splitlines()) == 1 and not (tmp_path / "x").exists()
    assert main(["export", "--to", "vllm", str(tmp_path / "y"), "--method", "dflash", "--checkpoint",
                 str(tmp_path / "medusa"), "--target", str(tiny_model_dir)]) == 2  # a bpd checkpoint
    assert "not a 'dflash' drafter" in capsys.readouterr().err


def test_dflash_training_skips_steps_without_reply_positions(tiny, stores, tmp_path):
    """A conversation whose first turn fills the whole window has no reply position to anchor a block on
    (ShareGPT has them past 512 tokens): its steps are skipped instead of crashing the run."""
    from conftest import conversations

    from blockdraft.train.features import build_store

    # a 63-character question and its newline fill the 64-token window: only the last position, which
    # predicts the cut-off first reply token, is a reply position, and a block needs one before it
    long_question = [{"id": f"q{i}", "conversations": [{"from": "human", "value": "ab" * 31 + "c"},
                                                        {"from": "gpt", "value": "abc " * 8}]} for i in range(6)]
    store = build_store(tiny, long_question + conversations(6), tmp_path / "store", max_tokens=2000, max_len=64,
                        top_k=8)
    assert any(not store.assistant[a : b - 1].any() for a, b in store.sequences())
    train_dflash(tiny, store, None, tmp_path / "out", DFlashTrainConfig(
        gamma=4, draft_vocab=0, epochs=2, lr=5e-3, anchors_per_seq=4, style="vllm"))
    assert (tmp_path / "out" / "model.safetensors").is_file()


def test_train_style_is_checked_before_anything_slow(tmp_path):
    from blockdraft.train.run import training_config

    assert training_config("bpd", tmp_path, style="medusa")[0].style == "medusa"
    assert training_config("dflash", tmp_path, style="vllm")[0].style == "vllm"
    with pytest.raises(BlockdraftError, match="'bpd' drafter's styles are ffn, medusa"):
        training_config("bpd", tmp_path, style="vllm")
    with pytest.raises(BlockdraftError, match="do not apply to the 'neural' drafter"):
        training_config("neural", tmp_path, style="medusa")
