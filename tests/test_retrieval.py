"""Training-free drafters (suffix, rest) and the hybrid: the suffix index against brute force, the
frequency trie against hand counts, the datastore's format and checks, the global tree, the
hybrid's calibration, and greedy losslessness in float32."""

import json
import random

import numpy as np
import pytest
import torch

from blockdraft import SpeculativeDecoder, methods
from blockdraft.drafters import DraftContext, Drafter, SuffixDrafter
from blockdraft.drafters.hybrid import AcceptanceCalibrator, HybridDrafter, LearnedGate
from blockdraft.drafters.rest import Datastore
from blockdraft.drafters.suffix_index import SuffixIndex, frequency_trie
from blockdraft.errors import BlockdraftError
from blockdraft.methods import make_drafter
from blockdraft.trees import DraftTree


@pytest.fixture(autouse=True)
def shipped(checkpoints, monkeypatch):
    monkeypatch.setattr(methods, "CHECKPOINTS", checkpoints)  # rest, treeflash... load by their bare names


def brute_force_match(docs, context, max_length):
    """The longest suffix of context (<= max_length) occurring in a document, and its occurrence count."""
    for n in range(min(max_length, len(context)), 0, -1):
        pattern = context[-n:]
        count = sum(doc[i:i + n] == pattern for doc in docs for i in range(len(doc) - n + 1))
        if count:
            return n, count
    return 0, 0


def test_longest_suffix_match_agrees_with_brute_force():
    rng = random.Random(0)
    docs = [[rng.randrange(5) for _ in range(rng.randint(5, 40))] for _ in range(12)]
    index = SuffixIndex.from_documents(docs, separator=-1)
    for _ in range(200):
        context = [rng.randrange(6) for _ in range(rng.randint(1, 12))]  # token 5 never occurs
        length, lo, hi = index.match(context, max_length=8)
        assert (length, hi - lo if length else 0) == brute_force_match(docs, context, 8), context


def test_a_match_never_spans_two_documents():
    index = SuffixIndex.from_documents([[1, 2, 3], [4, 5, 6]], separator=-1)
    assert index.match([3, 4], 8)[0] == 1  # "3 4" only exists across the separator
    cand = index.candidates([9, 2], depth=5)
    assert cand.tokens == [3] and cand.match_length == 1  # the continuation stops at the document's end


def test_the_context_end_is_not_its_own_match():
    tokens = [7, 1, 2, 8, 1, 2]
    local = SuffixIndex(np.array(tokens), separator=-1)
    cand = local.candidates(tokens, depth=3, exclude_end=True)
    assert cand.match_length == 2 and cand.tokens == [8, 1, 2]  # what followed the earlier "1 2"
    assert SuffixIndex(np.array([5, 6]), -1).candidates([5, 6], exclude_end=True).match_length == 0


def test_frequency_trie_counts_by_hand():
    conts = [[1, 2, 3], [1, 2, 4], [1, 5], [6]]
    cand = frequency_trie(conts, occurrences=4, match_length=2, min_prob=0.0, max_nodes=10)
    nodes = {tuple(_path(cand, i)): p for i, p in enumerate(cand.prob)}
    assert nodes == {(1,): 0.75, (1, 2): 0.5, (1, 2, 3): 0.25, (1, 2, 4): 0.25, (1, 5): 0.25, (6,): 0.25}
    assert cand.prob == sorted(cand.prob, reverse=True)
    assert all(p < i for i, p in enumerate(cand.parents))  # parents first
    small = frequency_trie(conts, 4, 2, min_prob=0.3, max_nodes=10)
    assert [tuple(_path(small, i)) for i in range(len(small))] == [(1,), (1, 2)]
    assert len(frequency_trie(conts, 4, 2, 0.0, max_nodes=3)) == 3


def _path(cand, i):
    path = []
    while i >= 0:
        path.append(cand.tokens[i])
        i = cand.parents[i]
    return path[::-1]


def test_datastore_round_trip_and_its_checks(tiny, tmp_path):
    from blockdraft.train.datastore import build_datastore
    from conftest import conversations

    store = build_datastore(tiny, tmp_path / "ds", conversations(20))
    assert store.tokens.dtype == np.uint16  # a small vocabulary fits 16 bits
    loaded = Datastore.load(tmp_path / "ds", tiny)
    context = tiny.encode("tell me more", chat_template=False)
    assert loaded.match(context) == store.match(context) and store.match(context)[0] > 0
    config = json.loads((tmp_path / "ds" / "config.json").read_text())
    assert config["kind"] == "datastore" and config["conversations"] == 20

    other = type(tiny)(tiny.model, tiny.tokenizer, name="another-model")
    with pytest.raises(BlockdraftError, match="built for target 'tiny-llama'"):
        Datastore.load(tmp_path / "ds", other)
    np.save(tmp_path / "ds" / "suffix_array.npy", store.sa[:-3])
    with pytest.raises(BlockdraftError, match="corrupt"):
        Datastore.load(tmp_path / "ds", tiny)
    (tmp_path / "ds" / "tokens.npy").write_bytes(b"not numpy")
    with pytest.raises(BlockdraftError, match="not a readable datastore"):
        Datastore.load(tmp_path / "ds", tiny)


