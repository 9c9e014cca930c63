"""Run the app under uvicorn: the entry point of `blockdraft serve`."""

from __future__ import annotations

import sys

import uvicorn

from .app import create_app


def run_server(target, method: str, host: str = "127.0.0.1", port: int = 8000, max_batch: int = 8,
               api_key: str | None = None) -> None:
    app = create_app(target, method, max_batch, api_key)
    if host not in ("127.0.0.1", "localhost", "::1") and not api_key:
        print(f"blockdraft: warning: --host {host} makes the server reachable from the network without an API key "
              "(--api-key KEY)", file=sys.stderr)
    where = f"http://{host}:{port}"
    print(f"blockdraft: serving {target.name} ({method}, batches of up to {max_batch}) at {where}/v1, "
          f"playground at {where}/" + ("" if api_key else "; no API key"), file=sys.stderr)
    # one worker process: the model is loaded once and the decoding thread owns it
    uvicorn.run(app, host=host, port=port, log_level="info", timeout_graceful_shutdown=5)
