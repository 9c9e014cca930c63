"""Run the app under uvicorn: the entry point of `blockdraft serve`."""

from __future__ import annotations

import signal
import socket
import sys
import threading

import uvicorn

from ..errors import BlockdraftError
from .app import create_app
from .jobs import DEFAULT_MAX_QUEUE


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
               api_key: str | None = None, prefix_cache_mb: float = 256, max_queue: int = DEFAULT_MAX_QUEUE) -> None:
    """Serve until SIGINT or SIGTERM. The decoding runs on this (the main) thread and uvicorn on another.

    Why not the other way round: torch's CPU ops run on an OpenMP team per calling thread, and the main
    thread has had one since the model loaded. A second thread's team puts more OpenMP threads on the
    machine than it has cores, and then libgomp stops spinning between parallel regions: every small matmul
    waits for its helper to wake. Measured here (2 cores, bf16): the same batch-decoding loop ran at 43
    tokens/s on the main thread and 25 on a worker thread; an 8 x 576 x 1536 matmul took 64 vs 150 us.
    """
    app = create_app(target, method, max_batch, api_key, own_thread=False, prefix_cache_mb=prefix_cache_mb,
                     max_queue=max_queue)
    scheduler = app.state.scheduler
    check_address(host, port)
    if host not in ("127.0.0.1", "localhost", "::1") and not api_key:
        print(f"blockdraft: warning: --host {host} makes the server reachable from the network without an API key "
              "(--api-key KEY)", file=sys.stderr)
    # one worker process: the model is loaded once and the decoding thread owns it
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="info", timeout_graceful_shutdown=5))

    http = threading.Thread(target=lambda: serve_http(server, scheduler), name="blockdraft-http", daemon=True)

    def on_signal(signum, frame) -> None:
        if not http.is_alive():  # still preparing: stop at once, as without a handler
            raise KeyboardInterrupt
        server.should_exit = True  # uvicorn's graceful shutdown; its lifespan then stops the scheduler

    def on_ready() -> None:
        where = f"http://{host}:{port}"
        methods = ", ".join(scheduler.methods)
        print(f"blockdraft: serving {target.name} ({methods}; batches of up to {max_batch}, {max_queue} more "
              f"queued) at {where}/v1, "
              f"playground at {where}/" + ("" if api_key else "; no API key"), file=sys.stderr)
        http.start()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    print("blockdraft: preparing the batched steps (compiling them takes a few minutes)" if target.compiled
          else "blockdraft: preparing", file=sys.stderr)
    scheduler.run(on_ready)  # returns once the app's shutdown (or a failed start) has stopped it
    http.join(10)
    if not server.started:
        raise BlockdraftError(f"the HTTP server on {host}:{port} did not start (see uvicorn's message above)")


def serve_http(server: uvicorn.Server, scheduler) -> None:
    try:
        server.run()  # off the main thread uvicorn installs no signal handlers: run_server's stop it
    except SystemExit:  # uvicorn exits this way when it cannot start
        pass
    finally:
        scheduler.stop(timeout=0)  # whatever ended the server ends the decoding loop on the main thread
