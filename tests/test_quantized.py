"""Self-speculation with a lowered copy of the target (drafters/quantized.py): its steps are the lowered model's
on the target's own cache, they leave that cache as verification needs it, and decoding stays lossless (greedy
token for token, sampling by chi-square on the real loop, with a drafter that lies about q as the control)."""

import pytest
import torch
from conftest import char_tokenizer, tiny_llama

from blockdraft import SamplingParams, SpeculativeDecoder, Target
from blockdraft.decoding.batch import BatchDecoder
from blockdraft.drafters.quantized import QuantizedDrafter
from blockdraft.errors import BlockdraftError
from blockdraft.methods import make_drafter
from blockdraft.trees import DraftTree
from blockdraft.verify import RejectionAcceptor

from test_sampling_lossless import DEPTH, SCORED, chi_square_p, exact_joint, loop_samples
from test_sampling_lossless import loop_target  # noqa: F401 (a fixture, used by name)

PROMPTS = [[1, 5, 7, 9, 11], [1, 20, 3, 3, 3, 3, 8], [1] + list(range(4, 30))]


def peaked_target(seed: int = 0) -> Target:
    return Target(tiny_llama(vocab_size=34, seed=seed, logit_scale=6.0, layers=2), char_tokenizer(), name="tiny")


@pytest.mark.parametrize("weights", ["float16", "int8"])
def test_greedy_output_is_plain_greedy_output(weights):
    target = peaked_target()
    ar = SpeculativeDecoder(target, make_drafter("ar", target))
    spec = SpeculativeDecoder(target, make_drafter(f"quantized:weights={weights}:min_prob=0", target))
    drafted = 0
    for prompt in PROMPTS:
        expected = ar.generate(prompt, max_new_tokens=40).tokens
        result = spec.generate(prompt, max_new_tokens=40)
        assert result.tokens == expected
        drafted += result.stats.tree_nodes - result.stats.target_calls
    assert drafted > 0


def lowered_reference(model, weights: str) -> torch.nn.Module:
    """The same model with every projection's weight replaced by its lowered (and dequantized) value."""
    from blockdraft.model import packing

    ref = tiny_llama(vocab_size=34, seed=0, logit_scale=6.0, layers=2)
    ref.load_state_dict(model.state_dict())
    with torch.no_grad():
        for module in ref.modules():
            if isinstance(module, torch.nn.Linear):
                w = module.weight
                if weights == "float16":
                    w.copy_(w.half().float())
                else:
                    q, scales = packing.quantize(w)
                    w.copy_(q.float() * scales.float()[:, None])
    return ref


@pytest.mark.parametrize("weights", ["float16", "int8"])
def test_draft_steps_are_the_lowered_model_on_the_targets_cache(weights):
    """Three chained draft steps after a prefill give the logits of the lowered model over prompt + drafts (to the
    rounding of its activations), and the target's own cache afterwards still verifies exactly as without them."""
    target, prompt = peaked_target(), PROMPTS[2]
    drafter = QuantizedDrafter(target, weights=weights)
    ref = lowered_reference(target.model, weights)
    target.prefill(prompt[:-1])
    tokens, logits = [prompt[-1]], []
    for offset in range(3):
        row = target.forwarder.draft_step(drafter.step, tokens[-1], offset)
        logits.append(row)
        tokens.append(int(row.argmax()))
    assert target.length == len(prompt) - 1  # drafting moved nothing
    with torch.no_grad():
        expected = ref(torch.tensor([prompt + tokens[1:3]])).logits[0, -3:]
    got = torch.stack(logits)
    scale = expected.abs().max()
    tolerance = 0.02 if weights == "float16" else 0.06  # int8 also rounds the activations to bf16
    assert (got - expected).abs().max() < tolerance * scale
    # and a plain-weights model differs by more than that: the steps did use the lowered weights
    if weights == "int8":
        with torch.no_grad():
            plain = target.model(torch.tensor([prompt + tokens[1:3]])).logits[0, -3:]
        assert (got - plain).abs().max() > (got - expected).abs().max()
    # the verification pass over the drafted chain overwrites the drafted slots: the same logits as a fresh cache
    verified = target.verify(DraftTree.chain(prompt[-1], tokens[1:])).logits
    fresh = peaked_target()
    fresh.prefill(prompt[:-1])
    assert torch.equal(verified, fresh.verify(DraftTree.chain(prompt[-1], tokens[1:])).logits)


