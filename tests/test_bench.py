"""`blockdraft bench` end to end on a tiny random model: schema, losslessness check, reports."""

import json
import math

import pytest

from blockdraft.bench import run as bench_run
from blockdraft.bench.runners import RunRecord, make_runner
from blockdraft.cli import main
from blockdraft.methods import METHODS, Method

from drafters_for_tests import KnownAcceptanceDrafter


@pytest.fixture
def question_file(tmp_path):
    rows = [
        {"question_id": 1, "category": "writing", "turns": ["abc abc", "again abc"]},
        {"question_id": 2, "category": "writing", "turns": ["hello"]},
        {"question_id": 3, "category": "summarization", "turns": ["the cat sat. the cat sat."]},
        {"question_id": 4, "category": "summarization", "turns": ["no more"]},
    ]
    path = tmp_path / "q.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


class OutputChanger:
    """A method that deliberately alters the output: the bench must report it lossless: false."""

    lossless = True

    def __init__(self, inner):
        self.inner = inner

    def run(self, prompt_ids, max_new_tokens, seed):
        rec = self.inner.run(prompt_ids, max_new_tokens, seed)
        return RunRecord(rec.tokens[:-1] + [(rec.tokens[-1] + 1) % 20], rec.time_s, rec.target_calls)


def test_bench_end_to_end(tiny_model_dir, question_file, tmp_path, monkeypatch, capsys):
    def patched(name, target, params, acceptor=None, pace=False):
        if name == "broken":
            return OutputChanger(make_runner("ar", target, params, acceptor))
        return make_runner(name, target, params, acceptor, pace)

    monkeypatch.setattr(bench_run, "make_runner", patched)
    monkeypatch.setitem(METHODS, "broken", Method("broken", "test only", None))
    known = Method("known", "test", lambda target, **kw: KnownAcceptanceDrafter(target.model, 2))
    monkeypatch.setitem(METHODS, "known", known)
    out = tmp_path / "out"
    rc = main(["bench", "--questions", str(question_file), "--methods", "ar,hf,hf-lookup,lookup,broken,known",
               "--target", str(tiny_model_dir), "--max-new-tokens", "10", "--out", str(out),
               "--per-category", "1", "--dtype", "float32", "--no-pace"])  # exact call counts below
    assert rc == 0
    results = json.loads((out / "results.json").read_text())
    assert set(results) >= {"config", "methods"}
    assert results["config"]["questions"] == 2  # --per-category 1 over two categories
    for name in ("ar", "hf", "hf-lookup", "lookup", "broken"):
        m = results["methods"][name]
        assert {"tau", "tokens_per_s", "speedup", "speedup_vs_hf", "lossless", "per_category"} <= set(m)
        assert set(m["per_category"]) == {"writing", "summarization"}
        for cat in m["per_category"].values():
            assert {"tau", "tokens_per_s", "speedup"} <= set(cat)
    methods = results["methods"]
    # `known` accepts exactly 2 drafts per step: a turn of n tokens takes ceil(n / 3) target calls
    turns = {m: {(r["question_id"], r["turn"]): r for r in results["records"] if r["method"] == m}
             for m in ("ar", "known")}
    assert turns["known"].keys() == turns["ar"].keys()
    lengths = [r["new_tokens"] for r in turns["ar"].values()]
    assert sum(lengths) > 3 * len(lengths)  # turns long enough for the count to say something
    assert [r["target_calls"] for r in turns["known"].values()] == [math.ceil(n / 3) for n in lengths]
    assert methods["known"]["tau"] == pytest.approx(sum(lengths) / sum(math.ceil(n / 3) for n in lengths))
    assert all(methods[m]["lossless"] is True for m in ("lookup", "hf", "hf-lookup", "known"))
    assert methods["broken"]["lossless"] is False
    assert methods["broken"]["first_mismatch"] == {"question_id": 1, "turn": 1}
    # multi-turn: question 1 has two turns for every method
    turns = [r for r in results["records"] if r["question_id"] == 1 and r["method"] == "lookup"]
    assert [r["turn"] for r in turns] == [0, 1]
    report = (out / "report.md").read_text()
    assert "| lookup |" in report and "| broken |" in report and "NO" in report
    for png in ("speedup_per_category.png", "accepted_length_hist.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"


def test_bench_errors(question_file, tiny_model_dir, capsys):
    assert main(["bench", "--questions", str(question_file), "--methods", "lookup",
                 "--target", str(tiny_model_dir)]) == 2
    assert "needs 'ar'" in capsys.readouterr().err
    assert main(["bench", "--questions", "/no/file.jsonl"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["bench", "--questions", str(question_file), "--methods", "ar,zzz"]) == 2
    assert "unknown method 'zzz'" in capsys.readouterr().err


def test_bench_sampling_run_reports_no_token_comparison(tiny_model_dir, question_file, tmp_path):
    out = tmp_path / "s"
    assert main(["bench", "--questions", str(question_file), "--methods", "ar,hf,lookup", "--target",
                 str(tiny_model_dir), "--max-new-tokens", "8", "--temperature", "1.0", "--top-p", "0.9",
                 "--out", str(out), "--seed", "3"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["temperature"] == 1.0 and results["config"]["questions"] == 4
    for m in results["methods"].values():
        assert m["lossless"] is None and m["new_tokens"] > 0
    # sampled outputs differ between methods (other random draws), which must not be read as a mismatch
    tokens = {m: [r["tokens"] for r in results["records"] if r["method"] == m] for m in ("ar", "lookup")}
    assert tokens["ar"] != tokens["lookup"] and results["methods"]["lookup"]["first_mismatch"] is None


def test_speedup_is_the_ratio_of_mean_per_question_tokens_per_s():
    """Spec-Bench's definition, on hand-made timings (total tokens / total time would give 1.2, not 5/3)."""
    from blockdraft.bench.metrics import summarize
    from blockdraft.bench.run import TurnRecord

    def rec(q, method, seconds):
        return TurnRecord(q, "writing", "g", 0, method, 10, 10, seconds, None, None, {}, list(range(10)))

    records = [rec(1, "ar", 1.0), rec(2, "ar", 2.0), rec(1, "fast", 0.5), rec(2, "fast", 2.0)]
    out = summarize(records, {"methods": ["ar", "fast"]}, {})["methods"]
    # per question: ar 10 and 5 tokens/s, fast 20 and 5 -> (20 + 5) / (10 + 5); median of 2 and 1
    assert out["fast"]["speedup"] == pytest.approx(25 / 15) and out["fast"]["median_speedup"] == pytest.approx(1.5)
    assert out["fast"]["tokens_per_s"] == pytest.approx(12.5) and out["ar"]["tokens_per_s"] == pytest.approx(7.5)


def test_acceptance_by_depth_is_conditional_on_reaching_the_depth():
    from blockdraft.bench.metrics import acceptance_by_depth

    # 10 calls: 4 accepted nothing, 3 accepted one draft, 2 accepted two, 1 accepted three
    rates = acceptance_by_depth({0: 4, 1: 3, 2: 2, 3: 1})
    assert rates == pytest.approx([6 / 10, 3 / 6, 1 / 3])
    assert acceptance_by_depth({0: 5}) == []


def test_drafting_time_per_step_divides_by_target_calls():
    from blockdraft.bench.metrics import summarize
    from blockdraft.bench.run import TurnRecord

    # (question, calls, seconds, draft seconds): 0.03 s of drafting over 10 + 5 calls = 2 ms per step
    records = [TurnRecord(q, "writing", "g", 0, m, 10, calls, 1.0, draft, 0.5, {}, list(range(10)))
               for q, m, calls, draft in ((1, "ar", 10, 0.0), (1, "fast", 10, 0.01), (2, "ar", 10, 0.0),
                                          (2, "fast", 5, 0.02))]
    out = summarize(records, {"methods": ["ar", "fast"]}, {})["methods"]
    assert out["fast"]["draft_ms_per_step"] == pytest.approx(2.0)
    assert out["fast"]["draft_share"] == pytest.approx(0.015)
