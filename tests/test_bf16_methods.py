"""Every method end to end with a bfloat16 target: drafters follow its dtype, greedy output has no real
mismatch against `ar`, sampling still follows the target's distribution (chi-square)."""

import copy
import json

import pytest
import torch
from conftest import conversations
from test_sampling_lossless import chi_square_p
from tiny_checkpoints import in_dtype

from blockdraft import SamplingParams, SpeculativeDecoder, Target, methods
from blockdraft.bench import ties
from blockdraft.drafters import BPDDrafter
from blockdraft.methods import METHODS, make_drafter
from blockdraft.model import packing

TOKENS = 32


@pytest.fixture(autouse=True)
def shipped(checkpoints, monkeypatch):
    monkeypatch.setattr(methods, "CHECKPOINTS", checkpoints)  # every method loads by its bare name


@pytest.fixture(scope="module")
def bf16(tiny):
    return in_dtype(tiny, torch.bfloat16)


@pytest.fixture(scope="module")
def greedy_reference(bf16):
    """Prompts, `ar`'s bf16 outputs, the float32 reference model and a tolerance measured on these outputs."""
    prompts = [bf16.encode(p, chat_template=False) for p in ("tell me more now\n", "abcab abcab abc")]
    ar = [SpeculativeDecoder(bf16, make_drafter("ar", bf16)).generate(p, TOKENS).tokens for p in prompts]
    outputs = [p + a for p, a in zip(prompts, ar, strict=True)]
    tolerance = ties.measure_tolerance(bf16, outputs, "ar outputs")["tolerance"]
    return prompts, ar, ties.float32_reference(bf16), tolerance


@pytest.mark.parametrize("method", list(METHODS))
def test_greedy_in_bf16_has_no_real_mismatch(bf16, greedy_reference, method):
    prompts, ar, reference, tolerance = greedy_reference
    assert reference.dtype == torch.float32 and bf16.model.dtype == torch.bfloat16
    drafter = make_drafter(method, bf16)
    for qid, (prompt, ref) in enumerate(zip(prompts, ar, strict=True)):
        res = SpeculativeDecoder(bf16, drafter).generate(prompt, TOKENS)
        identical, found, _ = ties.classify_question(qid, [ref], [res.tokens], lambda t, prompt=prompt: prompt,
                                                     reference, tolerance)
        assert identical + len(found) == 1 and all(d.tie for d in found), found
        if method != "ar" and qid == 0:
            assert res.stats.tree_nodes > res.stats.target_calls  # drafts were verified, not just roots


# Copying drafters need something to copy before the first sampled token; trained ones are tested on a
# plain prompt (on which the tiny target's top-4 often agrees with them).
COPYING = ("lookup", "suffix", "rest")
PROMPTS = {"copy": "abcab abcab abc", "plain": "tell me more now\n"}


@pytest.fixture(scope="module")
def sampling_targets(tiny):
    """The bf16 target without EOS (every run emits exactly two tokens) and, per prompt, the exact
    two-token distribution (top-k 4: at most 16 outcomes, so that a few hundred runs give the test power)."""
    model = copy.deepcopy(tiny.model).to(torch.bfloat16)
    model.generation_config.eos_token_id = None
    model.config.eos_token_id = None
    target = Target(model, None, name=tiny.name)
    params = SamplingParams(1.0, top_k=4)
    laws = {}
    for kind, text in PROMPTS.items():
        prompt = tiny.encode(text, chat_template=False)
        with torch.no_grad():
            p1 = params.probs(model(torch.tensor([prompt])).logits[0, -1])
            seqs = torch.tensor([prompt + [a] for a in range(target.vocab_size)])
            p2 = params.probs(model(seqs).logits[:, -1])
        laws[kind] = prompt, {(a, b): float(p1[a] * p2[a, b])
                              for a in range(target.vocab_size) for b in range(target.vocab_size)}
    return target, params, laws


SAMPLED_TREES = ["treeflash:sample=1", "hydra:sample=1", "ddtree:sample=1"]  # children drawn from q


@pytest.mark.parametrize("method", list(METHODS) + SAMPLED_TREES)
def test_sampling_in_bf16_follows_the_target_distribution(sampling_targets, method):
    target, params, laws = sampling_targets
    prompt, expected = laws["copy" if method.split(":")[0] in COPYING else "plain"]
    decoder = SpeculativeDecoder(target, make_drafter(method, target), params)
    n, counts, calls = 400, {}, 0
    for seed in range(n):
        res = decoder.generate(prompt, max_new_tokens=2, seed=seed)
        counts[tuple(res.tokens)] = counts.get(tuple(res.tokens), 0) + 1
        calls += res.stats.target_calls
    assert chi_square_p(counts, expected, n) > 0.01
    if method != "ar":
        assert calls < 2 * n, "no draft was ever accepted: the test would not exercise verification"


