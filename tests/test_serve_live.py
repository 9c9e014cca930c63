"""A real server (uvicorn on 127.0.0.1, a free port): a client that disconnects mid-stream frees its slot,
concurrent requests are all answered with their own outputs, and a failing generation does not stop the worker."""

from __future__ import annotations

import json
import threading

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from blockdraft.decoding import SpeculativeDecoder  # noqa: E402
from blockdraft.drafters import NoDrafter  # noqa: E402
from blockdraft import Target  # noqa: E402
from blockdraft.model.batch_engine import BatchEngine  # noqa: E402
from serve_fixtures import HANG_S, chat_target, metric, running_server, slow_down, wait_until  # noqa: E402


@pytest.mark.parametrize("max_batch", [1, 4])
def test_a_client_that_disconnects_mid_stream_frees_its_slot(max_batch, monkeypatch):
    passes = slow_down(monkeypatch)
    with running_server(chat_target(), "ar", max_batch) as url:
        body = {"prompt": "abc abc", "max_tokens": 200, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=HANG_S) as r:
            assert r.status_code == 200
            first = next(line for line in r.iter_lines() if line.startswith("data: "))
            assert json.loads(first[6:])["choices"][0]["text"]
        # 200 tokens, 200 passes, would hold the worker; the next request must not wait for them
        r = httpx.post(url + "/v1/completions", json={"prompt": "abc", "max_tokens": 3}, timeout=HANG_S)
        assert r.status_code == 200 and len(passes) < 200  # answered before the cut one could have finished
        assert metric(url, 'blockdraft_requests_total{endpoint="completions",outcome="cancelled"}') == 1
        assert metric(url, 'blockdraft_generated_tokens_total{method="ar"}') == 3  # the cut one never finished
        assert httpx.get(url + "/health").json()["active"] == 0


@pytest.mark.parametrize("max_batch", [1, 4])
def test_concurrent_requests_each_get_their_own_answer(max_batch, monkeypatch):
    prompts = [f"{w} {w} {w}" for w in ("abc", "xyz", "hello", "ab", "the cat", "q")]
    reference = chat_target()
    want = [SpeculativeDecoder(reference, NoDrafter()).generate(reference.encode(p, chat_template=False), 25).text
            for p in prompts]
    got: dict[int, str] = {}

    def ask(i: int) -> None:
        r = httpx.post(url + "/v1/completions", json={"prompt": prompts[i], "max_tokens": 25}, timeout=60)
        got[i] = r.json()["choices"][0]["text"]

    slow_down(monkeypatch, 0.005)  # so that the requests overlap
    with running_server(chat_target(), "lookup", max_batch) as url:
        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert [got.get(i) for i in range(len(prompts))] == want
    assert len(set(want)) > 1  # different prompts, different answers: a mix-up would show


@pytest.mark.parametrize("max_batch", [1, 4])
def test_a_failing_generation_answers_500_and_the_worker_goes_on(max_batch, monkeypatch):
    calls = []
    for cls, name in ((Target, "verify"), (BatchEngine, "forward")):
        original = getattr(cls, name)

        def flaky(*args, _original=original, **kw):
            calls.append(1)
            if len(calls) == 2:  # the first verification (batched: the call after the prefill)
                raise RuntimeError("simulated failure")
            return _original(*args, **kw)

        monkeypatch.setattr(cls, name, flaky)
    with running_server(chat_target(), "ar", max_batch) as url:
        r = httpx.post(url + "/v1/completions", json={"prompt": "abc", "max_tokens": 5}, timeout=30)
        assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
        assert "Traceback" not in r.text
        r = httpx.post(url + "/v1/completions", json={"prompt": "abc", "max_tokens": 5}, timeout=30)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 5


