"""The OpenAI-compatible server on a tiny target: outputs equal plain decoding, streams add up, bad input gets
its 4xx with OpenAI's error object, the API key is enforced, and the server keeps serving after each."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from blockdraft.decoding import SpeculativeDecoder  # noqa: E402
from blockdraft.drafters import NoDrafter  # noqa: E402
from blockdraft.serve import create_app  # noqa: E402
from serve_fixtures import chat_target  # noqa: E402

PROMPT = "abc abc abc ab"
SERVED = "lookup,ar,lookup:max_branches=2"  # what the operator loads: requests pick among these


@pytest.fixture(scope="module")
def target():
    return chat_target()


@pytest.fixture(scope="module")
def reference():
    """The same weights in another object, so that references never touch the server's target."""
    return chat_target()


@pytest.fixture(scope="module", params=[1, 8], ids=["one-at-a-time", "batched"])
def client(target, request):
    with TestClient(create_app(target, SERVED, max_batch=request.param)) as c:
        yield c


def greedy(reference, ids, max_tokens, stop=()):
    return SpeculativeDecoder(reference, NoDrafter()).generate(ids, max_tokens, stop_strings=stop)


def events(response) -> list:
    """The SSE stream's data payloads, [DONE] included."""
    assert response.headers["content-type"].startswith("text/event-stream")
    lines = [line for line in response.text.split("\n\n") if line]
    assert all(line.startswith("data: ") for line in lines), lines
    return [line[6:] if line[6:] == "[DONE]" else json.loads(line[6:]) for line in lines]


def test_completion_equals_plain_greedy_decoding(client, reference):
    ids = reference.encode(PROMPT, chat_template=False)
    want = greedy(reference, ids, 40)
    r = client.post("/v1/completions", json={"model": "tiny-llama", "prompt": PROMPT, "max_tokens": 40})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion" and body["model"] == "tiny-llama"
    assert body["choices"][0]["text"] == want.text and body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": len(ids), "completion_tokens": 40, "total_tokens": len(ids) + 40}
    stats = body["blockdraft"]
    assert stats["method"] == "lookup" and stats["target_calls"] < 40  # lookup drafts were accepted
    assert stats["tau"] == pytest.approx(40 / stats["target_calls"])


@pytest.mark.parametrize("chat", [False, True])
def test_streamed_text_equals_non_streamed(client, chat):
    path = "/v1/chat/completions" if chat else "/v1/completions"
    body = {"max_tokens": 30, **({"messages": [{"role": "user", "content": PROMPT}]} if chat else {"prompt": PROMPT})}
    full = client.post(path, json=body).json()
    streamed = events(client.post(path, json={**body, "stream": True, "stream_options": {"include_usage": True}}))
    assert streamed[-1] == "[DONE]"
    chunks, usage = streamed[:-2], streamed[-2]
    if chat:
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
        want = full["choices"][0]["message"]["content"]
    else:
        text = "".join(c["choices"][0]["text"] for c in chunks)
        want = full["choices"][0]["text"]
    assert text == want and len(want) > 0
    assert usage["usage"] == full["usage"] and usage["choices"] == []
    assert chunks[-1]["choices"][0]["finish_reason"] == full["choices"][0]["finish_reason"]
    # the per-token flags: one per generated token, and the accepted ones are the accepted drafts
    steps = [c["blockdraft"] for c in chunks if "accepted" in c.get("blockdraft", {})]
    flags = [f for s in steps for f in s["accepted"]]
    assert len(flags) == full["usage"]["completion_tokens"]
    hist = full["blockdraft"]["accepted_hist"]
    assert sum(flags) == sum(int(k) * n for k, n in hist.items()) > 0
    assert all(s["accepted"][-1] is False for s in steps)  # every step ends with the target's bonus token


def test_chat_uses_the_chat_template(client, reference):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": PROMPT}]
    ids = reference.encode_chat(messages)
    r = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 20})
    body = r.json()
    assert body["object"] == "chat.completion" and body["usage"]["prompt_tokens"] == len(ids)
    assert body["choices"][0]["message"] == {"role": "assistant", "content": greedy(reference, ids, 20).text}