def test_every_drafter_kind_runs_in_the_target_dtype(bf16):
    prompt = bf16.encode("tell me more now\n", chat_template=False)
    kinds = {"bpd": "bpd", "dflash": "dflash", "treeflash": "treeflash", "hydra": "hydra", "neural": "bpd-neural"}
    for name, method in kinds.items():
        drafter = make_drafter(method, bf16)
        SpeculativeDecoder(bf16, drafter).generate(prompt, 8)
        base = getattr(drafter, "base", drafter)
        modules = [base.model, base.lm_head] + [getattr(drafter, "module", base.model)]
        if name == "neural":
            modules.append(drafter.rescorer.model)
        for module in modules:
            assert {p.dtype for p in [*module.parameters(), *module.buffers()] if p.is_floating_point()} \
                == {torch.bfloat16}, name
        assert base.last_hidden.dtype == torch.bfloat16, name  # the drafter's own states, not only its weights
        lattice = base.last_lattice  # the last step's lattice (the final step drafts nothing)
        assert lattice.tokens.device.type == "cpu" and lattice.logp.dtype == torch.float32
    block = make_drafter("dflash", bf16)
    block.reset([])
    assert all(k.dtype == torch.bfloat16 for kv in block.ctx_kv for k in kv)
    from blockdraft.bench.analyze import analyze_prompt  # `blockdraft analyze` replays bf16 lattices too

    tree = make_drafter("treeflash", bf16)
    row = analyze_prompt(bf16, make_drafter("dflash:top_k=16", bf16), {"treeflash": tree}, prompt, "toy", 16)
    real = SpeculativeDecoder(bf16, make_drafter("treeflash", bf16)).generate(prompt, 16)
    assert row.replayed["treeflash"] == pytest.approx(real.stats.tau)


def test_training_with_a_bf16_target(tiny, tmp_path):
    from blockdraft.train.bpd import BPDTrainConfig, train_bpd
    from blockdraft.train.features import build_store

    bf16 = in_dtype(tiny, torch.bfloat16)
    store = build_store(bf16, conversations(40), tmp_path / "store", max_tokens=2000, max_len=64, top_k=8)
    assert store.meta["dtype"] == "bfloat16"
    drafter = train_bpd(bf16, store, None, tmp_path / "heads",
                        BPDTrainConfig(num_heads=2, inner_size=32, draft_vocab=0, epochs=4, batch=32, lr=5e-3))
    assert next(drafter.model.parameters()).dtype == torch.float32  # trained weights stay float32
    losses = [json.loads(line)["loss"] for line in (tmp_path / "heads" / "train_log.jsonl").read_text().splitlines()]
    assert losses[-1] < losses[0] - 0.1, losses
    for target, dtype in ((bf16, torch.bfloat16), (tiny, torch.float32)):  # the checkpoint loads into either
        loaded = BPDDrafter.from_pretrained(tmp_path / "heads", target)
        assert next(loaded.model.parameters()).dtype == dtype


def drafter_modules(drafter) -> list[torch.nn.Module]:
    """Every torch module reachable from a drafter through attributes, lists, tuples and dicts."""
    modules, seen, todo = [], set(), [drafter]
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.nn.Module):
            modules.extend(obj.modules())
        elif isinstance(obj, (list, tuple)):
            todo.extend(obj)
        elif isinstance(obj, dict):
            todo.extend(obj.values())
        elif type(obj).__module__.startswith("blockdraft"):
            todo.extend(vars(obj).values())
    return modules


@pytest.mark.skipif(not packing._supported(torch.bfloat16),
                    reason="this CPU has no oneDNN bf16 kernels (AVX2 only): nothing is prepacked, F.linear runs")
@pytest.mark.parametrize("method", ["hybrid:sources=suffix+treeflash", "hybrid:sources=suffix+hydra", "treeflash",
                                    "bpd-ngram"])
def test_every_linear_of_a_bf16_drafter_is_prepacked(bf16, method):
    """The packed path skips aten's per-call weight re-layout: a drafter kept in a container (the hybrid's
    learned source is in a tuple) ran every matmul unpacked, ~1 ms a step slower on the default target."""
    modules = drafter_modules(make_drafter(method, bf16))
    linears = [m for m in modules if isinstance(m, torch.nn.Linear)]
    heads = [m for m in modules if hasattr(m, "prepack")]
    assert linears and heads
    assert all(getattr(m, "_packed", None) is not None for m in linears)
    assert all(m.packed is not None for m in heads)


def test_a_cpu_without_bf16_kernels_runs_bf16_unpacked_with_the_same_output(tiny, bf16, monkeypatch):
    """On a CPU with AVX2 only, oneDNN's reorder raises ("bf16 path needs the cpu support avx_ne_convert or
    avx512bw, ..."): the engine and the drafters then keep plain weights, and greedy output is the one the
    packed path gives (or, on such a CPU, that nothing changes when packing is refused)."""
    prompt = bf16.encode("abcab abcab abc", chat_template=False)
    want = SpeculativeDecoder(bf16, make_drafter("treeflash", bf16)).generate(prompt, TOKENS).tokens
    monkeypatch.setattr(packing, "_supported", lambda dtype: False)
    unpacked = in_dtype(tiny, torch.bfloat16)
    assert all(layer.qkv.packed is None for layer in unpacked.forwarder.layers)
    drafter = make_drafter("treeflash", unpacked)
    assert drafter.base.lm_head.packed is None
    assert SpeculativeDecoder(unpacked, drafter).generate(prompt, TOKENS).tokens == want
