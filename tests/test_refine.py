"""Draft refinement: the n-gram LM, lattice search, rescored drafters (lossless), the neural rescorer."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch
from conftest import conversations, tiny_llama
from test_sampling_lossless import V, TABLE, chi_square_p, markov_expected, markov_samples

from blockdraft import NoDrafter, SpeculativeDecoder, Target
from blockdraft.drafters import BPDDrafter, DraftContext, DraftLattice, Drafter
from blockdraft.drafters.bpd import BPDConfig, BPDModel
from blockdraft.drafters.layers import FrozenLMHead
from blockdraft.errors import BlockdraftError
from blockdraft.refine.drafter import RescoredDrafter
from blockdraft.refine.neural import NeuralRescorer
from blockdraft.refine.ngram import NGramLM
from blockdraft.refine.search import local_rescore, pbest_paths
from blockdraft.train.neural import NeuralTrainConfig, train_neural
from blockdraft.train.run import train_command
from blockdraft.trees import DraftTree
from blockdraft.trees.drafter import TreeDrafter
from blockdraft.verify import RejectionAcceptor, SamplingParams


def toy_corpus(vocab: int = 20, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    seqs = [rng.integers(0, vocab, size=rng.integers(5, 60)) for _ in range(60)]
    return seqs + [np.array([1, 2, 3, 4, 5] * 4)] * 5  # a frequent pattern, so higher orders matter


@pytest.mark.parametrize("order,min_count", [(2, 1), (3, 1), (4, 1), (4, 2), (5, 2)])
def test_ngram_probabilities_sum_to_one(order, min_count):
    lm = NGramLM.fit(toy_corpus(), 20, order, min_count)
    for ctx in ([], [1], [1, 2, 3], [3, 4, 5, 1], [19, 19, 19, 19], [7, 0, 13]):
        p = lm.distribution(ctx)
        assert p.min() > 0
        assert abs(p.sum() - 1) < 1e-6, (ctx, p.sum())
    # the model learned the frequent pattern: after ... 1 2 3 comes 4
    assert lm.distribution([4, 5, 1, 2, 3]).argmax() == 4 or order == 2


def test_ngram_save_load_and_errors(tmp_path):
    lm = NGramLM.fit(toy_corpus(), 20, 4, meta={"target": {"name": "toy"}})
    lm.save(tmp_path / "lm")
    again = NGramLM.load(tmp_path / "lm", vocab_size=20)
    ctx, words = np.array([[1, 2, 3], [5, 1, 2]]), np.array([4, 3])
    assert np.allclose(lm.logprob(ctx, words), again.logprob(ctx, words))
    assert again.meta["target"] == {"name": "toy"}
    with pytest.raises(BlockdraftError, match="vocabulary of 20"):
        NGramLM.load(tmp_path / "lm", vocab_size=30)
    with pytest.raises(BlockdraftError, match="holds no n-gram LM"):
        NGramLM.load(tmp_path / "missing")
    (tmp_path / "lm" / "ngram.npz").write_bytes(b"garbage")
    with pytest.raises(BlockdraftError, match="corrupt"):
        NGramLM.load(tmp_path / "lm")
    with pytest.raises(BlockdraftError, match="order must be 2..5"):
        NGramLM.fit(toy_corpus(), 20, 6)


def random_lattice(depth: int, k: int, vocab: int, seed: int) -> DraftLattice:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.stack([torch.randperm(vocab, generator=g)[:k] for _ in range(depth)])
    logp = torch.log_softmax(torch.randn(depth, k, generator=g), -1).sort(descending=True).values
    return DraftLattice(tokens, logp)


def brute_force(lattice, history, lm, alpha):
    order = lm.order
    out = []
    for idx in itertools.product(range(lattice.tokens.shape[1]), repeat=lattice.depth):
        path = [int(lattice.tokens[d, j]) for d, j in enumerate(idx)]
        score = 0.0
        for d, j in enumerate(idx):
            ctx = (history + path[:d])[-(order - 1):]
            lm_lp = float(lm.logprob(np.array([ctx]), np.array([path[d]]))[0]) if alpha else 0.0
            score += (1 - alpha) * float(lattice.logp[d, j]) + alpha * lm_lp
        out.append((score, path))
    return sorted(out, key=lambda x: -x[0])


@pytest.mark.parametrize("order,alpha,seed", [(2, 0.5, 0), (3, 0.3, 1), (4, 0.7, 2), (4, 0.0, 3), (5, 0.4, 4)])
def test_pbest_returns_the_true_p_best_paths(order, alpha, seed):
    lm = NGramLM.fit(toy_corpus(), 20, order)
    lattice = random_lattice(4, 4, 20, seed)
    history = [1, 2, 3]
    paths, scores = pbest_paths(lattice, history, lm, alpha, p=7, beam=None)
    truth = brute_force(lattice, history, lm, alpha)[:7]
    assert np.allclose(scores, [s for s, _ in truth])
    assert sorted(map(tuple, paths.tolist())) == sorted(tuple(p) for _, p in truth) or len(set(scores)) < 7


def test_local_rescoring_with_alpha_zero_is_the_top1_chain():
    lm = NGramLM.fit(toy_corpus(), 20, 3)
    for seed in range(5):
        lattice = random_lattice(5, 6, 20, seed)
        assert local_rescore(lattice, [1, 2], lm, 0.0) == lattice.best().tolist()
        chosen = local_rescore(lattice, [1, 2], lm, 1.0)  # the LM alone decides
        ctx = [1, 2]
        for d, tok in enumerate(chosen):
            scores = lm.logprob(np.array([ctx[-2:]] * 6), lattice.tokens[d].numpy())
            assert tok == int(lattice.tokens[d, scores.argmax()])
            ctx.append(tok)


def heads_drafter(target: Target, seed: int = 0) -> BPDDrafter:
    """Untrained heads with random (not zero) output layers: wrong often enough to exercise rejection."""
    torch.manual_seed(seed)
    model = BPDModel(BPDConfig(target.hidden_size, target.num_layers, num_heads=3, inner_size=16))
    for head in model.heads:
        torch.nn.init.normal_(head.down.weight, std=0.5)
    return BPDDrafter(model, FrozenLMHead(target.model.get_output_embeddings().weight, None), top_k=4)


def eos_free_target(seed: int, vocab: int = 24) -> Target:
    model = tiny_llama(vocab_size=vocab, seed=seed, logit_scale=3.0)
    model.generation_config.eos_token_id = None
    model.config.eos_token_id = None
    return Target(model, name="tiny")


@pytest.mark.parametrize("mode,alpha", [("global", 0.5), ("global", 0.0), ("local", 0.5), ("local", 1.0)])
def test_rescored_drafts_are_lossless_under_greedy(mode, alpha):
    for seed in (0, 1):
        target = eos_free_target(seed)
        prompt = [3, 4, 5, 6, 3, 4, 5, 7, 8, 3, 4]
        ref = SpeculativeDecoder(target, NoDrafter()).generate(prompt, max_new_tokens=30).tokens
        lm = NGramLM.fit([ref + prompt, prompt * 3], 24, 3)  # an LM that knows some of the answer
        drafter = RescoredDrafter(heads_drafter(target, seed), lm, mode, alpha, p=6)
        res = SpeculativeDecoder(target, drafter).generate(prompt, max_new_tokens=30)
        assert res.tokens == ref
        assert res.stats.target_calls < 30  # some drafts were accepted: the check is not vacuous


def test_local_rescoring_alpha_zero_drafts_exactly_like_plain_bpd():
    target = eos_free_target(2)
    prompt = [3, 4, 5, 6, 3, 4]
    lm = NGramLM.fit([prompt * 4], 24, 3)
    plain, rescored = heads_drafter(target, 3), RescoredDrafter(heads_drafter(target, 3), lm, "local", 0.0)
    trees = []
    for drafter in (plain, rescored):
        seen = []
        real_propose = drafter.propose

        def spy(ctx, real_propose=real_propose, seen=seen):
            tree = real_propose(ctx)
            seen.append(tree.tokens.tolist())
            return tree

        drafter.propose = spy
        SpeculativeDecoder(target, drafter).generate(prompt, max_new_tokens=20)
        trees.append(seen)
    assert trees[0] == trees[1]


class TableLatticeDrafter(Drafter):
    """A lattice drafter for the toy Markov target: top-k of a fixed random table, per depth."""

    def __init__(self, k: int = 3, depth: int = 3):
        g = torch.Generator().manual_seed(5)
        self.table = torch.randn(V, V, generator=g) + TABLE  # correlated with the target, not equal
        self.k, self.depth = k, depth

    def lattice(self, ctx):
        rows, tok = [], ctx.tokens[-1]
        for _ in range(self.depth):
            rows.append(self.table[tok])
            tok = int(self.table[tok].argmax())
        return DraftLattice.from_logits(torch.stack(rows), self.k)


@pytest.mark.parametrize("mode", ["global", "local"])
def test_rescored_drafts_sample_the_target_distribution(mode):
    """Lossless sampling for rescored drafts (the paper was greedy only): chi-square on a toy target."""
    lm = NGramLM.fit(toy_corpus(V, 1), V, 3)
    drafter = RescoredDrafter(TableLatticeDrafter(), lm, mode, 0.5, p=4)
    params = SamplingParams(1.0)
    n = 4000
    counts = markov_samples(RejectionAcceptor(params), drafter, TABLE, n)
    assert chi_square_p(counts, markov_expected(params, TABLE), n) > 0.01
    tree = drafter.propose(DraftContext([0], None, 8))
    assert isinstance(tree, DraftTree) and len(tree) > 1


def test_bad_rescoring_options_are_refused():
    lm = NGramLM.fit(toy_corpus(), 20, 3)
    with pytest.raises(BlockdraftError, match="alpha must lie in"):
        RescoredDrafter(TableLatticeDrafter(), lm, "global", 1.5)
    with pytest.raises(BlockdraftError, match="mode must be one of"):
        RescoredDrafter(TableLatticeDrafter(), lm, "sideways", 0.2)
    with pytest.raises(BlockdraftError, match="no top-k lattice"):
        RescoredDrafter(NoDrafter(), lm, "global", 0.2)


def test_neural_rescorer_trains_and_round_trips(tiny, stores, tmp_path):
    train, valid = stores
    cfg = NeuralTrainConfig(width=32, num_layers=1, window=8, draft_vocab=0, epochs=8, batch=16, lr=3e-3)
    rescorer = train_neural(tiny, train, valid, tmp_path / "neural", cfg)
    losses = [json.loads(x)["loss"] for x in (tmp_path / "neural" / "train_log.jsonl").read_text().splitlines()
              if "loss" in json.loads(x)]
    assert losses[-1] < 0.8 * losses[0]
    again = NeuralRescorer.from_pretrained(tmp_path / "neural", tiny)
    ctx, cand = np.array([[5, 6, 7, 8]]), np.array([[3, 4, 5, 6]])
    assert np.allclose(rescorer.score(ctx, cand), again.score(ctx, cand), atol=1e-3)  # fp16 on disk
    other = Target(tiny_llama(vocab_size=40), None, name="other-llama")
    with pytest.raises(BlockdraftError, match="trained for target 'tiny-llama'"):
        NeuralRescorer.from_pretrained(tmp_path / "neural", other)


def test_train_command_builds_an_ngram_lm(tiny, tmp_path):
    data = tmp_path / "data.json"
    data.write_text(json.dumps(conversations(80)))
    lm = train_command(tiny, "ngram", tmp_path / "ngram", data=str(data), max_tokens=2000, order=3, min_count=1)
    assert lm.order == 3 and lm.meta["target"]["name"] == "tiny-llama"
    assert (tmp_path / "ngram" / "ngram.npz").is_file()
    with pytest.raises(BlockdraftError, match="do not apply"):
        train_command(tiny, "ngram", tmp_path / "x", data=str(data), max_tokens=2000, num_heads=3)


def test_analysis_replays_the_real_run_and_bounds_it():
    from blockdraft.bench.analyze import analyze_prompt, h_max, repetition, summarize

    target = eos_free_target(4)
    prompt = [3, 4, 5, 6, 3, 4, 5, 7, 8, 3, 4]
    lm = NGramLM.fit([prompt * 3], 24, 3)
    base = heads_drafter(target, 5)
    base.top_k = 16
    refiners = {"global": RescoredDrafter(heads_drafter(target, 5), lm, "global", 0.5, p=4),
                "local": RescoredDrafter(heads_drafter(target, 5), lm, "local", 0.5),
                "tree": TreeDrafter(heads_drafter(target, 5), "best", 6, lm, 0.5)}
    row = analyze_prompt(target, base, refiners, prompt, "toy", max_new_tokens=40)
    # replaying the top-1 chain on the greedy reply reproduces the real decoding run exactly
    assert row.oracle[1] == pytest.approx(row.tau)
    ks = sorted(row.oracle)
    assert all(row.oracle[a] <= row.oracle[b] for a, b in itertools.pairwise(ks))  # more choice never hurts the oracle
    assert row.oracle[16] >= max(row.replayed.values())  # no rule beats the oracle over the same lattice
    # the replayed global rescoring equals a real run with that drafter
    for name in ("global", "tree"):
        fresh = {"global": RescoredDrafter(heads_drafter(target, 5), lm, "global", 0.5, p=4),
                 "tree": TreeDrafter(heads_drafter(target, 5), "best", 6, lm, 0.5)}[name]
        real = SpeculativeDecoder(target, fresh).generate(prompt, max_new_tokens=40)
        assert row.replayed[name] == pytest.approx(real.stats.tau)
    assert len(row.entropy) == 3 and summarize([row])["overall"]["h_max"] == h_max(row.entropy)
    assert h_max([1.0, 2.0, 3.0, 2.5]) == 3 and h_max([2.0, 1.0]) == 1
    assert repetition([[5, 5, 5, 1], [1, 2, 3]]) == (pytest.approx(2 / 5), 2.0)


def test_replay_ends_where_the_reply_ends_as_the_decoder_does():
    """The decoder's last step drafts at most up to the reply's end and emits its bonus there: a drafter that knows
    the 10-token reply, 3 deep, takes steps of 4, 4 and 2 tokens (replay counted an 11th past the end)."""
    from blockdraft.bench.analyze import replay

    reply = list(range(10, 20))
    truth_at = lambda i: reply[i: i + 3]  # noqa: E731 (the tokens after root i)
    assert replay(lambda i: [truth_at(i)], truth_at, len(reply)) == pytest.approx(10 / 3)
    assert replay(lambda i: [[]], truth_at, len(reply)) == 1.0
