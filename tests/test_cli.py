"""The `blockdraft` command: streaming, --json fields, and one-line errors with exit code 2."""

import json
import math
import subprocess
import sys

import pytest

from blockdraft.cli import main
from blockdraft.methods import METHODS, Method

from drafters_for_tests import KnownAcceptanceDrafter


def run_cli(*args):
    proc = subprocess.run([sys.executable, "-m", "blockdraft.cli", *args], capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stdout, proc.stderr


def generate_json(capsys, model_dir, *args) -> dict:
    assert main(["generate", "abc abc abc", "--target", str(model_dir), "--max-new-tokens", "12", "--json",
                 "--no-chat-template", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_generate_json_on_tiny_model(tiny_model_dir, capsys, monkeypatch):
    known = Method("known", "test", lambda target, **kw: KnownAcceptanceDrafter(target.model, 2))
    monkeypatch.setitem(METHODS, "known", known)
    ar = generate_json(capsys, tiny_model_dir, "--method", "ar")
    for key in ("text", "tokens", "new_tokens", "target_calls", "tau", "tokens_per_s", "method", "lossless"):
        assert key in ar
    lookup = generate_json(capsys, tiny_model_dir, "--method", "lookup")
    assert lookup["method"] == "lookup" and lookup["tokens"] == ar["tokens"] and lookup["text"] == ar["text"]
    # a drafter right for exactly 2 tokens per step: 3 tokens per target call, the last call takes the rest
    known = generate_json(capsys, tiny_model_dir, "--method", "known", "--no-pace")  # pacing would change the count
    paced = generate_json(capsys, tiny_model_dir, "--method", "known")
    assert paced["tokens"] == ar["tokens"] and 0 <= paced["plain_steps"] <= paced["target_calls"]
    n = ar["new_tokens"]
    assert known["tokens"] == ar["tokens"] and n > 3
    assert known["target_calls"] == math.ceil(n / 3) and known["tau"] == pytest.approx(n / math.ceil(n / 3))
    # a lossy acceptance rule says so
    assert generate_json(capsys, tiny_model_dir, "--acceptor", "typical", "--temperature", "1")["lossless"] is False


def test_streamed_text_equals_json_text(tiny_model_dir, capsys):
    common = ["--target", str(tiny_model_dir), "--max-new-tokens", "16", "--no-chat-template", "--dtype", "float32"]
    assert main(["generate", "hello world", "--method", "ar", *common]) == 0
    streamed = capsys.readouterr().out
    assert main(["generate", "hello world", "--method", "lookup", "--json", *common]) == 0
    assert streamed == json.loads(capsys.readouterr().out)["text"] + "\n"


def test_stop_string_cuts_the_text(tiny_model_dir, capsys):
    common = ["--target", str(tiny_model_dir), "--max-new-tokens", "30", "--no-chat-template", "--json"]
    main(["generate", "hello world", *common])
    full = json.loads(capsys.readouterr().out)["text"]
    stop = full[5:7]
    main(["generate", "hello world", *common, "--stop", stop])
    cut = json.loads(capsys.readouterr().out)
    assert cut["text"] == full[: full.index(stop)] and cut["stop_reason"] == "stop_string"


@pytest.mark.parametrize(
    "args,message",
    [
        (["generate", ""], "prompt is empty"),
        (["generate", "hi", "--max-new-tokens", "0"], "--max-new-tokens: must be a positive integer, got 0"),
        (["generate", "hi", "--temperature", "-0.5"], "temperature must be >= 0"),
        (["generate", "hi", "--top-p", "1.5"], "top_p must be in (0, 1]"),
        (["generate", "hi", "--method", "nope"], "unknown method 'nope'"),
        (["generate", "hi", "--target", "/no/such/model"], "unknown target '/no/such/model'"),
    ],
)
def test_bad_input_gives_one_line_error_and_exit_2(args, message, tiny_model_dir, capsys):
    if "--target" not in args:
        args = args + ["--target", str(tiny_model_dir)]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_prompt_longer_than_context(tiny_model_dir, capsys):
    assert main(["generate", "ab " * 200, "--target", str(tiny_model_dir), "--no-chat-template"]) == 2
    assert "context holds 256" in capsys.readouterr().err


def test_not_a_causal_lm_and_corrupt_gguf(tmp_path, capsys):
    from transformers import ViTConfig

    ViTConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
              intermediate_size=8).save_pretrained(tmp_path / "vit")
    assert main(["generate", "hi", "--target", str(tmp_path / "vit")]) == 2
    assert "not a causal language model" in capsys.readouterr().err
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"this is not a gguf file")
    assert main(["generate", "hi", "--target", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "could not read" in err and "broken.gguf" in err and len(err.strip().splitlines()) == 1


def test_console_entry_point_exit_code(tiny_model_dir):
    rc, out, err = run_cli("generate", "hi", "--target", str(tiny_model_dir), "--temperature", "-1")
    assert rc == 2 and "temperature must be >= 0" in err and "Traceback" not in err


def test_text_streamer_holds_back_a_possible_stop_string():
    import io

    from blockdraft.cli import TextStreamer

    pieces = {1: "Hel", 2: "lo ", 3: "EN", 4: "D!"}
    out = io.StringIO()
    streamer = TextStreamer(lambda ids: "".join(pieces[i] for i in ids), stop_strings=("END",), out=out)
    streamer([1, 2])
    assert out.getvalue() == "Hell"  # the last two characters could start "END"
    streamer([3])
    assert "EN" not in out.getvalue()
    streamer.finish("Hello ")  # the decoder cut the text at the stop string
    assert out.getvalue() == "Hello \n"


def test_train_datastore_then_generate_with_rest(tiny_model_dir, tmp_path, capsys):
    from conftest import conversations

    data = tmp_path / "conversations.json"
    data.write_text(json.dumps(conversations(30) + [{"id": "abc", "conversations": [
        {"from": "human", "value": "abc abc abc"}, {"from": "gpt", "value": "abc abc abc abc abc abc"}]}]))
    out = tmp_path / "ds"
    assert main(["train", "--drafter", "datastore", "--target", str(tiny_model_dir), "--data", str(data),
                 "--out", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["kind"] == "datastore" and config["tokens"] > 100
    capsys.readouterr()
    ar = generate_json(capsys, tiny_model_dir, "--method", "ar")
    rest = generate_json(capsys, tiny_model_dir, "--method", f"rest:datastore={out}")
    assert rest["tokens"] == ar["tokens"] and rest["method"] == f"rest:datastore={out}"
    code, _, err = run_cli("generate", "abc", "--target", str(tiny_model_dir), "--method",
                           f"rest:datastore={tmp_path / 'missing'}")
    assert code == 2 and "not a readable datastore" in err and "Traceback" not in err
