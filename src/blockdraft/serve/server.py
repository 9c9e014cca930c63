"""Run the app under uvicorn: the entry point of `blockdraft serve`."""

from __future__ import annotations

import socket
import sys

import uvicorn

from ..errors import BlockdraftError
from .app import create_app


def check_address(host: str, port: int) -> None:
    """Fail in one line, before serving, when the address cannot be bound (in use, or not this machine's)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        with socket.socket(infos[0][0], socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            s.bind(infos[0][4])
    except OSError as e:
        raise BlockdraftError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


def run_server(target, method: str, host: str = "127.0.0.1", port: int = 8000, max_batch: int = 8,
               api_key: str | None = None) -> None:
    app = create_app(target, method, max_batch, api_key)
    check_address(host, port)
    if host not in ("127.0.0.1", "localhost", "::1") and not api_key:
        print(f"blockdraft: warning: --host {host} makes the server reachable from the network without an API key "
              "(--api-key KEY)", file=sys.stderr)
    where = f"http://{host}:{port}"
    print(f"blockdraft: serving {target.name} ({method}, batches of up to {max_batch}) at {where}/v1, "
          f"playground at {where}/" + ("" if api_key else "; no API key"), file=sys.stderr)
    # one worker process: the model is loaded once and the decoding thread owns it
    uvicorn.run(app, host=host, port=port, log_level="info", timeout_graceful_shutdown=5)
