"""The playground page in a real headless browser (Debian's chromium, driven over its DevTools pipe): after a
streamed generation the page shows the generated text as coloured tokens, accepted drafts and bonus tokens."""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import subprocess
import time
from urllib.parse import quote

import pytest

pytest.importorskip("uvicorn")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium)")

from serve_fixtures import chat_target, running_server  # noqa: E402

ACCEPTED_RGB, BONUS_RGB = (0x00, 0xC8, 0x53), (0x29, 0x62, 0xFF)  # --accepted and --bonus in static/index.html
PROMPT = "abc abc abc ab"


class Browser:
    """Headless chromium, spoken to in Chrome DevTools Protocol over --remote-debugging-pipe (fds 3 and 4:
    NUL-separated JSON messages), so no driver and no websocket library are needed."""

    def __init__(self, width: int = 1000, height: int = 800):
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()

        def wire():  # in the child: the pipe ends become fds 3 (commands in) and 4 (replies out)
            os.dup2(to_child_r, 3)
            os.dup2(from_child_w, 4)

        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
             "--hide-scrollbars", f"--window-size={width},{height}", "--no-first-run", "about:blank"],
            preexec_fn=wire, close_fds=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_child_r)
        os.close(from_child_w)
        self._buffer, self._id, self.session = b"", 0, None
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]

    def call(self, method: str, **params):
        self._id += 1
        message = {"id": self._id, "method": method, "params": params}
        if self.session and not method.startswith("Target."):
            message["sessionId"] = self.session
        os.write(self._to_child, json.dumps(message).encode() + b"\0")
        while True:  # skip events until our reply comes
            while b"\0" not in self._buffer:
                chunk = os.read(self._from_child, 1 << 16)
                if not chunk:
                    raise RuntimeError("chromium closed the DevTools pipe")
                self._buffer += chunk
            raw, self._buffer = self._buffer.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def evaluate(self, expression: str):
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        os.close(self._to_child)
        os.close(self._from_child)


def colour_pixels(png: bytes, rgb: tuple[int, int, int], box: dict) -> int:
    """Pixels of exactly this colour inside `box` (a DOMRect: x, y, width, height in CSS pixels)."""
    import matplotlib.image

    image = matplotlib.image.imread(io.BytesIO(png), format="png")[..., :3]
    x, y = int(box["x"]), int(box["y"])
    image = image[y : y + int(box["height"]), x : x + int(box["width"])]
    target = [c / 255 for c in rgb]
    return int((abs(image - target) < 2 / 255).all(-1).sum())


def test_a_streamed_generation_shows_coloured_tokens(tmp_path):
    with running_server(chat_target(), "lookup", max_batch=4) as url:
        want = __import__("httpx").post(url + "/v1/completions",
                                        json={"prompt": PROMPT, "max_tokens": 60}).json()
        browser = Browser()
        try:
            browser.call("Page.enable")
            browser.call("Page.navigate", url=f"{url}/?prompt={quote(PROMPT)}&chat=0&max_tokens=60&autostart=1")
            deadline = time.monotonic() + 60  # a hang guard, not a speed limit (it takes ~1 s)
            while browser.evaluate("document.body && document.body.dataset.state") != "done":
                assert time.monotonic() < deadline, "the generation did not finish in the page: hung"
                time.sleep(0.1)
            page = browser.evaluate("""(() => {
                const spans = [...document.querySelectorAll('#output span')];
                return {text: spans.map(s => s.textContent).join(''),
                        error: document.getElementById('error').textContent,
                        accepted: spans.filter(s => s.className === 'accepted').length,
                        bonus: spans.filter(s => s.className === 'bonus').length,
                        tau: document.getElementById('tau').textContent,
                        tps: document.getElementById('tps').textContent,
                        box: document.getElementById('output').getBoundingClientRect().toJSON()}; })()""")
            png = base64.b64decode(browser.call("Page.captureScreenshot", format="png")["data"])
        finally:
            browser.close()
    (tmp_path / "playground.png").write_bytes(png)
    assert page["error"] == ""
    assert page["text"] == want["choices"][0]["text"]  # the whole streamed generation, token by token
    hist = want["blockdraft"]["accepted_hist"]
    assert page["accepted"] == sum(int(k) * n for k, n in hist.items()) > 0
    assert page["bonus"] == want["blockdraft"]["target_calls"]
    assert float(page["tau"]) == pytest.approx(want["blockdraft"]["tau"], abs=0.01) and float(page["tps"]) > 0
    # and they are visible: inside the output box, both token colours fill pixels, about in proportion
    accepted, bonus = colour_pixels(png, ACCEPTED_RGB, page["box"]), colour_pixels(png, BONUS_RGB, page["box"])
    per_token = (accepted + bonus) / (page["accepted"] + page["bonus"])
    assert per_token > 50, (accepted, bonus)  # a token's box is ~10 x 25 pixels, less its glyph
    assert accepted / bonus == pytest.approx(page["accepted"] / page["bonus"], rel=0.3)
