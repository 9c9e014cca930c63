"""Batched speculative decoding: the batch engine reproduces the one-sequence engine, and every sequence of a
continuous batch (different prompt lengths, joining at different steps, any draft trees) gets exactly its
batch-1 greedy output, stop rules and statistics included (float32, tiny models)."""

from __future__ import annotations

import pytest
import torch

from blockdraft import NoDrafter, SpeculativeDecoder, Target
from blockdraft.decoding import BatchDecoder
from blockdraft.drafters import PromptLookupDrafter
from blockdraft.errors import BlockdraftError
from blockdraft.model.batch_engine import BatchEngine
from blockdraft.trees import DraftTree
from conftest import CHARS, char_tokenizer, tiny_llama
from drafters_for_tests import RandomTreeDrafter

VOCAB = 3 + len(CHARS)


def make_target(layers=(), compile=False, weights="full") -> Target:
    return Target(tiny_llama(vocab_size=VOCAB, logit_scale=4.0), char_tokenizer(), name="tiny",
                  feature_layers=layers, compile=compile, weights=weights)


def prompt(length: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (length,), generator=g).tolist()


def test_batch_engine_matches_the_single_sequence_engine_through_trees_and_commits():
    layers = (0, 1, 2)
    singles = [make_target(layers) for _ in range(3)]
    engine = BatchEngine(make_target().forwarder, slots=3)
    prompts = [prompt(n, seed) for seed, n in enumerate((5, 17, 9))]
    for slot, (single, p) in enumerate(zip(singles, prompts, strict=False)):
        want = single.prefill(p[:-1])
        _, hidden = engine.forward(slot, [torch.tensor(p[:-1])], [torch.arange(len(p) - 1)], [None], layers)
        torch.testing.assert_close(torch.cat([h[0] for h in hidden], -1), want, rtol=1e-5, atol=1e-5)
    steps = [  # per step, per sequence: (tree, accepted path); paths that skip nodes move KV entries
        [(DraftTree.from_paths(5, [[6, 7, 8], [6, 9], [10, 11]]), [0, 4, 5]), (DraftTree.chain(4, [5, 6]), [0, 1]),
         (DraftTree.root_only(7), [0])],
        [(DraftTree.chain(12, [13, 14, 15]), [0, 1, 2, 3]), (DraftTree.from_paths(9, [[3, 4], [5]]), [0, 3]),
         (DraftTree.from_paths(8, [[1], [2], [3, 4, 5, 6]]), [0, 3, 4])],
    ]
    for step in steps:
        starts = list(engine.lengths)
        trees = [tree for tree, _ in step]
        logits, hidden = engine.forward(0, [t.tokens for t in trees], [t.depth for t in trees],
                                        [None if t.is_chain() else t.ancestor_mask() for t in trees], layers)
        for b, (single, (tree, path)) in enumerate(zip(singles, step, strict=False)):
            want = single.verify(tree)
            n = len(tree)
            torch.testing.assert_close(logits[b, :n].float(), want.logits, rtol=1e-5, atol=1e-5)
            features = torch.cat([h[b, :n] for h in hidden], -1)
            torch.testing.assert_close(features, want.features, rtol=1e-5, atol=1e-5)
            single.commit(path)
            engine.commit(b, starts[b], path)
    assert engine.lengths == [s.length for s in singles]


def test_batch_engine_refuses_transformers_forward():
    target = Target(tiny_llama(vocab_size=VOCAB), name="t", engine="hf")
    with pytest.raises(BlockdraftError, match="--max-batch 1"):
        BatchDecoder(target, 4)


class FeatureRecorder(RandomTreeDrafter):
    """Random trees (seeded) that also keep every feature tensor they were given, to compare runs."""

    def __init__(self, layers, seed):
        super().__init__(VOCAB, max_nodes=6, seed=seed, favour=list(range(3, 12)))
        self.feature_layers = layers

    def reset(self, prompt_ids):
        self.seen = []  # reassigned, so that a forked drafter keeps its own

    def propose(self, ctx):
        self.seen.append(None if ctx.features is None else ctx.features.clone())
        return super().propose(ctx)


def drafter_for(kind: str, seed: int):
    if kind == "lookup":
        return PromptLookupDrafter(min_ngram=1, max_branches=2)
    if kind == "ar":
        return NoDrafter()
    return FeatureRecorder({"tree01": (0, 1), "tree2": (2,)}[kind], seed)


# (prompt length, max new tokens, drafter kind, step at which it joins)
REQUESTS = [(12, 40, "lookup", 0), (3, 25, "tree01", 0), (30, 10, "ar", 1), (1, 30, "tree2", 3),
            (21, 35, "lookup", 3), (7, 20, "tree01", 6), (16, 28, "tree2", 9)]


