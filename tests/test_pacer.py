"""The pacer: plain one-token steps while drafting is measured not to pay; the output never changes."""

import pytest

from blockdraft import SpeculativeDecoder, methods
from blockdraft.decoding import decoder as decoder_module
from blockdraft.decoding.pacer import Pacer
from blockdraft.drafters import Drafter
from blockdraft.methods import METHODS, make_drafter

TOKENS = 24


def simulate(pacer: Pacer, steps: int, draft_cost, plain_cost, context: int = 100, tau: float = 2.0) -> list[bool]:
    """Feed the pacer synthetic step times: draft_cost(context) seconds per drafted step emitting `tau`
    tokens, plain_cost(context) per plain step emitting one. Returns its choices."""
    choices = []
    for _ in range(steps):
        drafted = pacer.should_draft(context)
        tokens = tau if drafted else 1
        pacer.record(drafted, draft_cost(context) if drafted else plain_cost(context), tokens, context)
        context += tokens
        choices.append(drafted)
    return choices


def test_it_keeps_drafting_while_drafting_is_faster_and_rarely_samples_plain_steps():
    choices = simulate(Pacer(), 200, lambda c: 1.2, lambda c: 1.0)  # 0.6 s per token against 1.0
    plain = choices.count(False)
    assert 1 <= plain <= 10  # a first sample, then one per 32 steps or per 1.5x context growth


def test_it_takes_plain_steps_while_drafting_is_slower_and_samples_drafting_again():
    choices = simulate(Pacer(), 320, lambda c: 3.0, lambda c: 1.0)  # 1.5 s per token against 1.0
    drafted = choices[10:].count(True)
    assert 6 <= drafted <= 14  # one sample per 32 steps
    assert choices[:2] == [True, True]  # the warm-up drafts


def test_plain_steps_must_be_faster_by_the_margin_to_take_over():
    # drafting that finds nothing costs a plain step and a little more: it keeps drafting
    assert simulate(Pacer(), 100, lambda c: 1.05, lambda c: 1.0, tau=1.0)[5:].count(True) >= 90
    assert simulate(Pacer(), 100, lambda c: 1.2, lambda c: 1.0, tau=1.0)[5:].count(True) <= 10


def test_it_switches_when_a_growing_context_makes_drafting_lose():
    # drafting's cost per token grows with the context (a tree attends every node to all of it)
    choices = simulate(Pacer(), 400, lambda c: 1.0 + c / 500, lambda c: 1.0, tau=2.0)
    # per token: 0.5 + c / 1000 against 1.0, so drafting wins below c = 500 and loses above
    assert choices[5:60].count(True) >= 50
    assert choices[-100:].count(False) >= 95


class SlowLookup(Drafter):
    """Prompt lookup that takes 30 ms per proposal (on `clock`): far slower than a one-token step of 1 ms."""

    def __init__(self, target, clock):
        self.inner = make_drafter("lookup", target)
        self.name, self.observed, self.clock = "slow-lookup", 0, clock

    def reset(self, prompt_ids):
        self.inner.reset(prompt_ids)

    def observe(self, ctx):
        self.observed += 1

    def propose(self, ctx):
        self.clock.advance(0.03)
        return self.inner.propose(ctx)


def test_a_slow_drafter_is_paced_to_plain_steps_with_the_same_output(tiny, virtual_clock, monkeypatch):
    """The decoder's own step timing drives the pacer, on a virtual clock: every verification pass takes 1 ms
    and every proposal 30 ms, whatever this machine's speed or load."""
    virtual_clock.install(monkeypatch, decoder_module)
    verify = tiny.verify

    def one_ms_verify(tree):
        virtual_clock.advance(0.001)
        return verify(tree)

    monkeypatch.setattr(tiny, "verify", one_ms_verify)
    prompt = tiny.encode("abcab abcab abc", chat_template=False)
    ar = SpeculativeDecoder(tiny, make_drafter("ar", tiny)).generate(prompt, TOKENS)
    drafter = SlowLookup(tiny, virtual_clock)
    paced = SpeculativeDecoder(tiny, drafter, pace=True).generate(prompt, TOKENS)
    assert paced.tokens == ar.tokens
    assert paced.stats.plain_steps >= 0.6 * paced.stats.target_calls
    assert drafter.observed == paced.stats.plain_steps  # every plain step showed the drafter its context
    unpaced = SpeculativeDecoder(tiny, SlowLookup(tiny, virtual_clock), pace=False).generate(prompt, TOKENS)
    assert unpaced.tokens == ar.tokens and unpaced.stats.plain_steps == 0
    fast = SpeculativeDecoder(tiny, make_drafter("lookup", tiny), pace=True).generate(prompt, TOKENS)
    assert fast.tokens == ar.tokens and fast.stats.plain_steps <= 2  # a drafter that costs nothing keeps drafting


class Alternating(Pacer):
    """Drafts on every other step, whatever the times: each drafter must keep its state through plain steps."""

    def should_draft(self, context: int) -> bool:
        return self.steps % 2 == 0


@pytest.mark.parametrize("method", [m for m in METHODS if m != "ar"])
def test_every_method_stays_lossless_through_plain_steps(tiny, checkpoints, monkeypatch, method):
    monkeypatch.setattr(methods, "CHECKPOINTS", checkpoints)
    monkeypatch.setattr(decoder_module, "Pacer", Alternating)
    drafter = make_drafter(method, tiny)
    accepted = 0
    for text in ("tell me more now\n", "abcab abcab abc"):
        prompt = tiny.encode(text, chat_template=False)
        ar = SpeculativeDecoder(tiny, make_drafter("ar", tiny)).generate(prompt, TOKENS)
        paced = SpeculativeDecoder(tiny, drafter, pace=True).generate(prompt, TOKENS)
        assert paced.tokens == ar.tokens
        assert 0 < paced.stats.plain_steps < paced.stats.target_calls
        accepted += sum(k * n for k, n in paced.stats.accepted_hist.items())
    assert accepted > 0  # the drafted steps between plain ones got drafts accepted


def test_a_method_specs_pace_option_goes_to_the_decoder_not_the_drafter(tiny):
    from blockdraft.bench.runners import DecoderRunner, split_pace
    from blockdraft.errors import BlockdraftError

    assert split_pace("treeflash:budget=8:pace=false", True) == ("treeflash:budget=8", False)
    assert split_pace("lookup", True) == ("lookup", True) and split_pace("lookup:pace=true", False) == ("lookup", True)
    with pytest.raises(BlockdraftError, match="pace must be true or false"):
        split_pace("lookup:pace=maybe", True)
    params = __import__("blockdraft").SamplingParams()
    assert DecoderRunner("lookup:pace=false", tiny, params, pace=True).decoder.pace is False
    assert DecoderRunner("lookup", tiny, params, pace=True).decoder.pace is True