def test_method_per_request(client):
    body = {"prompt": PROMPT, "max_tokens": 30}
    ar = client.post("/v1/completions", json={**body, "method": "ar"}).json()
    lookup = client.post("/v1/completions", json={**body, "method": "lookup:max_branches=2"}).json()
    default = client.post("/v1/completions", json=body).json()
    assert ar["blockdraft"]["method"] == "ar" and ar["blockdraft"]["target_calls"] == 30  # one token per call
    assert lookup["blockdraft"]["method"] == "lookup:max_branches=2"
    assert default["blockdraft"]["method"] == "lookup"  # the first served spec
    assert lookup["blockdraft"]["target_calls"] < 30
    assert lookup["choices"][0]["text"] == ar["choices"][0]["text"] == default["choices"][0]["text"]  # lossless


@pytest.mark.parametrize("method", ["suffix", "lookup:max_branches=3", "hybrid:weights=x", "rest:datastore=/etc",
                                    "bpd:checkpoint=/tmp", " "])
def test_a_method_the_server_did_not_load_is_refused_naming_the_served_ones(client, method):
    r = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 3, "method": method})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "method"
    if method.strip():
        assert error["code"] == "invalid_method" and SERVED.replace(",", ", ") in error["message"]
    assert client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 3}).status_code == 200


def test_a_method_name_picks_its_one_served_spec(target):
    with TestClient(create_app(target, "ar,lookup:max_branches=2")) as c:
        r = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 5, "method": "lookup"}).json()
        assert r["blockdraft"]["method"] == "lookup:max_branches=2"
        models = c.get("/v1/models").json()["data"][0]["blockdraft"]
        assert models == {"default_method": "ar", "methods": ["ar", "lookup:max_branches=2"]}


def test_stop_string_cuts_the_text(client, reference):
    ids = reference.encode(PROMPT, chat_template=False)
    text = greedy(reference, ids, 40).text
    stop = text[10:12]
    r = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 40, "stop": [stop]}).json()
    assert r["choices"][0]["text"] == text[: text.find(stop)] and r["choices"][0]["finish_reason"] == "stop"
    streamed = events(client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 40, "stop": stop,
                                                           "stream": True}))
    assert "".join(c["choices"][0]["text"] for c in streamed[:-1]) == r["choices"][0]["text"]


def test_sampling_with_a_seed_is_reproducible(client):
    body = {"prompt": PROMPT, "max_tokens": 30, "temperature": 1.5, "top_p": 0.9}
    a = client.post("/v1/completions", json={**body, "seed": 7}).json()["choices"][0]["text"]
    b = client.post("/v1/completions", json={**body, "seed": 7}).json()["choices"][0]["text"]
    others = {client.post("/v1/completions", json={**body, "seed": s}).json()["choices"][0]["text"]
              for s in range(8, 12)}
    assert a == b and others - {a}


def test_models_health_metrics(client):
    models = client.get("/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["tiny-llama"]
    assert models["data"][0]["blockdraft"]["methods"] == SERVED.split(",")
    assert client.get("/health").json()["status"] == "ok"
    client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 30, "method": "ar"})
    text = client.get("/metrics").text
    samples = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert float(samples['blockdraft_tau{method="ar"}']) == 1.0
    assert float(samples['blockdraft_generated_tokens_total{method="ar"}']) >= 30
    assert float(samples['blockdraft_acceptance_rate{method="lookup",depth="1"}']) > 0
    assert samples["blockdraft_queue_length"] == "0" and samples["blockdraft_active_sequences"] == "0"
    assert float(samples['blockdraft_requests_total{endpoint="completions",outcome="ok"}']) >= 1


