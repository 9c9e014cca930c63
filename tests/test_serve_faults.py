"""A server no request can break. In the middle of a running batch of good requests: a method the operator did not
load, a drafter that raises in propose, drafters that raise while their request is admitted (fork, reset), and a
temperature that turns the target's distribution into NaN each end their own request with a 4xx/5xx and the reason,
the good requests finish with the output they have alone, and the server goes on. And the bounded queue: 429 past
it, and a queued request whose client has gone is dropped before it starts."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from blockdraft.decoding import SpeculativeDecoder  # noqa: E402
from blockdraft.drafters import NoDrafter  # noqa: E402
from blockdraft.methods import Method, register, unregister  # noqa: E402
from blockdraft.serve.scheduler import Job, Scheduler  # noqa: E402
from blockdraft.serve.schemas import GenerationRequest  # noqa: E402
from blockdraft.verify import SamplingParams  # noqa: E402
from drafters_for_tests import FailingDrafter  # noqa: E402
from serve_fixtures import HANG_S, chat_target, metric, running_server, slow_down, wait_until  # noqa: E402

STAGES = ("fork", "reset", "propose")
GOOD = ["abc abc abc ab", "xyz xyz xyz", "hello hello hello"]


@pytest.fixture
def failing_methods():
    """fail-fork, fail-reset, fail-propose: test-only methods, registered as any method is."""
    for stage in STAGES:
        register(Method(f"fail-{stage}", f"raises in {stage} (tests only)",
                        lambda target, stage=stage, **kw: FailingDrafter(stage)))
    yield [f"fail-{stage}" for stage in STAGES]
    for stage in STAGES:
        unregister(f"fail-{stage}")


def alone(prompts: list[str], max_tokens: int) -> list[str]:
    """Each prompt's greedy output, decoded on its own by plain decoding."""
    ref = chat_target()
    return [SpeculativeDecoder(ref, NoDrafter()).generate(ref.encode(p, chat_template=False), max_tokens).text
            for p in prompts]


def test_one_requests_failure_is_its_own(monkeypatch, failing_methods):
    max_tokens = 100
    want = alone(GOOD, max_tokens)
    assert len(set(want)) == len(GOOD)  # different answers: a mix-up would show
    slow_down(monkeypatch)  # 100 steps of `ar` take >= 2 s: the bad requests come and go meanwhile
    methods = ["ar", "lookup", "lookup"]
    got, finished_at, bad = {}, {}, {}
    with running_server(chat_target(), ",".join(["lookup", "ar", *failing_methods]), max_batch=4) as url:
        def ask(i: int) -> None:
            body = {"prompt": GOOD[i], "max_tokens": max_tokens, "method": methods[i]}
            got[i] = httpx.post(url + "/v1/completions", json=body, timeout=HANG_S)
            finished_at[i] = time.monotonic()

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(GOOD))]
        for t in threads:
            t.start()
        wait_until(lambda: httpx.get(url + "/health").json()["active"] == len(GOOD), "the good requests did not start")
        for name, extra in [("a method option no one loaded", {"method": "hybrid:weights=x"}),
                            ("propose", {"method": "fail-propose"}), ("fork", {"method": "fail-fork"}),
                            ("reset", {"method": "fail-reset"}), ("NaN temperature", {"temperature": 1e-300})]:
            body = {"prompt": "abc abc abc", "max_tokens": 50, **extra}
            bad[name] = httpx.post(url + "/v1/completions", json=body, timeout=HANG_S)
        bad_answered = time.monotonic()
        for t in threads:
            t.join(HANG_S)
        after = httpx.post(url + "/v1/completions", json={"prompt": GOOD[1], "max_tokens": max_tokens}, timeout=HANG_S)
        health = httpx.get(url + "/health").json()
    # the bad ones: each its own status and reason, no stack trace
    assert bad["a method option no one loaded"].status_code == 400
    assert bad["a method option no one loaded"].json()["error"]["code"] == "invalid_method"
    for stage in STAGES:
        r = bad[stage]
        assert r.status_code == 500 and f"simulated {stage} failure" in r.json()["error"]["message"], r.text
        assert "Traceback" not in r.text
    r = bad["NaN temperature"]
    assert r.status_code == 400 and r.json()["error"]["param"] == "temperature"
    # the good ones: the output they have alone, and `ar`'s (100 steps) was still running when the bad were answered
    assert [got[i].status_code for i in range(len(GOOD))] == [200] * len(GOOD)
    assert [got[i].json()["choices"][0]["text"] for i in range(len(GOOD))] == want
    assert finished_at[0] > bad_answered
    # and the server goes on
    assert after.status_code == 200 and after.json()["choices"][0]["text"] == want[1]
    assert health == {**health, "status": "ok", "active": 0, "queue": 0}


