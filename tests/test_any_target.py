"""Any target: replies found from the target's own chat template, n-gram LMs over vocabularies above 65,536,
and every drafter kind trained end to end for tiny Qwen2 / Mistral targets with non-ChatML templates."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from conftest import conversations
from tiny_chat_targets import chat_tokenizer, tiny_chat_target

from blockdraft import methods
from blockdraft.data.chat import check_chat_template
from blockdraft.decoding import SpeculativeDecoder
from blockdraft.errors import BlockdraftError
from blockdraft.methods import make_drafter
from blockdraft.refine.ngram import NGramLM, key_bits, max_order
from blockdraft.train.features import conversation_ids

RECORD = {"id": "x", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "ab ab"},
                                       {"from": "human", "value": "more"}, {"from": "gpt", "value": "cd"}]}


def trained_runs(tok, ids, mask) -> list[str]:
    """The text of each run of tokens that the mask trains (position i-1 predicts token i)."""
    runs, cur = [], []
    for i in range(1, len(ids)):
        if mask[i - 1]:
            cur.append(ids[i])
        elif cur:
            runs.append(tok.decode(cur))
            cur = []
    return runs + ([tok.decode(cur)] if cur else [])


@pytest.mark.parametrize("style, replies", [
    ("chatml", ["ab ab<|im_end|>", "cd<|im_end|>"]),  # the default target's format: as before
    ("llama3", ["ab ab<|eot_id|>", "cd<|eot_id|>"]),
    ("llama3-generation", ["ab ab<|eot_id|>", "cd<|eot_id|>"]),  # via return_assistant_tokens_mask
    ("mistral", [" ab ab</s>", " cd</s>"]),  # the template writes the space: the target generates it
])
def test_replies_are_found_from_the_template(style, replies):
    tok = chat_tokenizer(style)
    ids, mask = conversation_ids(tok, RECORD, 512, {tok.eos_token_id})
    assert ids == tok.apply_chat_template([{"role": "user" if t["from"] == "human" else "assistant",
                                            "content": t["value"]} for t in RECORD["conversations"]])["input_ids"]
    # exactly the replies and their end token: no header, no [INST], no newline after the end token
    assert trained_runs(tok, ids, mask) == replies


def test_generation_tags_and_prefix_rendering_agree():
    plain, tagged = chat_tokenizer("llama3"), chat_tokenizer("llama3-generation")
    assert conversation_ids(plain, RECORD, 512) == conversation_ids(tagged, RECORD, 512)


def test_truncation_keeps_the_reply_mask_aligned():
    tok = chat_tokenizer("llama3")
    full_ids, full_mask = conversation_ids(tok, RECORD, 512)
    ids, mask = conversation_ids(tok, RECORD, 40)
    assert ids == full_ids[:40] and mask[:-1] == full_mask[:39] and mask[-1] == 0


def test_a_template_that_rewrites_history_keeps_the_consistent_prefix():
    tok = chat_tokenizer("llama3")  # replies that are no longer the last message are shortened (as Qwen3 drops
    tok.chat_template = tok.chat_template.replace(  # earlier reasoning)
        "m['content'] | trim", "(m['content'] if loop.last or m['role'] == 'user' else 'x') | trim")
    ids, mask = conversation_ids(tok, RECORD, 512)
    assert trained_runs(tok, ids, mask) == ["ab ab<|eot_id|>"]  # the first reply, as rendered when it was last
    assert tok.decode(ids).endswith("assistant<|end_header_id|>\n\nab ab<|eot_id|>")


def test_a_template_that_drops_replies_is_refused():
    tok = chat_tokenizer("llama3")
    tok.chat_template = "{% for m in messages %}{% if m['role'] == 'user' %}{{ m['content'] }}{% endif %}{% endfor %}"
    with pytest.raises(BlockdraftError, match="cannot locate the assistant replies"):
        check_chat_template(tok, "target 'x'")
    tok.chat_template = "{{ raise_exception('no chat here') }}"
    with pytest.raises(BlockdraftError, match="cannot render a user/assistant conversation.*no chat here"):
        check_chat_template(tok, "target 'x'")


def test_a_template_that_refuses_one_conversation_skips_it():
    tok = chat_tokenizer("mistral")
    odd = {"id": "y", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "ab"}]}
    assert conversation_ids(tok, odd, 512) is not None
    tok.chat_template = "{{ raise_exception('roles') if messages | length > 2 else '' }}" + tok.chat_template
    assert conversation_ids(tok, RECORD, 512) is None  # refused by the template: skipped, not a crash


# --- the n-gram LM above 16-bit token ids -----------------------------------------------------------------

V = 200_000
A, B, C = 70_000, 70_000 - 65_536, 199_999  # A and B share their low 16 bits: 16-bit keys would merge them
TOY = [[A, B, A, C], [B, A, B]]


def kneser_ney_by_hand(seqs, order, vocab):
    """Interpolated Kneser-Ney from Counters, formula by formula (no pruning)."""
    grams = {n: Counter(tuple(s[i : i + n]) for s in seqs for i in range(len(s) - n + 1)) for n in range(1, order + 1)}
    counts = {order: grams[order]}
    for n in range(1, order):  # continuation counts: distinct left neighbours (at least 1)
        left = Counter(g[1:] for g in grams[n + 1])
        counts[n] = {g: max(left.get(g, 0), 1) for g in grams[n]}
    disc = {}
    for n, c in counts.items():
        n1, n2 = sum(v == 1 for v in c.values()), sum(v == 2 for v in c.values())
        disc[n] = min(max(n1 / (n1 + 2 * n2), 0.1), 0.9) if n1 + n2 else 0.5

    def p(ctx, w, n):
        if n == 0:
            return 1 / vocab
        ctx = tuple(ctx[len(ctx) - (n - 1):]) if n > 1 else ()
        rows = {g: v for g, v in counts[n].items() if g[:-1] == ctx}
        if not rows:
            return p(ctx, w, n - 1)
        total = sum(rows.values())
        backoff = 1 - sum(max(v - disc[n], 0) for v in rows.values()) / total
        return max(rows.get((*ctx, w), 0) - disc[n], 0) / total + backoff * p(ctx, w, n - 1)

    return lambda ctx, w: p(list(ctx), w, order)


def test_ngram_above_16_bit_vocab_matches_counts_by_hand(tmp_path):
    lm = NGramLM.fit(TOY, V, order=2)
    assert lm.bits == 18 and key_bits(49_152) == 16  # the shipped 49k-vocab LMs keep their 16-bit keys
    # bigrams (A,B):2 (A,C):1 (B,A):2, discount 1/(1+2*2) = 0.2; unigram continuation counts 1 each, D = 0.9
    p_uni = lambda w: max(1 - 0.9, 0) / 3 + (1 - 3 * 0.1 / 3) / V  # noqa: E731
    expect = {(A, B): 1.8 / 3 + (1 - 2.6 / 3) * p_uni(B), (A, C): 0.8 / 3 + (1 - 2.6 / 3) * p_uni(C),
              (B, A): 1.8 / 2 + 0.1 * p_uni(A), (B, B): 0.1 * p_uni(B), (C, A): p_uni(A)}
    ctx = np.array([[c] for c, _ in expect])
    got = np.exp(lm.logprob(ctx, np.array([w for _, w in expect])))
    assert got == pytest.approx(list(expect.values()), rel=1e-6)
    lm.save(tmp_path / "lm")
    again = NGramLM.load(tmp_path / "lm", vocab_size=V)
    assert json.loads((tmp_path / "lm" / "config.json").read_text())["key_bits"] == 18
    assert np.array_equal(again.logprob(ctx, np.array([w for _, w in expect])), lm.logprob(ctx, np.array(
        [w for _, w in expect])))
    assert again.distribution([A]).sum() == pytest.approx(1.0, abs=1e-6)


def test_ngram_order_4_above_16_bits_matches_the_reference():
    rng = np.random.default_rng(0)
    words = np.array([3, 65_537, 65_539, 131_075, 199_998])  # ids that collide in their low 16 bits
    seqs = [list(words[rng.integers(0, 5, size=rng.integers(5, 30))]) for _ in range(20)]
    lm, ref = NGramLM.fit(seqs, V, order=4), kneser_ney_by_hand(seqs, 4, V)
    contexts = [list(words[rng.integers(0, 5, size=3)]) for _ in range(40)]
    targets = list(words[rng.integers(0, 5, size=40)])
    got = np.exp(lm.logprob(np.array(contexts), np.array(targets)))
    assert got == pytest.approx([ref(c, w) for c, w in zip(contexts, targets, strict=True)], rel=1e-5)
    assert lm.distribution(contexts[0]).sum() == pytest.approx(1.0, abs=1e-6)


def test_ngram_order_limits_and_old_files():
    assert max_order(49_152) == 5 and max_order(151_936) == 4 and max_order(2**22) == 3
    with pytest.raises(BlockdraftError, match="order must be 2..4 for a vocabulary of 151,936"):
        NGramLM.fit(TOY, 151_936, order=5)
    shipped = Path(methods.CHECKPOINTS) / "smollm2-135m" / "ngram"
    lm = NGramLM.load(shipped)  # saved before key_bits existed: read as 16-bit keys
    assert lm.bits == 16 and lm.order == 4
    assert lm.distribution([1, 2, 3]).sum() == pytest.approx(1.0, abs=1e-5)
    assert math.isfinite(float(lm.logprob(np.array([[1, 2, 3]]), np.array([4]))[0]))


# --- every drafter kind, end to end, for other architectures and templates ---------------------------------

@pytest.fixture(scope="module", params=[("qwen2", "llama3", 70_000), ("mistral", "mistral", 0)],
                ids=["qwen2-llama3-70k-vocab", "mistral-inst"])
def trained(request, tmp_path_factory):
    """A tiny target and every checkpoint kind trained for it by `blockdraft train`'s code, laid out like the
    shipped checkpoints so that each method loads by its bare name."""
    from blockdraft.train.run import train_command

    arch, style, first_char = request.param
    target = tiny_chat_target(arch, style, first_char)
    root = tmp_path_factory.mktemp(f"any-{arch}")
    data = root / "conversations.json"
    data.write_text(json.dumps(conversations(120)))
    out, store = root / "checkpoints" / target.name, root / "store"
    common = dict(data=str(data), max_tokens=6000, valid_tokens=0, store=str(store))
    train_command(target, "bpd", out / "bpd", **common, num_heads=3, inner_size=64, draft_vocab=24, epochs=3,
                  batch=64, lr=5e-3)
    train_command(target, "dflash", out / "dflash", **common, gamma=4, draft_vocab=24, epochs=3, lr=5e-3,
                  anchors_per_seq=12, seqs_per_step=2)
    for method, base in (("treeflash", "dflash"), ("hydra", "bpd")):
        train_command(target, "treeflash", out / method, **common, init=str(out / base), inner_size=32, epochs=1,
                      lr=3e-3, anchors_per_seq=12, batch=64)
    train_command(target, "neural", out / "neural", **common, width=32, num_layers=1, window=8, draft_vocab=24,
                  epochs=1, batch=16, lr=3e-3)
    train_command(target, "ngram", out / "ngram", data=str(data), max_tokens=4000, order=3, min_count=1)
    return target, root / "checkpoints"


METHODS = ["bpd", "dflash", "treeflash", "hydra", "bpd-ngram", "dflash-neural", "ddtree:prior=0.3"]


def test_store_masks_replies_under_the_template(trained):
    from blockdraft.train.features import FeatureStore

    target, root = trained
    store = FeatureStore.open(root.parent / "store")
    a, b = next(store.sequences())
    ids, mask = list(np.asarray(store.tokens[a:b])), np.asarray(store.assistant[a:b])
    runs = trained_runs(target.tokenizer, ids, mask)
    eos = target.tokenizer.eos_token
    assert runs and all(r.endswith(eos) and "INST" not in r and "header" not in r for r in runs)
    assert min(ids) >= 0 and (max(ids) > 65_536) == (target.vocab_size > 65_536)


def generate(target, method, n=40):
    prompt = target.encode("tell me more now")  # through the target's own (non-ChatML) template
    return SpeculativeDecoder(target, make_drafter(method, target)).generate(prompt, n)


@pytest.mark.parametrize("method", METHODS)
def test_every_drafter_kind_is_lossless(trained, method, monkeypatch):
    target, root = trained
    monkeypatch.setattr(methods, "CHECKPOINTS", root)  # every method loads by its bare name
    assert generate(target, method).tokens == generate(target, "ar").tokens


def test_both_base_drafters_get_drafts_accepted(trained, monkeypatch):
    target, root = trained
    monkeypatch.setattr(methods, "CHECKPOINTS", root)
    ar_calls = generate(target, "ar").stats.target_calls
    # a few steps of training on 6k tokens: some methods of each base drafter beat one token per call
    for family in (["bpd", "hydra", "bpd-ngram"], ["dflash", "treeflash", "dflash-neural"]):
        assert min(generate(target, m).stats.target_calls for m in family) < ar_calls, family