def test_a_conversations_second_turn_reuses_the_first_and_keeps_its_output(target, reference):
    """Batched serving keeps finished requests' KV entries: turn 2, which resends turn 1 and its reply, prefills
    only the new message, and its reply is still plain greedy decoding's."""
    with TestClient(create_app(target, "lookup", max_batch=4)) as c:
        messages = [{"role": "user", "content": "abc abc"}]
        first = c.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 12}).json()
        messages += [{"role": "assistant", "content": first["choices"][0]["message"]["content"]},
                     {"role": "user", "content": "cab cab"}]
        second = c.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 12}).json()
        ids = reference.encode_chat(messages)
        assert second["choices"][0]["message"]["content"] == greedy(reference, ids, 12).text
        text = c.get("/metrics").text
    samples = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert samples["blockdraft_prefix_cache_lookups_total"] == "2"
    # at least turn 1's prompt (the template puts the reply and the new message after it)
    assert float(samples["blockdraft_prefix_cache_reused_tokens_total"]) >= len(reference.encode_chat(messages[:1])) - 2
    assert float(samples["blockdraft_prefix_cache_bytes"]) > 0


CONTEXT = 256  # the tiny model's max_position_embeddings

BAD_REQUESTS = [
    # (body, expected status, the error's `param`, the error's `code`)
    (b"{not json", 400, None, "invalid_json"),
    (b"[1, 2]", 400, None, "invalid_json"),
    ({"prompt": PROMPT, "model": "gpt-4"}, 404, "model", "model_not_found"),
    ({"prompt": PROMPT, "method": "nonsense"}, 400, "method", "invalid_method"),
    ({"prompt": PROMPT, "method": "lookup:min_ngram"}, 400, "method", "invalid_method"),
    ({"prompt": PROMPT, "method": "lookup:colour=blue"}, 400, "method", "invalid_method"),
    ({"prompt": PROMPT, "max_tokens": CONTEXT}, 400, "max_tokens", "context_length_exceeded"),
    ({"prompt": "ab" * CONTEXT}, 400, "prompt", "context_length_exceeded"),
    ({"prompt": PROMPT, "max_tokens": 0}, 400, "max_tokens", None),
    ({"prompt": PROMPT, "max_tokens": "ten"}, 400, "max_tokens", None),
    ({"prompt": PROMPT, "temperature": -0.5}, 400, "temperature", None),
    ({"prompt": PROMPT, "temperature": "hot"}, 400, "temperature", None),
    ({"prompt": PROMPT, "temperature": 1e-300}, 400, "temperature", None),  # logits / T: infinities, NaN
    ({"prompt": PROMPT, "temperature": 1e300}, 400, "temperature", None),
    (b'{"prompt": "abc", "temperature": NaN}', 400, "temperature", None),
    (b'{"prompt": "abc", "top_p": NaN}', 400, "top_p", None),
    (b'{"prompt": "abc", "temperature": Infinity}', 400, "temperature", None),
    ({"prompt": PROMPT, "seed": 2**64}, 400, "seed", None),
    ({"prompt": PROMPT, "seed": -(2**63) - 1}, 400, "seed", None),
    ({"prompt": PROMPT, "seed": 1.5}, 400, "seed", None),
    ({"prompt": PROMPT, "stop": ["a" * 257]}, 400, "stop", None),
    ({"prompt": PROMPT, "stop": ["a", "b", "c", "d", "e"]}, 400, "stop", None),
    ({"prompt": PROMPT, "top_p": 0}, 400, "top_p", None),
    ({"prompt": PROMPT, "top_p": 1.5}, 400, "top_p", None),
    ({"prompt": PROMPT, "n": 2}, 400, "n", None),
    ({"prompt": PROMPT, "stop": 5}, 400, "stop", None),
    ({"prompt": ""}, 400, "prompt", None),
    ({"max_tokens": 5}, 400, "prompt", None),
    ({"prompt": [1, 2, 999]}, 400, "prompt", None),
    ({"prompt": PROMPT, "top_k": -1}, 400, "top_k", None),
    ({"prompt": PROMPT, "echo": True}, 400, "echo", "unsupported"),
    ({"prompt": PROMPT, "logprobs": 3}, 400, "logprobs", "unsupported"),
    ({"prompt": PROMPT, "best_of": 2}, 400, "best_of", "unsupported"),
    ({"prompt": PROMPT, "presence_penalty": 0.5}, 400, "presence_penalty", "unsupported"),
    ({"prompt": PROMPT, "logit_bias": {"5": 10}}, 400, "logit_bias", "unsupported"),
]


