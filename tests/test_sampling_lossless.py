"""Speculative sampling reproduces the target's distribution (chi-square), on chains and trees.

Two levels: a toy Markov target (exact probabilities, many samples, every acceptor) and the
real decoding loop on a tiny random Llama (depth-3 trees, KV-cache commits between steps).
Deliberately broken acceptors must fail the same tests, which shows the tests have teeth.
"""

import itertools
from collections import Counter

import pytest
import torch
from scipy.stats import chisquare

from blockdraft import DraftContext, SamplingParams, SpeculativeDecoder, Target
from blockdraft.verify import RejectionAcceptor, SampleAndWalkAcceptor, TypicalAcceptor
from blockdraft.verify.base import child_with_token, sample

from conftest import tiny_llama
from drafters_for_tests import RandomTreeDrafter, SampledChainDrafter, SampledTreeDrafter

V = 6
FILTERED = SamplingParams(0.7, top_k=4, top_p=0.9)


class FreshBonus:
    """The classic bug: when no child is kept, emit a fresh sample from p. Rejection sampling then
    forgets the residual; the walk throws away the sample that missed, so drafted tokens come out too often."""

    def choose(self, tree, node, logits, gen):
        child, token = super().choose(tree, node, logits, gen)
        return (child, token) if child is not None else (None, sample(self.params.probs(logits), gen))


class ForgetfulRejection(FreshBonus, RejectionAcceptor):
    pass


class ResampledBonusWalk(FreshBonus, SampleAndWalkAcceptor):
    pass


class UnfilteredWalk(SampleAndWalkAcceptor):
    """Applies the temperature but forgets top-k and top-p: emits tokens the target never would."""

    def choose(self, tree, node, logits, gen):
        token = sample(SamplingParams(self.params.temperature).probs(logits), gen)
        return child_with_token(tree, node, token), token


def outside_support(counts: dict, expected: dict) -> int:
    """Samples on keys the expected distribution gives probability zero (or does not list at all)."""
    return sum(c for key, c in counts.items() if expected.get(key, 0.0) <= 0.0)


def chi_square_p(counts: dict, expected: dict, n: int) -> float:
    """p-value of observed counts against expected probabilities; rare cells are pooled.

    Fails outright when a sample lies outside the support of `expected` (e.g. a token that
    top-k/top-p excludes): no p-value could excuse that.
    """
    assert sum(counts.values()) == n
    off = outside_support(counts, expected)
    assert off == 0, f"{off} of {n} samples fell outside the support of the target"
    obs, exp, pool_o, pool_e = [], [], 0, 0.0
    for key, prob in expected.items():
        if prob * n < 5:
            pool_o, pool_e = pool_o + counts.get(key, 0), pool_e + prob * n
        else:
            obs.append(counts.get(key, 0))
            exp.append(prob * n)
    if pool_e > 0:
        obs.append(pool_o)
        exp.append(pool_e)
    total = sum(exp)
    return chisquare(obs, [e * n / total for e in exp]).pvalue  # float rounding: make sums agree exactly


def markov_samples(acceptor, drafter, logit_table, n_runs, seed=0):
    """Run the decode loop against a toy order-1 Markov target: logits(node) = table[token(node)]."""
    gen = torch.Generator().manual_seed(seed)
    counts = {}
    for _ in range(n_runs):
        tokens = [0]
        while len(tokens) < 3:
            tree = drafter.propose(DraftContext(tokens, None, max_depth=8))
            acc = acceptor.accept(tree, logit_table[tree.tokens], gen)
            tokens += tree.tokens[acc.path[1:]].tolist() + [acc.bonus]
        key = tuple(tokens[1:3])
        counts[key] = counts.get(key, 0) + 1
    return counts


def markov_expected(params, logit_table):
    """Every pair of tokens with its probability, zero included (top-k/top-p exclude some)."""
    p = params.probs(logit_table)
    return {(a, b): float(p[0, a] * p[a, b]) for a, b in itertools.product(range(V), repeat=2)}


TABLE = 1.5 * torch.randn(V, V, generator=torch.Generator().manual_seed(7))
FAVOURED = [int(TABLE[0].argmax()), int(TABLE[1].argmax()), 3]