def test_the_global_tree_drafts_what_an_earlier_request_generated(tiny):
    prompt = tiny.encode("now tell me", chat_template=False)
    calls = {}
    for global_tree in (True, False):
        decoder = SpeculativeDecoder(tiny, SuffixDrafter(global_tree=global_tree))
        first = decoder.generate(prompt, 32)
        second = decoder.generate(prompt, 32)
        assert second.tokens == first.tokens
        calls[global_tree] = (first.stats.target_calls, second.stats.target_calls)
    assert calls[False][1] == calls[False][0]  # nothing carried over
    assert calls[True][1] < calls[True][0] / 2  # the whole earlier output was drafted back
    drafter = SuffixDrafter()
    out = SpeculativeDecoder(tiny, drafter).generate(prompt, 8)
    assert drafter.earlier.outputs == [out.tokens]  # added as the generation ended, whole
    twin = drafter.fork()
    drafter.forget()  # clears what the forks share too
    assert twin.earlier.outputs == [] and twin.earlier.index is None


@pytest.mark.parametrize("method", ["suffix", "rest", "recycle", "hybrid", "hybrid:sources=suffix,recycle",
                                    "hybrid:sources=suffix+rest+hydra", "hybrid:sources=rest:cost=off",
                                    "hybrid:sources=suffix,treeflash:skip=0.5", "hybrid:sources=suffix+bpd-tree"])
def test_float32_output_equals_ar(tiny, method):
    prompts = [tiny.encode(p, chat_template=False) for p in ("tell me more now\n", "abcab abcab abc")]
    drafter = make_drafter(method, tiny)
    drafted = 0
    for prompt in prompts:
        ref = SpeculativeDecoder(tiny, make_drafter("ar", tiny)).generate(prompt, 40).tokens
        res = SpeculativeDecoder(tiny, drafter).generate(prompt, 40)
        assert res.tokens == ref
        drafted += res.stats.tree_nodes - res.stats.target_calls
    assert drafted > 0  # trees were verified, not only roots


def test_calibration_follows_what_the_target_accepts():
    cal = AcceptanceCalibrator()
    key = cal.key("suffix", 0.9, 3)
    assert cal.estimate(key, 0.9) == pytest.approx(0.9)  # starts at the source's own estimate
    for i in range(200):
        cal.update(key, i % 5 == 0)  # the target accepts only 20% of these nodes
    assert cal.estimate(key, 0.9) == pytest.approx(0.2, abs=0.05)
    assert cal.key("suffix", 0.9, 3) != cal.key("suffix", 0.9, 12) != cal.key("rest", 0.9, 3)


class _FixedSource(Drafter):
    """A retrieval source proposing one fixed trie every step."""

    depth = 8

    def __init__(self, tokens, parents, prob, length=4):
        from blockdraft.drafters.suffix_index import Candidates

        self.cand = Candidates(tokens, parents, prob, length)

    def candidates(self, ctx, depth):
        return self.cand


def test_hybrid_merges_sources_best_first_and_learns_from_the_accepted_path():
    a = _FixedSource([10, 11, 12], [-1, 0, 1], [0.9, 0.8, 0.7])
    b = _FixedSource([10, 13], [-1, 0], [0.6, 0.5])
    hybrid = HybridDrafter({"a": a, "b": b}, budget=8)
    tree = hybrid.propose(DraftContext([1, 2, 3], None, 8))
    paths = sorted(tuple(tree.tokens[tree.path_to(i)[1:]].tolist()) for i in range(1, len(tree)))
    assert paths == [(10,), (10, 11), (10, 11, 12), (10, 13)]  # shared prefix "10" verified once
    assert tree.tokens[1:].tolist() == [10, 11, 12, 13]  # by path score: 0.9 (a), 0.8, 0.7, then 0.5 (b)
    # The target accepted 10 and 13 (then a bonus token): 10, 13 accepted; 11 rejected; 12 unseen.
    hybrid.on_step(tree, torch.zeros(len(tree), 16), [0, 1, 4])
    cal = hybrid.calibrator
    seen = {k: (cal.accepted[k], cal.seen[k]) for k in cal.seen}
    assert seen[cal.key("a", 0.9, 4)] == (1, 1) and seen[cal.key("b", 0.6, 4)] == (1, 1)
    assert seen[cal.key("a", 0.8 / 0.9, 4)] == (0, 1)  # node 11: its parent accepted, itself not
    assert seen[cal.key("b", 0.5 / 0.6, 4)] == (1, 1)
    assert sum(cal.seen.values()) == 4  # node 12 (under the rejected 11) taught nothing