def test_harmless_defaults_of_unsupported_fields_are_accepted(client):
    body = {"prompt": PROMPT, "max_tokens": 3, "echo": False, "logprobs": None, "best_of": 1,
            "presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": {}, "suffix": None, "top_k": 5}
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("body,status,param,code", BAD_REQUESTS)
def test_bad_input_gets_its_4xx_and_the_server_keeps_serving(client, body, status, param, code):
    kw = {"content": body} if isinstance(body, bytes) else {"json": body}
    r = client.post("/v1/completions", headers={"content-type": "application/json"}, **kw)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert (error["param"], error["code"]) == (param, code)
    assert "Traceback" not in r.text
    ok = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 3})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3


def test_chat_content_given_as_text_parts(client):
    plain = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": PROMPT}],
                                                      "max_tokens": 10}).json()
    parts = [{"type": "text", "text": PROMPT[:5]}, {"type": "text", "text": PROMPT[5:]}]
    split = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": parts}],
                                                      "max_tokens": 10}).json()
    assert split["choices"] == plain["choices"] and split["usage"] == plain["usage"]


def test_bad_chat_messages(client):
    for messages in ([], [{"role": "user"}], [{"role": "wizard", "content": "x"}], "hello",
                     [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]):
        r = client.post("/v1/chat/completions", json={"messages": messages})
        assert r.status_code == 400 and r.json()["error"]["param"].startswith("messages"), r.text


def test_chat_without_a_template_is_refused(reference):
    bare = chat_target()
    bare.tokenizer.chat_template = None
    with TestClient(create_app(bare, "ar")) as c:
        r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 400 and "/v1/completions" in r.json()["error"]["message"]


def test_oversized_bodies_get_413(target):
    with TestClient(create_app(target, "lookup", max_body_bytes=1000)) as c:
        big = json.dumps({"prompt": "a" * 2000}).encode()
        r = c.post("/v1/completions", content=big, headers={"content-type": "application/json"})
        assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"
        # no content-length header (chunked upload): counted as it arrives
        r = c.post("/v1/completions", content=iter([big[:600], big[600:]]))
        assert r.status_code == 413
        assert c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2}).status_code == 200


def test_the_default_limit_is_one_mebibyte(client):
    r = client.post("/v1/completions", content=b" " * (1 << 20) + b"{}", headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_unknown_routes_and_verbs_answer_in_openai_form(client):
    r = client.get("/v1/nothing")
    assert r.status_code == 404 and "error" in r.json()
    r = client.get("/v1/completions")
    assert r.status_code == 405 and "error" in r.json()


def test_api_key(target):
    with TestClient(create_app(target, "lookup", api_key="s3cret")) as c:
        body = {"prompt": PROMPT, "max_tokens": 2}
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"},
                        {"Authorization": "Basic s3cret"}):
            for path, call in (("/v1/completions", c.post), ("/v1/chat/completions", c.post),
                               ("/v1/models", c.get), ("/metrics", c.get)):
                r = call(path, headers=headers, **({"json": body} if call == c.post else {}))
                assert r.status_code == 401, (path, headers)
                assert r.json()["error"]["code"] == "invalid_api_key"
        good = {"Authorization": "Bearer s3cret"}
        assert c.post("/v1/completions", json=body, headers=good).status_code == 200
        assert c.get("/v1/models", headers=good).status_code == 200
        assert c.get("/health").status_code == 200  # for load balancers: no key, no data
        assert c.get("/").status_code == 200