def run_requests(decoder: BatchDecoder) -> tuple[dict, list[int]]:
    """Decode REQUESTS, each joining at its step while a slot is free; returns the sequences and batch sizes."""
    pending = [(i, *r) for i, r in enumerate(REQUESTS)]
    seqs, step, sizes = {}, 0, []
    while pending or decoder.active:
        for item in [p for p in pending if p[4] <= step and decoder.free]:
            i, length, max_new, kind, _ = item
            if not decoder.free:
                break
            seqs[i] = decoder.add(prompt(length, i), drafter_for(kind, i), max_new_tokens=max_new)
            pending.remove(item)
        sizes.append(len(decoder.active))
        decoder.step()
        step += 1
    return seqs, sizes


def assert_batch_1_outputs(seqs: dict, reference: Target) -> None:
    """Each request's tokens, statistics and drafter features are those of its own batch-1 decoding."""
    for i, (length, max_new, kind, _) in enumerate(REQUESTS):
        got = seqs[i].result
        want_drafter = drafter_for(kind, i)
        want = SpeculativeDecoder(reference, want_drafter).generate(prompt(length, i), max_new)
        plain = SpeculativeDecoder(reference, NoDrafter()).generate(prompt(length, i), max_new)
        assert got.tokens == want.tokens == plain.tokens, f"request {i}"
        assert got.stats.stop_reason == want.stats.stop_reason == "length"
        # same drafts, same verdicts: the statistics agree step for step
        assert got.stats.accepted_hist == want.stats.accepted_hist and got.stats.target_calls == want.stats.target_calls
        if kind.startswith("tree"):  # the features each drafter saw: its own layers, its own sequence
            seen, want_seen = seqs[i].drafter.seen, want_drafter.seen
            assert len(seen) == len(want_seen)
            for a, b in zip(seen, want_seen, strict=False):
                assert (a is None) == (b is None)
                if a is not None:
                    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert sum(sum(k * n for k, n in s.stats.accepted_hist.items()) for s in seqs.values()) > 10  # drafts accepted


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_every_sequence_of_a_continuous_batch_gets_its_batch_1_greedy_output(compiled):
    from torch._dynamo.utils import counters

    target, reference = make_target(compile=compiled), make_target()
    decoder = BatchDecoder(target, max_batch=4, max_rows=None)  # no cap: the same trees as batch 1
    assert (decoder.engine.compiled is not None) == compiled
    graphs = counters["stats"]["unique_graphs"]
    seqs, sizes = run_requests(decoder)
    assert max(sizes) == 4 and decoder.forwards < sum(s.stats.target_calls for s in seqs.values())
    assert counters["stats"]["unique_graphs"] == graphs  # every batch size and tree size on the graphs made at load
    assert_batch_1_outputs(seqs, reference)


def test_a_continuous_batch_on_quantized_weights_gets_its_batch_1_greedy_output(monkeypatch):
    """int4 weights, with calls of up to 8 rows on the planes' kernel (as in bf16) and larger ones on the full
    weight: every request still gets the output it gets alone, which is the quantized target's plain greedy."""
    from blockdraft.model import linear

    monkeypatch.setitem(linear.PLANE_MAX_ROWS, (4, torch.float32), 8)
    target, reference = make_target(weights="int4"), make_target(weights="int4")
    seqs, sizes = run_requests(BatchDecoder(target, max_batch=4, max_rows=None))
    assert max(sizes) == 4
    assert_batch_1_outputs(seqs, reference)


def test_prompts_prefilled_in_chunks_inside_the_steps_keep_every_output():
    """Chunks of 4 tokens: the 30- and 21-token prompts take several steps to get in, their features come
    chunk by chunk, and only a prompt arriving while nothing decodes is prefilled in a pass of its own."""
    target, reference = make_target(), make_target()
    decoder = BatchDecoder(target, max_batch=4, max_rows=None, prefill_chunk=4)
    alone, carried = [], []
    real_forward, real_carry = decoder.engine.forward, decoder.engine.forward_with_prompt

    def forward(first, tokens, *args, **kw):
        if kw.get("last_logits_only"):
            alone.append(len(decoder.decoding))
        return real_forward(first, tokens, *args, **kw)

    def carry(*args):
        carried.append(len(args[-1]))
        return real_carry(*args)

    decoder.engine.forward, decoder.engine.forward_with_prompt = forward, carry
    seqs, _ = run_requests(decoder)
    assert alone and set(alone) == {0}  # a pass of its own only when nothing was decoding
    assert len(carried) >= 10 and max(carried) == 4  # the rest came in 4-token chunks inside steps
    assert_batch_1_outputs(seqs, reference)


def test_prefill_chunk_must_be_positive():
    with pytest.raises(BlockdraftError, match="prefill_chunk"):
        BatchDecoder(make_target(), max_batch=2, prefill_chunk=0)