def test_hybrid_sends_nothing_when_nothing_pays_for_its_cost():
    weak = _FixedSource([10, 11], [-1, 0], [0.05, 0.04], length=1)
    curve = {0: 1.0, 1: 1.3, 2: 1.35, 64: 2.0}
    tree = HybridDrafter({"weak": weak}, budget=8, cost_curve=curve).propose(DraftContext([1, 2], None, 8))
    assert len(tree) == 1
    strong = _FixedSource([10, 11], [-1, 0], [0.95, 0.9], length=6)
    tree = HybridDrafter({"strong": strong}, budget=8, cost_curve=curve).propose(DraftContext([1, 2], None, 8))
    assert len(tree) == 3


def test_hybrid_skips_the_learned_drafter_on_strong_matches_and_stays_in_step(tiny):
    prompt = tiny.encode("abcab abcab abcab abcab abc", chat_template=False)
    ref = SpeculativeDecoder(tiny, make_drafter("ar", tiny)).generate(prompt, 40).tokens
    for skip, runs_all in ((1e9, True), (0.5, False)):
        drafter = make_drafter(f"hybrid:sources=suffix,treeflash:skip={skip}:gate=false", tiny)
        res = SpeculativeDecoder(tiny, drafter).generate(prompt, 40)
        assert res.tokens == ref  # the block drafter's context stays in step while skipped
        assert (drafter.learned_runs == drafter.steps) == runs_all, (drafter.learned_runs, drafter.steps)


def test_gate_runs_the_learned_drafter_only_where_its_gain_pays_for_its_time():
    gate = LearnedGate()
    assert gate.should_run(0.0)  # nothing timed yet
    gate.time(learned_s=0.005, rest_s=0.025)  # it costs 0.2x of a step without it
    for _ in range(40):
        gate.record(0.1, retrieved=0, gain=1)  # weak retrieval: the learned drafter adds a token a step
        gate.record(3.0, retrieved=3, gain=0)  # strong retrieval: it adds nothing
    assert all(gate.should_run(0.1) for _ in range(20))
    runs = [gate.should_run(3.0) for _ in range(4 * LearnedGate.EXPLORE)]
    assert sum(runs) == 4 and runs[LearnedGate.EXPLORE - 1]  # skipped, but retried every EXPLORE-th step
    gate.time(learned_s=0.0, rest_s=0.030)  # a drafter that costs nothing always pays
    for _ in range(30):
        gate.time(learned_s=0.0)
    assert gate.should_run(3.0)


def test_gate_turns_off_a_learned_drafter_dearer_than_the_rest_of_a_step():
    """A drafter that takes longer than verification itself (2.5x here) pays only if it more than doubles the
    accepted tokens: adding half a token a step, it is skipped but for the exploring steps."""
    gate = LearnedGate()
    gate.time(learned_s=0.050, rest_s=0.020)
    for _ in range(40):
        gate.record(0.1, retrieved=0, gain=0.5)
    runs = [gate.should_run(0.1) for _ in range(4 * LearnedGate.EXPLORE)]
    assert sum(runs) == 4
    for _ in range(40):  # the same drafter adding four tokens a step pays for itself
        gate.record(1.5, retrieved=0, gain=4)
    assert all(gate.should_run(1.5) for _ in range(10))