def test_a_launch_method_that_drafts_on_the_targets_cache_is_served_one_request_at_a_time(target, reference):
    """`quantized` drafts through the single-sequence cache, which the batch decoder does not have: the server
    launched with it decodes requests one at a time instead of refusing each, and its output is still greedy's."""
    ids = reference.encode(PROMPT, chat_template=False)
    want = greedy(reference, ids, 40)
    with TestClient(create_app(target, "quantized,lookup", max_batch=8)) as c:
        for method in (None, "lookup"):
            extra = {} if method is None else {"method": method}
            r = c.post("/v1/completions", json={"model": "tiny-llama", "prompt": PROMPT, "max_tokens": 40, **extra})
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["text"] == want.text
            assert r.json()["blockdraft"]["method"] == (method or "quantized")
        assert c.app.state.scheduler._prepared and c.app.state.scheduler.batch is None  # not the batch decoder


@pytest.mark.parametrize("spec,words", [("nope", "unknown method 'nope'"),
                                        ("lookup,nope", "unknown method 'nope'"),
                                        ("hybrid:sources=suffix+recycle:weights=x", "bad option for method 'hybrid'"),
                                        ("lookup,lookup", "given twice"), (",", "no method to serve")])
def test_a_launch_method_that_cannot_be_built_fails_at_startup(target, spec, words):
    from blockdraft.errors import BlockdraftError

    with pytest.raises(BlockdraftError, match=words):
        create_app(target, spec)


def test_extreme_but_valid_values_are_served(client):
    body = {"prompt": PROMPT, "max_tokens": 5, "temperature": 0.01, "seed": 2**64 - 1, "stop": ["z" * 256]}
    assert client.post("/v1/completions", json=body).status_code == 200
    assert client.post("/v1/completions", json={**body, "seed": -(2**63), "top_k": 10**30}).status_code == 200


@pytest.mark.parametrize("args,words", [(["--method", "nope"], "unknown method 'nope'"),
                                        (["--method", "lookup,nope"], "unknown method 'nope'"),
                                        (["--max-queue", "0"], "--max-queue"),
                                        (["--port", "70000"], "--port"), (["--max-batch", "0"], "--max-batch"),
                                        (["--prefix-cache-mb", "-1"], "--prefix-cache-mb"),
                                        (["--prefix-cache-mb", "lots"], "--prefix-cache-mb")])
def test_serve_command_refuses_bad_flags_in_one_line(args, words, capsys):
    from blockdraft.cli import main

    assert main(["serve", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err and "Traceback" not in err


def test_serve_command_refuses_a_port_in_use(capsys):
    import socket

    from blockdraft.cli import main

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["serve", "--port", str(port), "--target", "/does/not/matter"]) == 2
    words = f"cannot listen on 127.0.0.1:{port}"
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err and "Traceback" not in err


@pytest.mark.parametrize("max_batch", [1, 2])
def test_served_options_cannot_grow_a_tree_beyond_the_cap(target, reference, max_batch):
    import random

    from blockdraft.drafters import DraftContext
    from blockdraft.methods import make_drafter
    from blockdraft.serve.scheduler import MAX_TREE_NODES

    rng = random.Random(0)
    prompt = "".join(rng.choice("abcdefgh ") for _ in range(200))
    method = "lookup:max_branches=64:num_tokens=30:min_ngram=1:max_ngram=1:min_gain=0"
    ids = reference.encode(prompt, chat_template=False)
    uncapped = make_drafter(method, reference).propose(DraftContext(ids, None, 39))
    assert len(uncapped) > 2 * MAX_TREE_NODES  # what the options ask for
    with TestClient(create_app(target, method, max_batch=max_batch)) as c:
        r = c.post("/v1/completions", json={"prompt": prompt, "max_tokens": 40}).json()
    stats = r["blockdraft"]
    assert stats["tree_nodes"] <= stats["target_calls"] * MAX_TREE_NODES
    assert r["choices"][0]["text"] == greedy(reference, ids, 40).text  # cut trees, same output
