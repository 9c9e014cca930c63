"""`blockdraft serve` as a real process on 127.0.0.1, called with the real `openai` client: completions and chat,
streamed and not (the streamed text equals the non-streamed text), the API key enforced, a clean shutdown."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from serve_fixtures import chat_target, free_port  # noqa: E402

SRC = Path(__file__).resolve().parents[1] / "src"
KEY = "test-key-123"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("model") / "tiny-chat"
    target = chat_target()
    target.model.save_pretrained(folder)
    target.tokenizer.save_pretrained(folder)
    port = free_port()
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "blockdraft.cli", "serve", "--target", str(folder), "--port",
                             str(port), "--max-batch", "4", "--api-key", KEY, "--dtype", "float32", "--threads", "1",
                             "--method", "lookup,ar"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 300  # the engine compiles at load (--compile is the default)
    while True:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            pytest.fail("blockdraft serve did not come up:\n" + proc.stdout.read())
        time.sleep(0.2)
    yield url, proc
    if proc.poll() is None:
        proc.kill()


def test_openai_client_completions_and_chat_streamed_and_not(server):
    url, _ = server
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY)
    model = client.models.list().data[0].id
    assert model == "tiny-chat"
    full = client.completions.create(model=model, prompt="abc abc abc ab", max_tokens=40)
    assert full.usage.completion_tokens == 40 and full.choices[0].finish_reason == "length"
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=model, prompt="abc abc abc ab", max_tokens=40, stream=True) if c.choices)
    assert streamed == full.choices[0].text and len(streamed) > 0

    messages = [{"role": "user", "content": "abc abc abc"}]
    chat = client.chat.completions.create(model=model, messages=messages, max_tokens=30)
    assert chat.choices[0].message.role == "assistant" and chat.usage.completion_tokens == 30
    pieces = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=model, messages=messages, max_tokens=30, stream=True) if c.choices]
    assert "".join(pieces) == chat.choices[0].message.content and len(pieces) > 2
    # the method per request: an extra body field
    ar = client.completions.create(model=model, prompt="abc abc abc ab", max_tokens=40, extra_body={"method": "ar"})
    assert ar.choices[0].text == full.choices[0].text
    assert ar.model_extra["blockdraft"]["target_calls"] == 40 > full.model_extra["blockdraft"]["target_calls"]


def test_openai_client_without_the_key_gets_401(server):
    url, _ = server
    client = openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        client.completions.create(model="tiny-chat", prompt="abc", max_tokens=2)
    assert e.value.status_code == 401
    with pytest.raises(openai.NotFoundError):
        openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0).completions.create(
            model="gpt-4", prompt="abc", max_tokens=2)


def other_address() -> str | None:
    """This machine's address on its outward interface, if it has one (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))
            address = s.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") else address


def test_the_server_listens_on_loopback_only_and_stops_on_sigint(server):
    url, proc = server
    port = int(url.rsplit(":", 1)[1])
    address = other_address()
    if address is not None:  # started without --host: not reachable from the network
        with pytest.raises(OSError):
            socket.create_connection((address, port), timeout=2).close()
    socket.create_connection(("127.0.0.1", port), timeout=2).close()
    proc.send_signal(signal.SIGINT)
    assert proc.wait(20) == 0