@pytest.mark.parametrize("learned_ms,runs", [(None, "every step"), (0, "every step"), (9, "under half")])
def test_gate_runs_the_learned_drafter_by_its_measured_time_and_stays_lossless(tiny, virtual_clock, monkeypatch,
                                                                                learned_ms, runs):
    """The hybrid times the learned drafter and its steps itself, here on a virtual clock: every verification pass
    takes 10 ms and every learned proposal `learned_ms`, whatever this machine's speed or load. One that costs
    nothing always pays; one that costs 9 ms, nearly a step's worth, must add about a token per step beyond what
    retrieval finds, and the gate soon runs it only where retrieval is weak or to explore (None: no gate, it runs
    every step). The output is the target's own either way."""
    from blockdraft.drafters import hybrid as hybrid_module

    virtual_clock.install(monkeypatch, hybrid_module)
    prompt = tiny.encode("the cat sat on the mat and the dog sat on the log", chat_template=False)
    ref = SpeculativeDecoder(tiny, make_drafter("ar", tiny)).generate(prompt, 64).tokens
    verify = tiny.verify

    def ten_ms_verify(tree):
        virtual_clock.advance(0.010)
        return verify(tree)

    monkeypatch.setattr(tiny, "verify", ten_ms_verify)
    drafter = make_drafter(f"hybrid:sources=suffix,treeflash:skip=1e9:gate={str(learned_ms is not None).lower()}", tiny)
    learned = drafter.learned[1]
    scored_tree = learned.scored_tree

    def timed_scored_tree(ctx):
        virtual_clock.advance((learned_ms or 0) / 1000)
        return scored_tree(ctx)

    monkeypatch.setattr(learned, "scored_tree", timed_scored_tree)
    assert SpeculativeDecoder(tiny, drafter).generate(prompt, 64).tokens == ref
    if runs == "every step":
        assert drafter.learned_runs == drafter.steps
    else:
        assert drafter.learned_runs < 0.5 * drafter.steps, (drafter.learned_runs, drafter.steps)
        assert drafter.gate.learned_s == pytest.approx(learned_ms / 1000)  # as measured on the virtual clock


def test_bad_hybrid_options_are_refused(tiny):
    with pytest.raises(BlockdraftError, match="unknown or repeated source 'lookahead'"):
        make_drafter("hybrid:sources=suffix,lookahead", tiny)
    with pytest.raises(BlockdraftError, match="2 sources but 1 weights"):
        make_drafter("hybrid:sources=suffix,rest:weights=1", tiny)
    with pytest.raises(BlockdraftError, match="unknown or repeated source 'hydra'"):
        make_drafter("hybrid:sources=treeflash,hydra", tiny)
    with pytest.raises(BlockdraftError, match="option.s. module need a learned source"):
        make_drafter("hybrid:sources=suffix:module=x", tiny)
    with pytest.raises(BlockdraftError, match="bad option for method 'hybrid'"):
        make_drafter("hybrid:sources=suffix,treeflash:nonsense=1", tiny)


def test_hybrid_hands_other_options_to_its_learned_source(tiny, checkpoints, tmp_path):
    """hybrid:module=DIR (or checkpoint=DIR) picks the learned drafter's own files, e.g. a candidate module."""
    import shutil

    shutil.copytree(checkpoints / tiny.name / "treeflash", tmp_path / "module")
    drafter = make_drafter(f"hybrid:sources=suffix,treeflash:module={tmp_path / 'module'}:parents=2", tiny)
    assert drafter.learned[1].parents == 2
    with pytest.raises(BlockdraftError, match="is not a drafter checkpoint"):
        make_drafter(f"hybrid:sources=suffix,treeflash:module={tmp_path / 'nowhere'}", tiny)


def test_propose_returns_a_valid_tree_at_the_depth_limit(tiny):
    for method in ("suffix", "rest", "recycle", "hybrid"):
        drafter = make_drafter(method, tiny)
        drafter.reset([3, 4, 5])
        tree = drafter.propose(DraftContext([3, 4, 5, 3, 4], None, 0))
        assert isinstance(tree, DraftTree) and len(tree) == 1, method


def test_recycling_keeps_the_target_top_k_per_token_and_drafts_from_it(tiny):
    from blockdraft.drafters.recycle import RecycleDrafter

    drafter = RecycleDrafter(tiny.vocab_size, k=3, budget=6, depth=3, min_prob=0.0)
    tree = DraftTree(torch.tensor([5, 6, 7]), torch.tensor([-1, 0, 0]))
    logits = torch.full((3, tiny.vocab_size), -10.0)
    logits[0, [8, 9, 10]] = torch.tensor([3.0, 2.0, 1.0])
    logits[1, [5, 11, 12]] = torch.tensor([2.0, 1.0, 0.0])
    logits[2, [13, 14, 15]] = torch.tensor([1.0, 0.5, 0.0])
    drafter.on_step(tree, logits, [0])
    assert drafter.next_tokens[5].tolist() == [8, 9, 10] and drafter.next_tokens[6].tolist() == [5, 11, 12]
    assert drafter.next_probs[5].sum() < 1 and drafter.next_probs[5][0] > drafter.next_probs[5][1]
    tokens, parents, probs = drafter.candidates(6, depth=3)
    assert tokens[0] == 5 and parents[0] == -1  # 6 -> 5 is the most likely step
    assert probs == sorted(probs, reverse=True) and all(p < i for i, p in enumerate(parents))
    # by path probability: 6>5 .67, 6>5>8 .44, 6>11 .24, 6>5>9 .16, 6>12 .09, 6>5>10 .06 (8 has no row yet)
    assert tokens == [5, 8, 11, 9, 12, 10] and parents == [-1, 0, -1, 0, -1, 0]
    p = {(tokens[parents[i]] if parents[i] >= 0 else 6, tokens[i]): probs[i] for i in range(len(tokens))}
    assert p[(5, 8)] == pytest.approx(float(drafter.next_probs[6][0] * drafter.next_probs[5][0]))