def test_stop_strings_and_the_context_end_as_in_batch_1():
    target, reference = make_target(), make_target()
    decoder = BatchDecoder(target, max_batch=3)
    plain = SpeculativeDecoder(reference, NoDrafter()).generate(prompt(10, 0), 30)
    stop = plain.text[6:8]
    long_prompt = prompt(250, 1)  # the tiny model's context holds 256 tokens
    streamed = {}
    a = decoder.add(prompt(10, 0), PromptLookupDrafter(), stop_strings=(stop,), max_new_tokens=30,
                    on_tokens=lambda ids, flags: streamed.setdefault("a", []).extend(zip(ids, flags, strict=False)))
    b = decoder.add(long_prompt, PromptLookupDrafter(), max_new_tokens=30)
    c = decoder.add(prompt(5, 2), NoDrafter(), max_new_tokens=40)
    while decoder.active:
        decoder.step()
    want_a = SpeculativeDecoder(reference, PromptLookupDrafter()).generate(prompt(10, 0), 30, stop_strings=(stop,))
    want_b = SpeculativeDecoder(reference, PromptLookupDrafter()).generate(long_prompt, 30)
    want_c = SpeculativeDecoder(reference, NoDrafter()).generate(prompt(5, 2), 40)
    assert (a.result.text, a.result.tokens, a.result.stats.stop_reason) == \
        (want_a.text, want_a.tokens, "stop_string")
    assert len(b.result.tokens) == 6 and b.result.tokens == want_b.tokens and b.result.stats.stop_reason == "length"
    assert c.result.tokens == want_c.tokens
    assert [t for t, _ in streamed["a"]] == a.result.tokens
    drafts = sum(k * n for k, n in a.result.stats.accepted_hist.items())
    assert sum(f for _, f in streamed["a"]) <= drafts  # the flags mark accepted drafts, never more


def test_a_removed_sequence_frees_its_slot_for_the_next():
    target = make_target()
    decoder = BatchDecoder(target, max_batch=2)
    a = decoder.add(prompt(8, 0), NoDrafter(), max_new_tokens=50)
    b = decoder.add(prompt(9, 1), NoDrafter(), max_new_tokens=20)
    with pytest.raises(BlockdraftError, match="full"):
        decoder.add(prompt(5, 2), NoDrafter())
    decoder.step()
    decoder.remove(a)  # e.g. its client went away: b moves to slot 0
    assert b.slot == 0 and decoder.free == 1
    c = decoder.add(prompt(6, 3), NoDrafter(), max_new_tokens=20)
    while decoder.active:
        decoder.step()
    reference = make_target()
    for seq, (n, s, m) in ((b, (9, 1, 20)), (c, (6, 3, 20))):
        assert seq.result.tokens == SpeculativeDecoder(reference, NoDrafter()).generate(prompt(n, s), m).tokens


def test_fork_shares_weights_but_not_state():
    from blockdraft.trees.drafter import TreeDrafter

    class Lattice(PromptLookupDrafter):
        def lattice(self, ctx):
            return None

    base = Lattice()
    tree = TreeDrafter(base, "best", budget=4)
    twin = tree.fork()
    assert twin is not tree and twin.base is not tree.base and twin.base.num_tokens == base.num_tokens
    twin.reset([1, 2, 3])
    twin.base.gain[2] = 0.0
    assert tree.base.gain[2] != 0.0


@pytest.mark.parametrize("stage", ["reset", "propose", "sampling"])
def test_a_failure_of_one_sequence_ends_only_that_sequence(stage):
    """Its drafter raising in reset (as it starts decoding) or in propose, or its distribution turning NaN (a
    temperature that overflows the logits): that sequence ends with the error, in the middle of the batch (the
    others' slots move), and the others' outputs are still their own."""
    from blockdraft.verify import SamplingParams

    class Broken(NoDrafter):
        def reset(self, prompt_ids):
            if stage == "reset":
                raise RuntimeError("drafter bug")

        def propose(self, ctx):
            if stage == "propose" and len(ctx.tokens) > 8:
                raise RuntimeError("drafter bug")
            return super().propose(ctx)

    decoder = BatchDecoder(make_target(), max_batch=3)
    good = [decoder.add(prompt(7, 1), NoDrafter(), max_new_tokens=20)]
    params = SamplingParams(temperature=1e-300) if stage == "sampling" else None
    bad = decoder.add(prompt(6, 0), Broken(), params, max_new_tokens=20)
    good.append(decoder.add(prompt(5, 2), NoDrafter(), max_new_tokens=20))
    ended = []
    while decoder.active:
        ended += decoder.step()
    assert bad in ended and bad.result is None
    if stage == "sampling":
        assert isinstance(bad.error, BlockdraftError) and "not finite" in str(bad.error)
    else:
        assert isinstance(bad.error, RuntimeError) and str(bad.error) == "drafter bug"
    for seq, (n, seed) in zip(good, [(7, 1), (5, 2)], strict=True):
        want = SpeculativeDecoder(make_target(), NoDrafter()).generate(prompt(n, seed), 20)
        assert seq.error is None and seq.result.tokens == want.tokens


