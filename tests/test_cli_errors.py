"""Bad command-line input: one line `blockdraft ...: error: ...`, exit code 2, nothing loaded in vain;
and the shipped Spec-Bench questions as the bench's default from any working directory."""

import json

import pytest

from blockdraft.cli import main


@pytest.fixture
def question_file(tmp_path):
    rows = [{"question_id": 1, "category": "writing", "turns": ["abc abc"]},
            {"question_id": 2, "category": "summarization", "turns": ["the cat sat."]}]
    path = tmp_path / "q.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def run_error(args, capsys) -> str:
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("command", ["generate", "bench", "analyze", "train", "selfdistill"])
@pytest.mark.parametrize("threads", ["0", "-3"])
def test_threads_must_be_positive(command, threads, capsys):
    extra = {"generate": ["hi"], "train": ["--drafter", "bpd", "--out", "x"], "selfdistill": ["x.jsonl"]}.get(
        command, [])
    err = run_error([command, *extra, "--threads", threads], capsys)
    assert "--threads" in err and "positive integer" in err and threads in err


@pytest.mark.parametrize("command", ["bench", "analyze"])
def test_per_category_must_be_positive(command, capsys):
    err = run_error([command, "--per-category", "0"], capsys)
    assert "--per-category" in err and "positive integer, got 0" in err


@pytest.mark.parametrize("command", ["generate", "bench", "analyze", "selfdistill"])
def test_max_new_tokens_must_be_an_integer(command, capsys):
    extra = {"generate": ["hi"], "selfdistill": ["x.jsonl"]}.get(command, [])
    err = run_error([command, *extra, "--max-new-tokens", "abc"], capsys)
    assert "--max-new-tokens" in err and "'abc'" in err


@pytest.mark.parametrize("defect,line", [("{not json", 2), ('{"question_id": 3, "turns": ["x"]}', 2),
                                         ('{"question_id": 3, "category": "qa", "turns": "x"}', 2)])
def test_malformed_question_line_is_named(defect, line, question_file, capsys):
    rows = question_file.read_text().splitlines()
    question_file.write_text("\n".join([rows[0], defect, rows[1]]))
    err = run_error(["bench", "--questions", str(question_file)], capsys)
    assert f"{question_file}:{line}:" in err


def test_categories_that_select_nothing(question_file, capsys):
    err = run_error(["bench", "--questions", str(question_file), "--categories", "poetry"], capsys)
    assert "poetry" in err and "summarization, writing" in err


def test_greedy_acceptor_refused_when_sampling(question_file, capsys):
    for args in (["generate", "hi"], ["bench", "--questions", str(question_file)]):
        err = run_error([*args, "--acceptor", "greedy", "--temperature", "0.7", "--target", "/no/model"], capsys)
        assert "greedy acceptor needs temperature 0" in err  # checked before the (missing) model is loaded


def test_unknown_method_option(tiny_model_dir, question_file, tmp_path, capsys):
    err = run_error(["generate", "hi", "--method", "lookup:foo=1", "--target", str(tiny_model_dir)], capsys)
    assert "bad option for method 'lookup'" in err and "foo" in err
    err = run_error(["bench", "--questions", str(question_file), "--methods", "ar,lookup:foo=1",
                     "--target", str(tiny_model_dir), "--out", str(tmp_path / "o")], capsys)
    assert "bad option for method 'lookup'" in err and "foo" in err


def test_bench_defaults_to_the_shipped_spec_bench_from_any_directory(tiny_model_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # no shared/ folder anywhere above: the questions come from the package
    rc = main(["bench", "--methods", "ar,lookup", "--categories", "qa", "--per-category", "1",
               "--max-new-tokens", "4", "--target", str(tiny_model_dir), "--out", "out"])
    assert rc == 0
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["config"]["questions"] == 1
    assert {r["category"] for r in results["records"]} == {"qa"}
    for name in ("results.json", "report.md", "speedup_per_category.png", "accepted_length_hist.png"):
        assert (tmp_path / "out" / name).stat().st_size > 0
    named = main(["bench", "--questions", "spec-bench", "--methods", "ar", "--categories", "translation",
                  "--per-category", "1", "--max-new-tokens", "2", "--target", str(tiny_model_dir), "--out", "o2"])
    records = json.loads((tmp_path / "o2" / "results.json").read_text())["records"]
    assert named == 0 and records[0]["category"] == "translation"