LOSSLESS_CASES = [
    ("walk", "tree", SamplingParams(1.0)),
    ("rejection", "tree", SamplingParams(1.0)),
    ("rejection", "sampled-chain", SamplingParams(1.0)),
    ("rejection", "tree", FILTERED),
    ("walk", "tree", FILTERED),
    ("walk", "sampled-chain", SamplingParams(1.3, top_p=0.8)),
]


def _drafter(kind, seed):
    if kind == "tree":
        return RandomTreeDrafter(V, max_nodes=7, seed=seed, favour=FAVOURED)
    return SampledChainDrafter(V, length=3, seed=seed)


def test_filtered_expectation_has_zeros():
    """The support check only bites if top-k/top-p really exclude tokens from the expected distribution."""
    expected = markov_expected(FILTERED, TABLE)
    assert len(expected) == V * V and sum(p == 0 for p in expected.values()) >= V * V // 2


@pytest.mark.parametrize("acceptor,kind,params", LOSSLESS_CASES)
def test_lossless_acceptors_match_target_distribution(acceptor, kind, params):
    cls = {"walk": SampleAndWalkAcceptor, "rejection": RejectionAcceptor}[acceptor]
    n = 6000
    counts = markov_samples(cls(params), _drafter(kind, 1), TABLE, n)
    assert chi_square_p(counts, markov_expected(params, TABLE), n) > 0.01


@pytest.mark.parametrize("broken,params", [(ForgetfulRejection, SamplingParams(1.0)),
                                           (TypicalAcceptor, SamplingParams(1.0)),
                                           (ResampledBonusWalk, SamplingParams(1.0)),
                                           (ResampledBonusWalk, FILTERED)])
def test_broken_or_lossy_acceptors_fail_the_same_test(broken, params):
    n = 6000
    counts = markov_samples(broken(params), _drafter("tree", 1), TABLE, n)
    assert chi_square_p(counts, markov_expected(params, TABLE), n) < 1e-4


def test_ignoring_top_k_top_p_is_caught_off_the_support():
    n = 6000
    counts = markov_samples(UnfilteredWalk(FILTERED), _drafter("tree", 1), TABLE, n)
    with pytest.raises(AssertionError, match="outside the support"):
        chi_square_p(counts, markov_expected(FILTERED, TABLE), n)


def test_rejection_with_draft_probabilities_accepts_more_than_walking():
    params = SamplingParams(1.0)
    q_match = SampledChainDrafter(V, length=3, seed=3)
    q_match.q = params.probs(TABLE[[0, 0, 0]])  # q close to the target's own first-step distribution

    def accepted(acc):
        gen = torch.Generator().manual_seed(0)
        total = 0
        for _ in range(2000):
            tree = q_match.propose(DraftContext([0], None, 8))
            total += acc.accept(tree, TABLE[tree.tokens], gen).accepted_drafts
        return total

    assert accepted(RejectionAcceptor(params)) > 1.2 * accepted(SampleAndWalkAcceptor(params))


# --- the real decoding loop on a tiny Llama ----------------------------------------------------

PROMPT, SCORED, DEPTH = [3, 5, 1, 4], 4, 3  # score the joint law of the first 4 tokens; trees 3 deep
N_LOOP = 1500  # generations per case (~4 ms each)


@pytest.fixture(scope="module")
def loop_target():
    model = tiny_llama(vocab_size=V, seed=2, logit_scale=25.0, layers=1)  # ~50 well-filled cells at T = 1
    model.generation_config.eos_token_id = None
    model.config.eos_token_id = None
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a model this small only pays for synchronisation with more threads
    yield Target(model, name="tiny")
    torch.set_num_threads(threads)


def exact_joint(model, params, length: int, prompt: list[int] = PROMPT) -> dict:
    """P(first `length` tokens after `prompt`) for every sequence the sampling parameters allow, by plain
    sequential forwards (sequences of probability zero are left out: a sample on one fails `chi_square_p`)."""
    joint = {(): 1.0}
    with torch.no_grad():
        for _ in range(length):
            prefixes = list(joint)
            p = params.probs(model(torch.tensor([prompt + list(k) for k in prefixes])).logits[:, -1])
            joint = {k + (t,): joint[k] * float(p[i, t]) for i, k in enumerate(prefixes)
                     for t in range(p.shape[-1]) if p[i, t] > 0}
    return joint


