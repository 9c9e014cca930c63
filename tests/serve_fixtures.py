"""A tiny target with a chat template, and a real uvicorn server on a free port in a thread, for the serve tests."""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager

import uvicorn

from blockdraft import Target
from blockdraft.serve import create_app
from conftest import CHARS, char_tokenizer, tiny_llama

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
def running_server(target: Target, method: str = "lookup", max_batch: int = 1, api_key: str | None = None):
    """Yields the base URL of a real HTTP server (uvicorn in a thread) serving `target`."""
    app = create_app(target, method, max_batch, api_key)
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
