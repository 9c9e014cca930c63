"""Every mainstream causal-LM architecture is lossless: tree passes equal plain decoding, sliding windows and
DeepSeek's multi-head latent attention included.

Tiny random models of 26 architectures (tests/tiny_architectures.py), float32, greedy: each training-free method's
output equals `ar` token for token, with drafts accepted (tau > 1.2) and a context several windows long. A
logit-level check catches what greedy output might hide. Models whose cache or positions cannot be verified
exactly are refused at load, naming the architecture. Sampling: the real-loop chi-square on a sliding-window model.
"""

from __future__ import annotations

import pytest
import torch
from conftest import CHARS, char_tokenizer
from tiny_architectures import ARCHITECTURES, WINDOW, tiny_model
from transformers import AutoConfig, AutoModelForCausalLM

from blockdraft import Target
from blockdraft.decoding import SpeculativeDecoder
from blockdraft.errors import BlockdraftError
from blockdraft.methods import make_drafter
from blockdraft.model import engine as static_engine
from blockdraft.trees import DraftTree

PROMPT = "abcabcabc abcabcabc abcabc abc abcabcab"
NEW_TOKENS = 48
METHODS = ("lookup", "suffix", "recycle", "hybrid:sources=suffix+recycle:cost=off", "quantized")


def target_for(name: str, engine: str = "auto") -> Target:
    return Target(tiny_model(name, 3 + len(CHARS)), char_tokenizer(), name=name, engine=engine)


def engines(name: str) -> list[str]:
    """The engine a user gets ('auto'), and transformers' forward too where 'auto' picks the static engine."""
    model_type = ARCHITECTURES[name][0]
    return ["auto", "hf"] if model_type in static_engine.SUPPORTED_TYPES else ["auto"]


CASES = [(name, engine) for name in ARCHITECTURES for engine in engines(name)]


@pytest.mark.parametrize("name,engine", CASES, ids=[f"{n}-{e}" for n, e in CASES])
def test_every_training_free_method_equals_ar(name, engine):
    target = target_for(name, engine)
    prompt = target.tokenizer(PROMPT)["input_ids"]
    reference = SpeculativeDecoder(target, make_drafter("ar", target)).generate(prompt, NEW_TOKENS).tokens
    if engine != "hf":  # the static engine's `ar` is transformers' own greedy output
        hf = target_for(name, "hf")
        assert SpeculativeDecoder(hf, make_drafter("ar", hf)).generate(prompt, NEW_TOKENS).tokens == reference
    # the test means something only if the output is long, varied, and runs past the sliding window
    assert len(reference) >= 40 and len(set(reference)) >= 4
    assert len(prompt) + len(reference) > 4 * WINDOW
    ran = []
    for method in METHODS:
        try:
            drafter = make_drafter(method, target)
        except BlockdraftError as e:  # `quantized` needs the static engine: say so, and say it clearly
            assert method == "quantized" and "static engine" in str(e), e
            continue
        result = SpeculativeDecoder(target, drafter).generate(prompt, NEW_TOKENS)
        assert result.tokens == reference, f"{method} differs from ar on {name} ({engine})"
        tau = result.stats.new_tokens / result.stats.target_calls
        assert tau > 1.2, f"{method} on {name}: tau {tau:.2f}, too few drafts accepted to prove anything"
        ran.append(method)
    expect_quantized = type(target.forwarder).__name__ == "StaticEngine"
    assert ("quantized" in ran) == expect_quantized


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_tree_logits_equal_sequential_logits(name):
    """Logit level: a tree pass whose accepted path is not its first nodes, then a commit, then more steps, give
    the logits of one-token steps over the same tokens, with the context past the window."""
    tree_target, plain = target_for(name, "hf"), target_for(name, "hf")
    prompt = [3 + (5 * i) % 31 for i in range(3 * WINDOW)]
    tree_target.prefill(prompt[:-1])
    plain.prefill(prompt[:-1])
    root = prompt[-1]
    for step in range(3):
        decoy, a, b = 3 + step, 10 + step, 20 + step
        tree = DraftTree.from_paths(root, [[decoy, decoy + 1, decoy + 2], [a, b]])  # path root, a, b: nodes 0, 4, 5
        out = tree_target.verify(tree)
        path = [0, 4, 5]
        tree_target.commit(path)
        for node, token in zip(path, [root, a, b], strict=True):
            expected = plain.verify(DraftTree.root_only(token)).logits[0]
            plain.commit([0])
            torch.testing.assert_close(out.logits[node], expected, rtol=1e-4, atol=1e-4)
        root = 30 - step
    assert tree_target.length == plain.length > 2 * WINDOW


def _tiny(model_type: str, **fields):
    config = AutoConfig.for_model(model_type, vocab_size=40, hidden_size=32, intermediate_size=64,
                                  num_hidden_layers=2, num_attention_heads=4, **fields)
    return AutoModelForCausalLM.from_config(config)