def test_hybrid_with_the_copy_as_its_learned_source_is_lossless():
    """suffix + quantized: retrieval where the text repeats, the copy's chain elsewhere, one tree, the same output."""
    target = peaked_target(seed=1)
    ar = SpeculativeDecoder(target, make_drafter("ar", target))
    drafter = make_drafter("hybrid:sources=suffix+quantized:gate=false:cost=off", target)
    assert drafter.single_sequence  # it drafts through the target's cache: not for the batch decoder
    hybrid = SpeculativeDecoder(target, drafter)
    for prompt in PROMPTS:
        assert hybrid.generate(prompt, max_new_tokens=40).tokens == ar.generate(prompt, max_new_tokens=40).tokens
    assert drafter.learned_runs > 0


def test_a_confident_copy_drafts_deep_and_an_unsure_one_stops():
    target = peaked_target()
    deep = SpeculativeDecoder(target, QuantizedDrafter(target, depth=4, min_prob=0.0))
    result = deep.generate(PROMPTS[0], max_new_tokens=40)
    # the float16 copy of a float32 model agrees with it almost everywhere: most 4-token chains are accepted
    assert result.stats.new_tokens / result.stats.target_calls > 3.0
    unsure = SpeculativeDecoder(target, QuantizedDrafter(target, depth=4, min_prob=1.0))  # stops after one draft
    result = unsure.generate(PROMPTS[0], max_new_tokens=40)
    assert result.stats.tree_nodes == 2 * result.stats.target_calls


class ArgmaxClaimingToSample(QuantizedDrafter):
    """Broken: drafts the argmax but reports the tempered distribution as what it was drawn from."""

    def propose(self, ctx):
        tree = super().propose(ctx)
        if tree.q is None:
            return tree
        greedy = super().propose(type(ctx)(ctx.tokens, None, ctx.max_depth))  # the same chain at T = 0
        n = min(greedy.tokens.numel(), tree.tokens.numel())
        return DraftTree.chain(ctx.tokens[-1], greedy.tokens[1:n], tree.q[1:n])


@pytest.mark.parametrize("drafter,ok", [(QuantizedDrafter, True), (ArgmaxClaimingToSample, False)])
def test_sampled_chains_sample_the_target_distribution(loop_target, drafter, ok):  # noqa: F811
    params = SamplingParams(1.0)
    joint = exact_joint(loop_target.model, params, SCORED)
    n = 1500
    counts, steps = loop_samples(loop_target, RejectionAcceptor(params), drafter(loop_target, DEPTH, 0.0), n)
    p = chi_square_p(counts, joint, n)
    if ok:
        assert p > 0.01
        assert sum(lengths[0] == DEPTH + 1 for lengths in steps) > 0.05 * n  # whole chains accepted
    else:
        assert p < 1e-4


def test_bad_options_and_targets_get_clear_errors():
    target = peaked_target()
    with pytest.raises(BlockdraftError, match="weights must be one of"):
        make_drafter("quantized:weights=int2", target)
    with pytest.raises(BlockdraftError, match="depth must be a positive integer"):
        make_drafter("quantized:depth=0", target)
    with pytest.raises(BlockdraftError, match="min_prob"):
        make_drafter("quantized:min_prob=2", target)
    hf = Target(tiny_llama(vocab_size=34), char_tokenizer(), name="tiny", engine="hf")
    with pytest.raises(BlockdraftError, match="transformers' forward"):
        make_drafter("quantized", hf)
    with pytest.raises(BlockdraftError, match="cannot run in the batch decoder"):
        BatchDecoder(target, max_batch=2).add(PROMPTS[0], make_drafter("quantized", target))