def test_fork_reaches_drafters_inside_containers():
    from blockdraft.drafters.hybrid import HybridDrafter
    from blockdraft.drafters.suffix import SuffixDrafter

    learned = FeatureRecorder((1,), seed=0)
    hybrid = HybridDrafter({"suffix": SuffixDrafter()}, ("treeflash", learned))
    twin = hybrid.fork()
    assert twin.retrieval["suffix"] is not hybrid.retrieval["suffix"]
    assert twin.learned[0] == "treeflash" and twin.learned[1] is not learned
    assert twin.calibrator is hybrid.calibrator  # learnt across generations on purpose: shared


@pytest.mark.parametrize("method", ["suffix", "recycle", "hybrid:sources=suffix+recycle:cost=off",
                                    "lookup:max_branches=3"])
def test_retrieval_methods_in_a_batch_keep_the_greedy_output(method):
    from blockdraft.methods import make_drafter

    target, reference = make_target(), make_target()
    drafter = make_drafter(method, target)
    decoder = BatchDecoder(target, max_batch=3)
    prompts = [prompt(12, 0) * 2, prompt(5, 1) * 3, prompt(20, 2)]
    seqs = [decoder.add(p, drafter, max_new_tokens=30) for p in prompts]
    while decoder.active:
        decoder.step()
    for p, seq in zip(prompts, seqs, strict=True):
        assert seq.error is None
        assert seq.result.tokens == SpeculativeDecoder(reference, NoDrafter()).generate(p, 30).tokens
    assert sum(sum(k * n for k, n in s.stats.accepted_hist.items()) for s in seqs) > 0


@pytest.mark.parametrize("method", ["suffix", "hybrid:sources=suffix+recycle:cost=off"])
def test_drafters_learn_from_earlier_requests_in_a_batch_as_in_single_decoding(method):
    """The feedback hook (Drafter.on_step / on_finish) is called by the shared sequence code: a request repeated
    after the first one finished is drafted from the first's output, in a batch exactly as alone."""
    from blockdraft.methods import make_drafter

    target, reference = make_target(), make_target()
    request = prompt(9, 7)
    single = SpeculativeDecoder(reference, make_drafter(method, reference))
    alone = [single.generate(request, 40) for _ in range(2)]
    batched_drafter, decoder = make_drafter(method, target), BatchDecoder(target, max_batch=3, max_rows=None)
    batched = []
    # one after the other through forks of one drafter: alone in the batch (as a server's lone requests),
    # then among other requests
    for companions in ([], [], [prompt(6, 8), prompt(11, 9)]):
        seqs = [decoder.add(p, batched_drafter, max_new_tokens=40) for p in [request] + companions]
        while decoder.active:
            decoder.step()
        assert all(seq.error is None for seq in seqs)
        batched.append(seqs[0].result)
    assert all(got.tokens == alone[0].tokens for got in batched + alone)
    # the second time, the whole first output is drafted back: far fewer target passes, in both
    assert alone[1].stats.target_calls < alone[0].stats.target_calls / 2
    for got in batched[1:]:
        assert got.stats.target_calls < batched[0].stats.target_calls / 2
    # the same drafts and verdicts as single decoding, step for step
    assert [r.stats.accepted_hist for r in batched[:2]] == [r.stats.accepted_hist for r in alone]


def test_max_rows_caps_each_tree_by_the_batch_size_and_keeps_the_output():
    from drafters_for_tests import RandomTreeDrafter

    target, reference = make_target(), make_target()
    sizes = []
    decoder = BatchDecoder(target, max_batch=4, max_rows=8)
    real_forward = decoder.engine.forward

    def recording_forward(first, tokens, *args, **kw):
        if len(tokens) > 1 or not kw.get("last_logits_only"):
            sizes.append((len(tokens), max(len(t) for t in tokens)))
        return real_forward(first, tokens, *args, **kw)

    decoder.engine.forward = recording_forward
    drafter = RandomTreeDrafter(target.vocab_size, max_nodes=12, seed=0)
    prompts = [prompt(6, i) for i in range(4)]
    seqs = [decoder.add(p, drafter, max_new_tokens=16) for p in prompts]
    while decoder.active:
        decoder.step()
    for p, seq in zip(prompts, seqs, strict=True):
        assert seq.result.tokens == SpeculativeDecoder(reference, NoDrafter()).generate(p, 16).tokens
    verify = [(b, n) for b, n in sizes if b > 1]
    assert verify and all(n <= 8 // b for b, n in verify)  # 4 sequences: trees of 2 nodes at most
