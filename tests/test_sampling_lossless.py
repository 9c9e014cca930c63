"""Speculative sampling reproduces the target's distribution (chi-square), on chains and trees.

Two levels: a toy Markov target (exact probabilities, many samples, every acceptor) and the
real decoding loop on a tiny random Llama (KV-cache commits included). A deliberately broken
acceptor must fail the same test, which shows the test has teeth.
"""

import itertools

import pytest
import torch
from scipy.stats import chisquare

from blockdraft import DraftContext, SamplingParams, SpeculativeDecoder, Target
from blockdraft.verify import RejectionAcceptor, SampleAndWalkAcceptor, TypicalAcceptor
from blockdraft.verify.base import sample

from conftest import tiny_llama
from drafters_for_tests import RandomTreeDrafter, SampledChainDrafter

V = 6


class ForgetfulRejection(RejectionAcceptor):
    """The classic bug: after rejecting every child, sample the bonus from p, not the residual."""

    def choose(self, tree, node, logits, gen):
        child, token = super().choose(tree, node, logits, gen)
        return (child, token) if child is not None else (None, sample(self.params.probs(logits), gen))


def chi_square_p(counts: dict, expected: dict, n: int) -> float:
    """p-value of observed counts against expected probabilities; rare cells are pooled."""
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
    assert sum(obs) == n, "a sample fell outside the support of the target"
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
    p = params.probs(logit_table)
    return {(a, b): float(p[0, a] * p[a, b]) for a, b in itertools.product(range(V), repeat=2)}


TABLE = 1.5 * torch.randn(V, V, generator=torch.Generator().manual_seed(7))
FAVOURED = [int(TABLE[0].argmax()), int(TABLE[1].argmax()), 3]

LOSSLESS_CASES = [
    ("walk", "tree", SamplingParams(1.0)),
    ("rejection", "tree", SamplingParams(1.0)),
    ("rejection", "sampled-chain", SamplingParams(1.0)),
    ("rejection", "tree", SamplingParams(0.7, top_k=4, top_p=0.9)),
    ("walk", "sampled-chain", SamplingParams(1.3, top_p=0.8)),
]


def _drafter(kind, seed):
    if kind == "tree":
        return RandomTreeDrafter(V, max_nodes=7, seed=seed, favour=FAVOURED)
    return SampledChainDrafter(V, length=3, seed=seed)


@pytest.mark.parametrize("acceptor,kind,params", LOSSLESS_CASES)
def test_lossless_acceptors_match_target_distribution(acceptor, kind, params):
    cls = {"walk": SampleAndWalkAcceptor, "rejection": RejectionAcceptor}[acceptor]
    n = 6000
    counts = markov_samples(cls(params), _drafter(kind, 1), TABLE, n)
    assert chi_square_p(counts, markov_expected(params, TABLE), n) > 0.01


@pytest.mark.parametrize("broken", [ForgetfulRejection, TypicalAcceptor])
def test_broken_or_lossy_acceptors_fail_the_same_test(broken):
    params = SamplingParams(1.0)
    n = 6000
    counts = markov_samples(broken(params), _drafter("tree", 1), TABLE, n)
    assert chi_square_p(counts, markov_expected(params, TABLE), n) < 1e-4


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


def test_decoder_on_tiny_llama_samples_the_target_distribution():
    """End to end: prefill, tree verify, KV commit and acceptance on a real (tiny) model."""
    vocab = 8
    model = tiny_llama(vocab_size=vocab, seed=3, logit_scale=12.0)
    model.generation_config.eos_token_id = None
    model.config.eos_token_id = None
    target = Target(model, name="tiny")
    prompt = [3, 5, 6, 3]
    params = SamplingParams(1.0)
    with torch.no_grad():
        p1 = params.probs(model(torch.tensor([prompt])).logits[0, -1])
        seqs = torch.tensor([prompt + [a] for a in range(vocab)])
        p2 = params.probs(model(seqs).logits[:, -1])
    expected = {(a, b): float(p1[a] * p2[a, b]) for a in range(vocab) for b in range(vocab)}
    for drafter in (RandomTreeDrafter(vocab, 6, seed=0, favour=[int(p1.argmax())]), SampledChainDrafter(vocab, 2)):
        dec = SpeculativeDecoder(target, drafter, params)
        n, counts, calls = 1500, {}, 0
        for seed in range(n):
            res = dec.generate(prompt, max_new_tokens=2, seed=seed)
            counts[tuple(res.tokens)] = counts.get(tuple(res.tokens), 0) + 1
            calls += res.stats.target_calls
        assert chi_square_p(counts, expected, n) > 0.01
        assert calls < 2 * n, "the drafter never got a token accepted: the test would not exercise trees"


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