def test_recycling_drafts_a_repeated_generation_almost_entirely(tiny):
    prompt = tiny.encode("tell me more now\n", chat_template=False)
    decoder = SpeculativeDecoder(tiny, make_drafter("recycle", tiny))
    first, second = decoder.generate(prompt, 32), decoder.generate(prompt, 32)
    assert second.tokens == first.tokens
    assert second.stats.target_calls < first.stats.target_calls  # the table kept what the target predicted


def test_hybrid_trees_respect_the_budget_and_are_prefix_closed():
    rng = random.Random(1)
    for _ in range(40):
        sources = {}
        for s in range(rng.randint(1, 3)):
            conts = [[rng.randrange(4) for _ in range(rng.randint(1, 5))] for _ in range(rng.randint(1, 8))]
            cand = frequency_trie(conts, len(conts), rng.randint(1, 8), 0.0, 64)
            sources[f"s{s}"] = _FixedSource(cand.tokens, cand.parents, cand.prob, cand.match_length)
        budget, max_depth = rng.randint(1, 12), rng.randint(1, 6)
        tree = HybridDrafter(sources, budget=budget).propose(DraftContext([1, 2, 3], None, max_depth))
        assert len(tree) <= budget + 1
        paths = [tuple(tree.tokens[tree.path_to(i)[1:]].tolist()) for i in range(len(tree))]
        assert len(set(paths)) == len(paths)  # no branch twice: sources' common prefixes merged
        assert all(p[:-1] in paths for p in paths[1:])  # every node's parent path is in the tree
        assert int(tree.depth.max()) <= max_depth


def test_candidates_agree_with_brute_force_continuation_counts():
    rng = random.Random(3)
    docs = [[rng.randrange(4) for _ in range(rng.randint(5, 30))] for _ in range(10)]
    index = SuffixIndex.from_documents(docs, separator=-1)
    for _ in range(100):
        context = [rng.randrange(4) for _ in range(rng.randint(1, 6))]
        length, _ = brute_force_match(docs, context, 8)
        cand = index.candidates(context, max_length=8, depth=3, max_occurrences=10**6, max_nodes=10**6)
        assert cand.match_length == length
        if not length:
            assert len(cand) == 0
            continue
        pattern, counts, occurrences = context[-length:], {}, 0
        for doc in docs:
            for i in range(len(doc) - length + 1):
                if doc[i:i + length] == pattern:
                    occurrences += 1
                    cont = doc[i + length:i + length + 3]
                    for d in range(1, len(cont) + 1):
                        counts[tuple(cont[:d])] = counts.get(tuple(cont[:d]), 0) + 1
        got = {tuple(_path(cand, i)): p for i, p in enumerate(cand.prob)}
        assert got == pytest.approx({k: v / occurrences for k, v in counts.items()})


def test_hybrid_defaults_to_the_learned_drafter_that_ships_for_the_target(tiny, tmp_path, monkeypatch):
    """hydra where it ships (the default target), else treeflash, else recycle: a new target's `hybrid` runs."""
    from blockdraft import methods

    monkeypatch.setattr(methods, "CHECKPOINTS", tmp_path)
    assert methods.default_hybrid_sources(tiny) == "suffix+recycle"  # nothing ships
    for shipped, expected in (("treeflash", "suffix+treeflash"), ("hydra", "suffix+hydra")):
        (tmp_path / tiny.name / shipped).mkdir(parents=True)
        (tmp_path / tiny.name / shipped / "config.json").write_text("{}")
        assert methods.default_hybrid_sources(tiny) == expected
    hybrid = make_drafter("hybrid:cost=off", methods.Target(tiny.model, tiny.tokenizer, name="another"))
    assert sorted(hybrid.retrieval) == ["recycle", "suffix"] and hybrid.learned is None
