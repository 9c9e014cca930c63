"""The real methods sample exactly at T > 0: chi-square tests on the real decoding loop, in float32.

`treeflash:sample=1` and `hydra:sample=1` (sampled trees that report q), `ddtree` (deterministic best-first trees)
and `hybrid` (suffix matches and a learned treeflash merged into one tree), each verified by `rejection` and by
`traversal`, on the tiny target with its tiny trained checkpoints (conftest.checkpoints). Each run is a few
thousand seeded generations of SCORED + DEPTH tokens; the law of the first SCORED tokens is computed exactly by
plain forwards (test_sampling_lossless.exact_joint) and compared by chi-square (its `chi_square_p`, which also
fails any sample outside top-k). The runs must exercise what they claim: verified trees reach depth >= 3, and
whole depth-3 paths get accepted in the steps that emit the scored tokens. The same runs with a broken acceptor
(test_sampling_lossless.ForgetfulRejection: a fresh sample instead of the residual; test_traversal.KeptWeight: a
node keeps its weight when a child is removed) must fail the same test.
"""

from __future__ import annotations

import copy

import pytest
import torch

from blockdraft import NoDrafter, SamplingParams, SpeculativeDecoder, Target, methods
from blockdraft.methods import make_drafter
from blockdraft.verify import RejectionAcceptor, TraversalAcceptor

from test_sampling_lossless import ForgetfulRejection, chi_square_p, exact_joint, loop_samples
from test_traversal import KeptWeight

# The tiny target's logits lie within ~0.3 of each other: at T = 1 its top-4 are near uniform and a depth-3 path is
# rarely accepted whole. At T = 0.1 its distributions look like a chat model's (top-1 0.55-0.75 here).
PARAMS = SamplingParams(0.1, top_k=4)  # at most 4^SCORED sequences
SCORED, DEPTH = 3, 3  # score the first 3 tokens; every step that emits one has room for a depth-3 tree
N = 1500
QUESTION, ANSWERED = "tell me more now\n", 6  # the prompt: a question like those the checkpoints were trained to
# answer and the first ANSWERED tokens of the target's own reply (at the reply's very start the tiny drafters'
# deeper guesses are poor: no whole depth-3 path was accepted there)

METHODS = [
    "treeflash:sample=1",
    "hydra:sample=1:children=2:budget=32",  # 2 children a node: deep enough to reach the heads' depth 3
    "ddtree:top_k=4:budget=48",  # best-first over top-4 marginals: 48 nodes reach depth 3
    "hybrid:sources=suffix+treeflash:gate=false",  # gate=false: the learned source runs every step (no clock)
]
ACCEPTORS = {"rejection": (RejectionAcceptor, ForgetfulRejection), "traversal": (TraversalAcceptor, KeptWeight)}


class Recording:
    """Mixed into an acceptor: records each verified tree's depth and how many of its drafts were accepted."""

    def accept(self, tree, logits, gen=None):
        acc = super().accept(tree, logits, gen)
        self.steps.append((int(tree.depth.max()), acc.accepted_drafts))
        return acc


def recording(cls, params):
    acceptor = type(f"Recording{cls.__name__}", (Recording, cls), {})(params)
    acceptor.steps = []
    return acceptor


@pytest.fixture(scope="module")
def sampling(tiny, checkpoints):
    """The tiny target in float32 without EOS (every run emits all its tokens), the prompt and the exact law."""
    model = copy.deepcopy(tiny.model)
    model.generation_config.eos_token_id = None
    model.config.eos_token_id = None
    target = Target(model, None, name=tiny.name)  # the name the checkpoints were trained for
    question = tiny.encode(QUESTION, chat_template=False)
    prompt = question + SpeculativeDecoder(target, NoDrafter()).generate(question, ANSWERED).tokens
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a model this small only pays for synchronisation with more threads
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(methods, "CHECKPOINTS", checkpoints)  # every method loads by its bare name
        yield target, prompt, exact_joint(model, PARAMS, SCORED, prompt)
    torch.set_num_threads(threads)


def run(sampling, method, acceptor_cls):
    target, prompt, joint = sampling
    acceptor = recording(acceptor_cls, PARAMS)
    counts, steps = loop_samples(target, acceptor, make_drafter(method, target), N, prompt, SCORED, DEPTH)
    return chi_square_p(counts, joint, N), steps, acceptor.steps


@pytest.mark.parametrize("acceptor", list(ACCEPTORS))
@pytest.mark.parametrize("method", METHODS)
def test_real_methods_sample_the_target_distribution(sampling, method, acceptor):
    p, scored_steps, trees = run(sampling, method, ACCEPTORS[acceptor][0])
    assert p > 0.01, p
    deep = sum(depth >= DEPTH for depth, _ in trees)
    assert deep >= 0.5 * N, f"only {deep} verified trees in {N} runs reached depth {DEPTH}"
    assert sum(accepted for _, accepted in trees) > 0.5 * len(trees)  # drafts do get accepted
    whole = sum(lengths[0] >= DEPTH + 1 for lengths in scored_steps)  # a depth-3 path accepted in the first step
    assert whole > 0.01 * N, f"a whole depth-{DEPTH} path was accepted first in only {whole} of {N} runs"


@pytest.mark.parametrize("acceptor", list(ACCEPTORS))
@pytest.mark.parametrize("method", METHODS)
def test_a_broken_acceptor_fails_the_same_test(sampling, method, acceptor):
    try:
        p, _, _ = run(sampling, method, ACCEPTORS[acceptor][1])
    except AssertionError as outside:  # chi_square_p's support check: a token top-k excludes came out
        assert "outside the support" in str(outside)
        return
    assert p < 1e-4, p
