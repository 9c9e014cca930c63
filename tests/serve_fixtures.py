"""For the serve tests: a tiny target with a chat template, a real uvicorn server on a free port in a thread, an
artificially slow target (so that requests overlap), and waiting for the server without hanging."""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager

import httpx
import uvicorn

from blockdraft import Target
from blockdraft.model.batch_engine import BatchEngine
from blockdraft.serve import create_app
from conftest import CHARS, char_tokenizer, tiny_llama

STEP_S = 0.02  # an artificially slow target: every verification pass sleeps this long
HANG_S = 60  # how long a test waits for the server to do something before it calls it hung (not a speed limit)

# Only characters of the tiny alphabet, so that every template token is a real one.
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'][0] }} {{ m['content'] }}. {% endfor %}"
                 "{% if add_generation_prompt %}a {% endif %}")


def chat_target(name: str = "tiny-llama") -> Target:
    tokenizer = char_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    # peaked logits (logit_scale): greedy continuations repeat, so prompt lookup gets drafts accepted
    return Target(tiny_llama(vocab_size=3 + len(CHARS), logit_scale=4.0), tokenizer, name=name)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_server(target: Target, method: str = "lookup", max_batch: int = 1, api_key: str | None = None,
                   max_queue: int = 64):
    """Yields the base URL of a real HTTP server (uvicorn in a thread) serving `target`."""
    app = create_app(target, method, max_batch, api_key, max_queue=max_queue)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60  # a hang guard, not a speed limit (it starts in well under a second)
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def slow_down(monkeypatch, seconds: float = STEP_S) -> list:
    """Every verification pass sleeps `seconds`: one at a time (Target.verify) and batched (BatchEngine.forward).
    Returns the list the passes are counted in (one entry each)."""
    passes = []
    for cls, name in ((Target, "verify"), (BatchEngine, "forward")):
        original = getattr(cls, name)

        def slow(*args, _original=original, **kw):
            passes.append(1)
            time.sleep(seconds)
            return _original(*args, **kw)

        monkeypatch.setattr(cls, name, slow)
    return passes


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + HANG_S
    while not condition():
        assert time.monotonic() < deadline, f"{what}: nothing after {HANG_S} s, the server hangs"
        time.sleep(0.05)


def metric(url: str, name: str) -> float:
    lines = httpx.get(url + "/metrics").text.splitlines()
    samples = dict(line.rsplit(" ", 1) for line in lines if line and not line.startswith("#"))
    return float(samples.get(name, 0))
