"""`blockdraft selfdistill`: the target's own replies through the engine, appended to JSONL and resumable."""

from __future__ import annotations

import json

import pytest
from tiny_chat_targets import chat_tokenizer, tiny_model

from blockdraft import Target
from blockdraft.cli import main
from blockdraft.data.sharegpt import load_conversations
from blockdraft.decoding import SpeculativeDecoder
from blockdraft.methods import make_drafter
from blockdraft.verify import SamplingParams


@pytest.fixture(scope="module")
def chat_model_dir(tmp_path_factory):
    """A tiny Qwen2 with a Llama-3-style chat template, saved as a model folder (`--target DIR`)."""
    folder = tmp_path_factory.mktemp("chat") / "tiny-qwen2"
    tok = chat_tokenizer("llama3")
    tiny_model("qwen2", tok).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture
def prompts(tmp_path):
    records = [{"id": f"p{i}", "conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": "old"}]}
               for i, q in enumerate(["tell me more", "now tell me", "more, now!", "me? tell.", "what now", "go on"])]
    path = tmp_path / "prompts.json"
    path.write_text(json.dumps(records))
    return path


def lines(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def run(model_dir, data, out, *extra) -> int:
    return main(["selfdistill", str(out), "--target", str(model_dir), "--data", str(data), "--dtype", "float32",
                 "--max-new-tokens", "12", *extra])


def test_replies_are_the_targets_own_and_resume_skips_done(chat_model_dir, prompts, tmp_path, capsys):
    out = tmp_path / "self.jsonl"
    assert run(chat_model_dir, prompts, out, "--max-tokens", "20") == 0
    first = lines(out)
    assert 1 <= len(first) < 6 and sum(r["reply_tokens"] for r in first) >= 20
    target = Target.load(str(chat_model_dir), dtype="float32")
    ar = SpeculativeDecoder(target, make_drafter("ar", target))
    for r in first:  # lookup decoding is lossless: each reply is the target's greedy reply
        assert r["conversations"][1]["value"] == ar.generate(target.encode(r["conversations"][0]["value"]), 12).text
        assert r["selfdistill"]["method"] == "lookup" and r["selfdistill"]["dtype"] == "float32"
    capsys.readouterr()
    assert run(chat_model_dir, prompts, out, "--max-tokens", "1000") == 0  # continue: all the prompts
    assert "stopped: prompts exhausted" in capsys.readouterr().out
    second = lines(out)
    assert second[: len(first)] == first  # appended, nothing rewritten
    assert sorted(r["id"] for r in second) == [f"p{i}" for i in range(6)]  # each prompt once
    records = load_conversations(str(out))  # what `blockdraft train --data OUT.jsonl` reads
    assert [r["id"] for r in records] == [r["id"] for r in second]


def test_sampled_replies_resume_to_what_one_run_writes(chat_model_dir, prompts, tmp_path):
    sampled = ["--temperature", "0.9", "--seed", "7", "--method", "ar"]
    assert run(chat_model_dir, prompts, tmp_path / "one.jsonl", *sampled) == 0
    assert run(chat_model_dir, prompts, tmp_path / "two.jsonl", *sampled, "--max-tokens", "15") == 0
    with (tmp_path / "two.jsonl").open("a") as f:
        f.write('{"id": "torn li')  # a run killed while writing
    assert run(chat_model_dir, prompts, tmp_path / "two.jsonl", *sampled) == 0
    one, two = lines(tmp_path / "one.jsonl"), [json.loads(x) for x in (tmp_path / "two.jsonl").read_text()
                                               .splitlines() if not x.startswith('{"id": "torn')]
    assert one == two
    target = Target.load(str(chat_model_dir), dtype="float32")
    greedy = SpeculativeDecoder(target, make_drafter("ar", target))
    assert any(r["conversations"][1]["value"] != greedy.generate(target.encode(r["conversations"][0]["value"]),
                                                                 12).text for r in one)  # really sampled
    again = SpeculativeDecoder(target, make_drafter("ar", target), SamplingParams(0.9))
    from blockdraft.data.selfdistill import record_seed

    r = one[0]
    assert again.generate(target.encode(r["conversations"][0]["value"]), 12,
                          seed=record_seed(7, r["id"])).text == r["conversations"][1]["value"]


def test_later_turns_answer_the_targets_own_earlier_replies(chat_model_dir, tmp_path):
    record = {"id": "m", "conversations": [{"from": "human", "value": "tell me"}, {"from": "gpt", "value": "x"},
                                           {"from": "human", "value": "more"}, {"from": "gpt", "value": "y"},
                                           {"from": "human", "value": "now"}]}
    data = tmp_path / "multi.json"
    data.write_text(json.dumps([record]))
    assert run(chat_model_dir, data, tmp_path / "m.jsonl", "--turns", "2", "--max-prompt-tokens", "400") == 0
    (r,) = lines(tmp_path / "m.jsonl")
    turns = r["conversations"]
    assert [t["from"] for t in turns] == ["human", "gpt", "human", "gpt"] and turns[2]["value"] == "more"
    target = Target.load(str(chat_model_dir), dtype="float32")
    ar = SpeculativeDecoder(target, make_drafter("ar", target))
    history = [{"role": "user", "content": "tell me"}, {"role": "assistant", "content": turns[1]["value"]},
               {"role": "user", "content": "more"}]
    assert turns[3]["value"] == ar.generate(target.encode_chat(history), 12).text  # given its own first reply


@pytest.mark.parametrize("extra", [(), ("--temperature", "0.9", "--seed", "3")])
def test_batched_replies_are_the_same_conversations(chat_model_dir, prompts, tmp_path, extra):
    """--batch 3 (continuous batching, two turns each) writes what one conversation at a time writes, in
    float32: every turn greedy (or sampled from its own seed) given the target's own earlier replies."""
    two = ["--turns", "2", "--max-prompt-tokens", "400", "--method", "lookup", *extra]
    data = tmp_path / "multi.json"
    records = json.loads(prompts.read_text())
    for r in records:  # a second human turn each
        r["conversations"] += [{"from": "human", "value": "and more"}]
    data.write_text(json.dumps(records))
    assert run(chat_model_dir, data, tmp_path / "one.jsonl", *two) == 0
    assert run(chat_model_dir, data, tmp_path / "three.jsonl", *two, "--batch", "3") == 0
    one, three = lines(tmp_path / "one.jsonl"), lines(tmp_path / "three.jsonl")
    # every conversation written (greedy), or all but one whose sampled first reply ended at once (empty: skipped)
    assert len(one) >= 5 and any(len(r["conversations"]) == 4 for r in one)
    for r in one + three:
        r["selfdistill"].pop("batch")
    assert sorted(three, key=lambda r: r["id"]) == sorted(one, key=lambda r: r["id"])


def test_time_limit_and_errors(chat_model_dir, prompts, tmp_path, capsys, tiny_model_dir):
    assert run(chat_model_dir, prompts, tmp_path / "t.jsonl", "--max-minutes", "1e-9") == 0
    assert "stopped: time limit" in capsys.readouterr().out
    assert run(chat_model_dir, prompts, tmp_path / "t.jsonl", "--method", "nope") == 2
    assert "unknown method 'nope'" in capsys.readouterr().err
    assert run(tiny_model_dir, prompts, tmp_path / "t.jsonl") == 2  # a model without a chat template
    assert "needs a target with a tokenizer and a chat template" in capsys.readouterr().err


def test_selfdistilled_file_trains_a_drafter_through_the_cli(chat_model_dir, tmp_path, capsys):
    """The whole flow for a non-ChatML target: selfdistill, train on the JSONL, generate losslessly."""
    words = ["tell", "me", "more", "now", "what", "go", "on", "so"]
    records = [{"id": f"q{i}", "conversations": [{"from": "human", "value": f"{words[i % 8]} {words[i // 8 % 8]}"}]}
               for i in range(40)]
    (tmp_path / "prompts.json").write_text(json.dumps(records))
    data = tmp_path / "self.jsonl"
    assert run(chat_model_dir, tmp_path / "prompts.json", data, "--max-new-tokens", "24") == 0
    out = tmp_path / "bpd"
    assert main(["train", "--drafter", "bpd", "--target", str(chat_model_dir), "--data", str(data), "--store",
                 str(tmp_path / "store"), "--max-tokens", "5000", "--valid-tokens", "0", "--num-heads", "2",
                 "--draft-vocab", "0", "--epochs", "3", "--lr", "0.005", "--out", str(out), "--dtype", "float32"]) == 0
    assert json.loads((out / "config.json").read_text())["training"]["steps"] >= 3
    capsys.readouterr()
    results = {}
    for method in ("ar", f"bpd:checkpoint={out}"):
        assert main(["generate", "tell me more", "--target", str(chat_model_dir), "--method", method, "--json",
                     "--dtype", "float32", "--max-new-tokens", "30", "--no-pace"]) == 0  # calls are compared
        results[method] = json.loads(capsys.readouterr().out)
    ar, bpd = results.values()
    assert bpd["tokens"] == ar["tokens"] and bpd["target_calls"] < ar["target_calls"]


def test_a_part_without_held_out_conversations_trains_without_validation(tiny, tmp_path, capsys):
    """A later part of a self-distilled file holds no held-out ids: no validation store (its tau would read 1.0)."""
    from conftest import conversations

    from blockdraft.data.sharegpt import split_conversations
    from blockdraft.train.run import prepare_stores

    records, _ = split_conversations(conversations(30))  # only ids that hash into the training split
    part = tmp_path / "part.jsonl"
    part.write_text("".join(json.dumps(r) + "\n" for r in records))
    train_store, valid_store = prepare_stores(tiny, str(part), 1000, 500, store=str(tmp_path / "store"), max_len=64)
    assert valid_store is None and train_store.meta["n_tokens"] > 0
    assert "holds no held-out conversations: training without validation" in capsys.readouterr().out

    first = next(f"v{i}" for i in range(10_000) if split_conversations([{"id": f"v{i}"}])[1])
    records[0]["id"] = first  # one held-out conversation: validation as before
    part.write_text("".join(json.dumps(r) + "\n" for r in records))
    _, valid_store = prepare_stores(tiny, str(part), 1000, 500, store=str(tmp_path / "store2"), max_len=64)
    assert valid_store is not None and valid_store.meta["n_tokens"] > 0


def test_several_sources_fill_the_store_in_the_order_given(tiny, tmp_path):
    """`--data own.jsonl,other.jsonl`: every conversation of the first source is stored before any of the second,
    which fills the rest (one file of both, shuffled as one source, would interleave them and drop some own
    replies at this size)."""
    from conftest import conversations

    from blockdraft.data.sharegpt import split_conversations
    from blockdraft.train.features import conversation_ids
    from blockdraft.train.run import prepare_stores

    own, _ = split_conversations(conversations(40, seed=3))
    other, _ = split_conversations(conversations(80, seed=4))
    paths = []
    for name, records in (("own", own[:8]), ("other", other)):
        paths.append(tmp_path / f"{name}.jsonl")
        paths[-1].write_text("".join(json.dumps(r) + "\n" for r in records))
    source = {}
    for name, records in (("own", own[:8]), ("other", other)):
        for r in records:
            ids, _ = conversation_ids(tiny.tokenizer, r, 64, tiny.eos_token_ids)
            source[tuple(ids)] = name
    own_tokens = sum(len(ids) for ids, name in source.items() if name == "own")
    store, _ = prepare_stores(tiny, f"{paths[0]},{paths[1]}", own_tokens + 600, 0, store=str(tmp_path / "s"),
                              max_len=64)
    stored = [source.get(tuple(int(t) for t in store.tokens[a:b]), "cut") for a, b in store.sequences()]
    assert stored[:8] == ["own"] * 8  # all of the first source, first
    assert stored[8:-1] and set(stored[8:-1]) == {"other"}  # then the second fills the store (the last may be cut)
    assert store.meta["n_tokens"] > own_tokens + 600 - 16  # full (it stops with fewer than 16 tokens left)


def test_data_names_its_missing_or_empty_source(tmp_path):
    from blockdraft.data.sharegpt import data_sources
    from blockdraft.errors import BlockdraftError

    good = tmp_path / "a.jsonl"
    good.write_text("")
    with pytest.raises(BlockdraftError, match="'nope.jsonl' not found"):
        data_sources(f"{good},nope.jsonl")
    with pytest.raises(BlockdraftError, match="empty source"):
        data_sources(f"{good},")
    assert data_sources(f"{good}, {good}") == [str(good), str(good)]


def test_generate_engine_writes_the_targets_greedy_replies(chat_model_dir, prompts, tmp_path):
    """Left-padded batches through transformers' generate (prompts of different lengths): in float32 each reply
    is the target's own greedy reply, in the same record format."""
    out = tmp_path / "gen.jsonl"
    assert run(chat_model_dir, prompts, out, "--engine", "generate", "--batch", "4", "--max-tokens", "1000") == 0
    records = lines(out)
    assert len(records) >= 5  # two batches: 4, then the rest
    target = Target.load(str(chat_model_dir), dtype="float32")
    ar = SpeculativeDecoder(target, make_drafter("ar", target))
    for r in records:
        want = ar.generate(target.encode(r["conversations"][0]["value"]), 12)
        assert r["conversations"][1]["value"] == want.text
        assert r["reply_tokens"] == len([t for t in want.tokens if t not in target.eos_token_ids])
        assert r["selfdistill"]["method"].startswith("ar (transformers generate")


@pytest.mark.parametrize("extra", [["--temperature", "0.7"], ["--turns", "2"]])
def test_generate_engine_refuses_sampling_and_later_turns(chat_model_dir, prompts, tmp_path, capsys, extra):
    assert run(chat_model_dir, prompts, tmp_path / "x.jsonl", "--engine", "generate", *extra) != 0
    assert "--engine generate writes greedy first-turn replies" in capsys.readouterr().err


def test_generate_engine_cuts_replies_at_the_targets_stop_strings(chat_model_dir, prompts, tmp_path):
    """A base model's frame ends a reply at a stop string (generation_config.stop_strings): transformers' generate
    needs the tokenizer to see it, and the reply is the text before it, as our decoder writes it."""
    import shutil

    from transformers import GenerationConfig

    folder = tmp_path / "with-stop"
    shutil.copytree(chat_model_dir, folder)
    target = Target.load(str(folder), dtype="float32")
    ar = SpeculativeDecoder(target, make_drafter("ar", target))
    whole = ar.generate(target.encode("tell me more"), 12)
    stop = target.decode(whole.tokens[4:6])  # a string this reply reaches after a few tokens
    assert stop.strip() and stop in whole.text
    config = GenerationConfig.from_pretrained(folder) if (folder / "generation_config.json").is_file() \
        else GenerationConfig()
    config.stop_strings = [stop]
    config.save_pretrained(folder)
    target = Target.load(str(folder), dtype="float32")
    assert target.stop_strings == (stop,)
    ar = SpeculativeDecoder(target, make_drafter("ar", target))
    out = tmp_path / "gen.jsonl"
    assert run(folder, prompts, out, "--engine", "generate", "--batch", "4", "--max-tokens", "1000") == 0
    records = lines(out)
    assert len(records) >= 5
    cut = 0
    for r in records:
        want = ar.generate(target.encode(r["conversations"][0]["value"]), 12)
        assert r["conversations"][1]["value"] == want.text
        cut += stop not in r["conversations"][1]["value"] and len(want.tokens) < 12
    assert cut >= 1  # the stop string ended at least one reply early