@pytest.mark.parametrize("max_batch", [1, 4])
def test_a_client_that_gives_up_on_a_full_response_frees_its_slot(max_batch, monkeypatch):
    passes = slow_down(monkeypatch)
    with running_server(chat_target(), "ar", max_batch) as url:
        with pytest.raises(httpx.TimeoutException):  # the client gives up after 0.5 s (25 passes of STEP_S)
            httpx.post(url + "/v1/completions", json={"prompt": "abc abc", "max_tokens": 200}, timeout=0.5)
        r = httpx.post(url + "/v1/completions", json={"prompt": "abc", "max_tokens": 3}, timeout=HANG_S)
        assert r.status_code == 200 and len(passes) < 200  # not behind the abandoned one's 200 passes
        # the server looks for a gone client every DISCONNECT_POLL_S; its slot goes at the worker's next step
        wait_until(lambda: metric(url, 'blockdraft_requests_total{endpoint="completions",outcome="cancelled"}') == 1,
                   "the abandoned request was not cancelled")
        wait_until(lambda: httpx.get(url + "/health").json()["active"] == 0, "its slot was not freed")
        assert len(passes) < 200  # freed before the abandoned one could have finished


@pytest.mark.parametrize("max_batch", [1, 4])
def test_at_shutdown_every_queued_request_gets_an_answer(max_batch, monkeypatch):
    import asyncio

    from blockdraft.serve.scheduler import Job, Scheduler
    from blockdraft.serve.schemas import GenerationRequest
    from blockdraft.verify import SamplingParams

    slow_down(monkeypatch)
    target = chat_target()

    async def main():
        scheduler = Scheduler(target, "ar", max_batch=max_batch)
        loop = asyncio.get_running_loop()
        jobs = [Job(GenerationRequest(target.encode("abc", chat_template=False), 100, SamplingParams(), "ar"), loop)
                for _ in range(6)]
        for job in jobs:
            scheduler.submit(job)
        await asyncio.sleep(0.2)  # some are running, the rest wait in the queue
        await loop.run_in_executor(None, scheduler.stop)
        finals = []
        for job in jobs:
            while True:
                kind, payload = await asyncio.wait_for(job.next(), 10)
                if kind in ("done", "error", "cancelled"):
                    finals.append((kind, getattr(payload, "status", None)))
                    break
        return finals, scheduler

    finals, scheduler = asyncio.run(main())
    assert len(finals) == 6 and not scheduler.alive
    assert ("error", 503) in finals  # the queued ones were told the server is shutting down
    assert all(kind == "done" or status == 503 for kind, status in finals)


def test_without_its_own_thread_the_scheduler_decodes_in_the_thread_that_runs_it():
    """blockdraft serve decodes on the main thread (serve/server.py: a second OpenMP team slows every op)."""
    import asyncio
    import threading

    from blockdraft.serve.scheduler import Job, Scheduler
    from blockdraft.serve.schemas import GenerationRequest
    from blockdraft.verify import SamplingParams

    target = chat_target()
    scheduler = Scheduler(target, "ar", max_batch=2, own_thread=False)
    decoded_on, ready = [], threading.Event()
    real_prepare = type(scheduler).prepare

    def prepare(self):
        real_prepare(self)
        step = self.batch.step

        def traced_step():
            decoded_on.append(threading.current_thread())
            return step()

        self.batch.step = traced_step

    scheduler.prepare = prepare.__get__(scheduler)

    async def client():
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, ready.wait)
        job = Job(GenerationRequest(target.encode("abc", chat_template=False), 5, SamplingParams(), "ar"), loop)
        scheduler.submit(job)
        while (event := await asyncio.wait_for(job.next(), 30))[0] not in ("done", "error", "cancelled"):
            pass
        await loop.run_in_executor(None, scheduler.stop)
        return event

    result = {}
    http = threading.Thread(target=lambda: result.update(event=asyncio.run(client())))
    http.start()
    scheduler.run(on_ready=ready.set)  # returns once the client's stop() has ended it
    http.join(30)
    assert result["event"][0] == "done" and len(result["event"][1].tokens) == 5
    assert decoded_on and all(t is threading.main_thread() for t in decoded_on)
    assert not scheduler._thread.is_alive() and not scheduler.alive