def loop_drafter(joint: dict, seed: int) -> SampledTreeDrafter:
    """Children sampled from the target's per-position marginals: often right, often wrong, 10 nodes, depth 3."""
    q = torch.zeros(DEPTH, V)
    for key, prob in joint.items():
        for d in range(DEPTH):
            q[d, key[d]] += prob
    return SampledTreeDrafter(q, widths=(2, 2, 1), seed=seed)


def loop_samples(target, acceptor, drafter, n: int, prompt: list[int] = PROMPT, scored: int = SCORED,
                 depth: int = DEPTH):
    """n seeded generations. Every step that emits a scored token may verify a full depth-`depth` tree
    (scored + depth new tokens); returns the counts of the scored prefixes and the steps' sizes."""
    dec = SpeculativeDecoder(target, drafter, acceptor.params, acceptor)
    counts, steps = Counter(), []
    for seed in range(n):
        chunks = []
        res = dec.generate(prompt, max_new_tokens=scored + depth, seed=seed, on_tokens=chunks.append)
        counts[tuple(res.tokens[:scored])] += 1
        lengths = [len(c) for c in chunks]
        last = next(i for i, total in enumerate(itertools.accumulate(lengths)) if total >= scored)
        steps.append(lengths[: last + 1])  # the steps that emitted the scored tokens
    return counts, steps


@pytest.mark.parametrize("acceptor,params", [(SampleAndWalkAcceptor, SamplingParams(1.0)),
                                             (RejectionAcceptor, FILTERED)])
def test_decoder_on_tiny_llama_samples_the_target_distribution(loop_target, acceptor, params):
    """End to end: prefill, tree verify, acceptance and KV commits over several steps of depth-3 trees."""
    joint = exact_joint(loop_target.model, params, SCORED)
    n = N_LOOP
    counts, steps = loop_samples(loop_target, acceptor(params), loop_drafter(joint, seed=1), n)
    assert chi_square_p(counts, joint, n) > 0.01
    # The test must exercise what it claims: whole depth-3 paths accepted, and scored tokens that
    # came from drafts accepted in a later step, on top of a cache that earlier commits compacted.
    assert sum(lengths[0] == DEPTH + 1 for lengths in steps) > 0.05 * n
    assert sum(any(k >= 2 for k in lengths[1:]) for lengths in steps) > 0.1 * n


@pytest.mark.parametrize("broken,params,caught_by", [(ResampledBonusWalk, SamplingParams(1.0), "p-value"),
                                                     (UnfilteredWalk, FILTERED, "support")])
def test_broken_acceptors_fail_the_tiny_llama_test(loop_target, broken, params, caught_by):
    """The same runs with a buggy acceptor: one biased towards drafted tokens, one that forgets top-k/top-p."""
    joint = exact_joint(loop_target.model, params, SCORED)
    n = N_LOOP
    counts, _ = loop_samples(loop_target, broken(params), loop_drafter(joint, seed=1), n)
    if caught_by == "support":
        with pytest.raises(AssertionError, match="outside the support"):
            chi_square_p(counts, joint, n)
    else:
        assert chi_square_p(counts, joint, n) < 1e-4


def test_committing_the_wrong_branch_fails_the_tiny_llama_test(loop_target, monkeypatch):
    """A KV-cache bug: commit keeps the first nodes of the tree instead of the accepted path. Top-p is
    the sensitive spot: the slightly wrong logits move tokens across its edge, out of the support."""
    monkeypatch.setattr(loop_target, "commit", lambda path: Target.commit(loop_target, list(range(len(path)))))
    joint = exact_joint(loop_target.model, FILTERED, SCORED)
    counts, _ = loop_samples(loop_target, RejectionAcceptor(FILTERED), loop_drafter(joint, seed=1), N_LOOP)
    with pytest.raises(AssertionError, match="outside the support"):
        chi_square_p(counts, joint, N_LOOP)


def test_sampling_params_match_transformers_warpers():
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    logits = 3 * torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    params = SamplingParams(0.8, top_k=20, top_p=0.7)
    scores = logits.clone()
    for w in (TemperatureLogitsWarper(0.8), TopKLogitsWarper(20), TopPLogitsWarper(0.7)):
        scores = w(None, scores)
    torch.testing.assert_close(params.probs(logits), scores.softmax(-1))
