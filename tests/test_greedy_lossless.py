"""Greedy speculative decoding emits exactly the tokens of plain greedy decoding."""

import pytest
import torch

from blockdraft import NoDrafter, PromptLookupDrafter, SpeculativeDecoder, Target, methods
from blockdraft.methods import METHODS, make_drafter

from conftest import tiny_llama
from drafters_for_tests import KnownAcceptanceDrafter, RandomTreeDrafter


def _hf_greedy(model, prompt, n):
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None,
                             pad_token_id=0)
    return out[0, len(prompt):].tolist()


def _eos_free_target(seed=0):
    """A tiny target without EOS, so every run produces exactly max_new_tokens."""
    model = tiny_llama(vocab_size=24, seed=seed, logit_scale=3.0)
    model.generation_config.eos_token_id = None
    model.config.eos_token_id = None
    return Target(model, name="tiny")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_drafter_matches_hf_generate(seed):
    target = _eos_free_target(seed)
    model = target.model
    prompt = [3, 4, 5, 6, 3, 4, 5, 7, 8, 3, 4]
    ref = _hf_greedy(model, prompt, 40)
    drafters = [
        NoDrafter(),
        PromptLookupDrafter(),
        PromptLookupDrafter(max_ngram=2, num_tokens=6, max_branches=3),
        RandomTreeDrafter(24, max_nodes=12, seed=seed, favour=ref),  # mixes right and wrong branches
    ]
    for drafter in drafters:
        res = SpeculativeDecoder(target, drafter).generate(prompt, max_new_tokens=40)
        assert res.tokens == ref, f"{drafter.name} diverged from plain greedy"
        assert res.stats.new_tokens == 40


def test_tree_drafter_actually_accepts_multiple_tokens():
    target = _eos_free_target()
    prompt = [3, 4, 5, 6, 3, 4, 5, 7]
    ref = _hf_greedy(target.model, prompt, 30)
    res = SpeculativeDecoder(target, RandomTreeDrafter(24, 16, favour=ref)).generate(prompt, 30)
    assert res.tokens == ref
    assert res.stats.tau > 1.0 and max(res.stats.accepted_hist) >= 2


@pytest.mark.parametrize("method", [m for m in METHODS if m != "ar"])
def test_every_method_in_float32_equals_ar_and_gets_drafts_accepted(tiny, checkpoints, monkeypatch, method):
    """Every method, as shipped (its tiny checkpoints trained on the target's own replies, conftest.checkpoints),
    gives greedy output identical to `ar` in float32; and not vacuously: its drafts are verified and accepted
    (tau > 1 on each prompt)."""
    monkeypatch.setattr(methods, "CHECKPOINTS", checkpoints)  # every method loads by its bare name
    for text in ("tell me more now\n", "tell me more now\ngkfngk"):  # a question, and one answered in part
        prompt = tiny.encode(text, chat_template=False)
        ar = SpeculativeDecoder(tiny, make_drafter("ar", tiny)).generate(prompt, 32)
        res = SpeculativeDecoder(tiny, make_drafter(method, tiny)).generate(prompt, 32)
        assert res.tokens == ar.tokens
        assert res.stats.tree_nodes > res.stats.target_calls  # drafts were verified, not only roots
        assert res.stats.tau > 1, (text, res.stats.accepted_hist)  # and some were accepted


def test_tau_and_acceptance_histogram_match_a_hand_count():
    """2 drafts right per step: 13 tokens = 4 steps of 3 (2 drafts + bonus) and 1 step with no room to draft."""
    target = _eos_free_target()
    prompt = [3, 4, 5, 6, 3, 4, 5, 7]
    res = SpeculativeDecoder(target, KnownAcceptanceDrafter(target.model, right=2)).generate(prompt, 13)
    assert res.tokens == _hf_greedy(target.model, prompt, 13)
    assert res.stats.target_calls == 5 and res.stats.tau == pytest.approx(13 / 5)
    assert res.stats.accepted_hist == {2: 4, 0: 1}
    assert res.stats.tree_nodes == 4 * 4 + 1  # root + 3 drafts each time, then the root alone


def test_eos_and_max_new_tokens_cut_the_output(tiny_target):
    prompt = [5, 6, 7, 8]
    tiny_target.model.generation_config.eos_token_id = None
    tiny_target.config.eos_token_id = None
    tiny_target.tokenizer.eos_token = None  # no EOS at all: we get exactly max_new_tokens
    free = SpeculativeDecoder(tiny_target, PromptLookupDrafter()).generate(prompt, 25)
    assert len(free.tokens) == 25 and free.stats.stop_reason == "length"
    eos = free.tokens[7]  # pretend the 8th token is EOS: generation must end right after it
    tiny_target.config.eos_token_id = eos
    cut = SpeculativeDecoder(tiny_target, PromptLookupDrafter()).generate(prompt, 25)
    first = free.tokens.index(eos)
    assert cut.tokens == free.tokens[: first + 1] and cut.stats.stop_reason == "eos"


def test_single_token_prompt():
    target = _eos_free_target()
    ref = _hf_greedy(target.model, [5], 12)
    assert SpeculativeDecoder(target, PromptLookupDrafter(min_ngram=1)).generate([5], 12).tokens == ref


def test_python_api_generate_matches_decoder(tiny_target):
    import blockdraft

    ids = tiny_target.encode("abc abc ab", chat_template=False)
    res = blockdraft.generate(ids, method="lookup:max_branches=2", target=tiny_target, max_new_tokens=10)
    ref = SpeculativeDecoder(tiny_target, NoDrafter()).generate(ids, 10)
    assert res.tokens == ref.tokens and res.stats.method == "lookup:max_branches=2"
    with pytest.raises(blockdraft.BlockdraftError, match="temperature"):
        blockdraft.generate(ids, target=tiny_target, temperature=-1)


@pytest.mark.parametrize("nodes", [3, 8, 9, 32])  # both sides of GreedyAcceptor.CONVERT_ALL
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_acceptor_walks_the_argmax_path_reading_rows_lazily(nodes, dtype):
    from blockdraft.trees import DraftTree
    from blockdraft.verify.greedy import GreedyAcceptor

    g = torch.Generator().manual_seed(nodes)
    vocab = 50
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, nodes)]
    tree = DraftTree(torch.randint(0, vocab, (nodes,), generator=g), parents)
    logits = torch.randn(nodes, vocab, generator=g).to(dtype)
    for node in range(nodes):  # make the target agree with a child wherever one exists: a deep accepted path
        children = tree.children[node]
        if children:
            logits[node, int(tree.tokens[children[-1]])] = 10.0
    want, node = [0], 0  # reference: torch argmax over float32 rows, first matching child
    while True:
        token = int(logits[node].float().argmax())
        child = next((c for c in tree.children[node] if int(tree.tokens[c]) == token), None)
        if child is None:
            break
        want.append(child)
        node = child
    acc = GreedyAcceptor().accept(tree, logits)
    assert acc.path == want and acc.bonus == token
    assert len(want) > 1  # the walk went past the root