async def final_event(job: Job):
    while True:
        kind, payload = await asyncio.wait_for(job.next(), HANG_S)
        if kind in ("done", "error", "cancelled"):
            return kind, payload


@pytest.mark.parametrize("max_batch", [1, 4])
def test_a_distribution_that_turns_nan_fails_its_own_sequence(max_batch):
    """The HTTP layer refuses such a temperature (above); sent to the worker directly, the target's distribution
    turns NaN at its first step: that sequence alone ends with the reason, the ones decoding beside it do not."""
    target, max_tokens = chat_target(), 40
    want = alone(GOOD, max_tokens)

    async def main():
        scheduler = Scheduler(target, "lookup", max_batch=max_batch)
        loop = asyncio.get_running_loop()

        def job(prompt: str, params: SamplingParams) -> Job:
            ids = target.encode(prompt, chat_template=False)
            return Job(GenerationRequest(ids, max_tokens, params, "lookup"), loop)

        goods = [job(p, SamplingParams()) for p in GOOD]
        bad = job("abc abc", SamplingParams(temperature=1e-300))
        for j in (goods[0], bad, *goods[1:]):  # admitted together: one batch
            scheduler.submit(j)
        finals = [await final_event(j) for j in (*goods, bad)]
        await loop.run_in_executor(None, scheduler.stop)
        return finals

    *goods, bad = asyncio.run(main())
    assert [(kind, result.text) for kind, result in goods] == [("done", text) for text in want]
    kind, error = bad
    assert kind == "error" and error.status == 400 and "not finite" in error.message


@pytest.mark.parametrize("max_batch", [1, 2])
def test_past_the_queue_bound_requests_get_429(monkeypatch, max_batch):
    slow_down(monkeypatch)
    answers = {}

    def ask(name: str, max_tokens: int) -> None:
        answers[name] = httpx.post(url + "/v1/completions", json={"prompt": "abc abc", "max_tokens": max_tokens},
                                   timeout=HANG_S)

    with running_server(chat_target(), "ar", max_batch=max_batch, max_queue=1) as url:
        threads = [threading.Thread(target=ask, args=(f"running {i}", 80)) for i in range(max_batch)]
        for t in threads:
            t.start()
        wait_until(lambda: httpx.get(url + "/health").json()["active"] == max_batch, "the batch did not fill")
        threads.append(threading.Thread(target=ask, args=("queued", 5)))
        threads[-1].start()
        wait_until(lambda: httpx.get(url + "/health").json()["queue"] == 1, "the request was not queued")
        full = httpx.post(url + "/v1/completions", json={"prompt": "abc", "max_tokens": 5}, timeout=HANG_S)
        for t in threads:
            t.join(HANG_S)
        later = httpx.post(url + "/v1/completions", json={"prompt": "abc", "max_tokens": 5}, timeout=HANG_S)
    assert full.status_code == 429, full.text
    error = full.json()["error"]
    assert error["code"] == "queue_full" and "--max-queue" in error["message"] and "retry" in error["message"]
    assert all(r.status_code == 200 for r in answers.values()) and len(answers) == max_batch + 1
    assert later.status_code == 200  # the bound is on waiting requests, not a count of all requests


def test_a_queued_request_whose_client_has_gone_never_starts(monkeypatch):
    slow_down(monkeypatch)
    with running_server(chat_target(), "ar", max_batch=1) as url:
        running = threading.Thread(target=httpx.post, args=(url + "/v1/completions",),
                                   kwargs={"json": {"prompt": "abc abc", "max_tokens": 100}, "timeout": HANG_S})
        running.start()
        wait_until(lambda: httpx.get(url + "/health").json()["active"] == 1, "the first request did not start")
        with pytest.raises(httpx.TimeoutException):  # it waits in the queue behind 100 steps; its client gives up
            httpx.post(url + "/v1/completions", json={"prompt": "xyz", "max_tokens": 50}, timeout=0.5)
        wait_until(lambda: httpx.get(url + "/health").json()["queue"] == 0, "the abandoned request stayed queued")
        assert httpx.get(url + "/health").json()["active"] == 1  # dropped while the first one still decodes
        running.join(HANG_S)
        ok = httpx.post(url + "/v1/completions", json={"prompt": "abc", "max_tokens": 3}, timeout=HANG_S)
        assert ok.status_code == 200
        assert metric(url, 'blockdraft_requests_total{endpoint="completions",outcome="cancelled"}') == 1
        assert metric(url, 'blockdraft_generated_tokens_total{method="ar"}') == 100 + 3  # it never decoded a token