@pytest.mark.parametrize("model_type,fields,why", [
    ("bloom", {}, "ALiBi"),
    ("falcon", {"alibi": True}, "ALiBi"),
    ("gpt_neo", {"attention_types": [[["global", "local"], 1]], "window_size": 4}, "local attention"),
    ("mamba", {"state_size": 4}, "recurrent state"),
])
def test_models_that_cannot_be_verified_exactly_are_refused(model_type, fields, why):
    with pytest.raises(BlockdraftError, match=f"'{model_type}'.*{why}|{why}.*'{model_type}'") as info:
        Target(_tiny(model_type, **fields), name="x")
    assert "exactly" in str(info.value) or "cannot" in str(info.value)


@pytest.mark.parametrize("model_type", ["deepseek_v2", "deepseek_v3"])
def test_latent_attention_with_fewer_key_value_heads_is_refused_naming_why(model_type):
    """Multi-head latent attention verifies exactly (ARCHITECTURES' deepseek entries, above); a config declaring
    fewer key/value heads than attention heads, which transformers' own forward cannot run on two tokens, is
    refused at load rather than failing with a tensor size mismatch at the first draft."""
    from tiny_architectures import MLA

    fields = {**MLA, "num_key_value_heads": 2, "n_group": 1, "topk_group": 1}
    with pytest.raises(BlockdraftError, match=f"'{model_type}' uses multi-head latent attention.*"
                                              "num_key_value_heads=2.*cannot verify drafts"):
        Target(_tiny(model_type, **fields), name="x")


@pytest.mark.parametrize("kind", ["chunked_attention", "linear_attention"])
def test_layers_other_than_full_or_sliding_attention_are_refused(kind):
    from blockdraft.model.hf_forward import layer_windows

    config = AutoConfig.for_model("llama", num_hidden_layers=2)
    config.layer_types = [kind, "full_attention"]
    with pytest.raises(BlockdraftError, match=f"'llama' has layers of type {kind}"):
        layer_windows(config)


def test_the_tree_mask_honours_the_window_per_layer_type():
    """Gemma-2 alternates sliding and full layers: the full layer must see the whole prefix, the sliding one only
    the window. Breaking either mask (both full, or both windowed) changes the logits past the window."""
    target = target_for("gemma2", "hf")
    forwarder = target.forwarder
    assert forwarder.windows == [WINDOW, None] and forwarder.mixed
    prompt = [3 + (7 * i) % 31 for i in range(3 * WINDOW)]
    tree = DraftTree.from_paths(5, [[6, 7], [8]])

    def logits():
        target.prefill(prompt)
        return target.verify(tree).logits

    right = logits()
    for broken in ([None, None], [WINDOW, WINDOW]):
        forwarder.windows, forwarder.mixed = broken, False
        assert not torch.allclose(logits(), right, atol=1e-3)


# --- sampling: the real-loop chi-square on a sliding-window model ---------------------------------------------

@pytest.fixture(scope="module")
def windowed_loop_model():
    """A one-layer Mistral whose window (3) is shorter than the scored context (prompt 4 + up to 7 new tokens)."""
    from test_sampling_lossless import V
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(2)
    config = MistralConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=4, num_key_value_heads=2, sliding_window=3, eos_token_id=None,
                           max_position_embeddings=64)
    model = MistralForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(25.0)  # peaked rows, as the Llama loop test's
    model.generation_config.eos_token_id = None
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield model
    torch.set_num_threads(threads)


def _drop_the_window(target, monkeypatch):
    """The bug the negative control plants: sliding-window layers attend to the whole prefix."""
    import dataclasses

    forwarder = target.forwarder
    if hasattr(forwarder, "windows"):  # transformers' forward
        monkeypatch.setattr(forwarder, "windows", [None])
    else:  # the static engine
        unwindowed = dataclasses.replace(forwarder.traits, windows=(None,))
        monkeypatch.setattr(forwarder, "traits", unwindowed)
        monkeypatch.setattr(forwarder.decoder, "traits", unwindowed)


@pytest.mark.parametrize("engine", ["hf", "static"])
@pytest.mark.parametrize("broken_window", [False, True], ids=["window", "window-ignored"])
def test_sampling_through_a_sliding_window_matches_the_target(windowed_loop_model, engine, broken_window,
                                                               monkeypatch):
    """Rejection sampling over depth-3 trees, KV commits between steps, keys leaving the window: the joint law of
    the first 4 tokens (exact, from transformers' own full-sequence forward) is reproduced. Negative control: the
    same loop with the window left out of the mask must fail."""
    from test_sampling_lossless import FILTERED, N_LOOP, SCORED, chi_square_p, exact_joint, loop_drafter, loop_samples

    from blockdraft.verify import RejectionAcceptor

    target = Target(windowed_loop_model, name="tiny-mistral-window-3", engine=engine)
    if broken_window:
        _drop_the_window(target, monkeypatch)
    joint = exact_joint(target.model, FILTERED, SCORED)
    counts, steps = loop_samples(target, RejectionAcceptor(FILTERED), loop_drafter(joint, seed=1), N_LOOP)
    if not broken_window:
        assert chi_square_p(counts, joint, N_LOOP) > 0.01
        assert sum(any(k >= 2 for k in lengths[1:]) for lengths in steps) > 0.1 * N_LOOP  # drafts accepted later
        return
    try:
        p = chi_square_p(counts, joint, N_LOOP)
    except AssertionError as e:  # samples outside the support: caught even before a p-value
        assert "outside the support" in str(e)
        return
    assert p < 1e-4
