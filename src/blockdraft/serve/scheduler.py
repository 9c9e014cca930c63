"""The decoding worker: one background thread owns the Target (it is not thread-safe) and serves a queue of jobs."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time

from ..decoding import SpeculativeDecoder
from ..errors import BlockdraftError
from ..methods import make_drafter
from .metrics import Metrics
from .schemas import APIError, GenerationRequest

log = logging.getLogger("blockdraft.serve")


class Cancelled(Exception):
    """Raised inside the decoding loop when the client has gone: it stops the generation and frees the slot."""


class Job:
    """One request's life on the worker. The worker reports through `emit`; the HTTP handler awaits `next()`.

    Events: ("started", None) once the drafter is built and the prompt accepted; ("tokens", (ids, accepted))
    per decoding step, `accepted[i]` True for a draft token the target accepted, False for its own bonus token;
    then exactly one of ("done", GenerationResult), ("error", APIError), ("cancelled", None).
    """

    def __init__(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop):
        self.request, self.loop = request, loop
        self.events: asyncio.Queue = asyncio.Queue()
        self.cancelled = threading.Event()
        self.finished = False  # set by the worker after the final event
        self.queued_at = time.perf_counter()

    def emit(self, kind: str, payload=None) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, payload))
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            self.cancelled.set()

    def finish(self, kind: str, payload=None) -> None:
        self.finished = True
        self.emit(kind, payload)

    def cancel(self) -> None:
        self.cancelled.set()

    async def next(self):
        return await self.events.get()


class Scheduler:
    """Queues jobs and decodes them on one worker thread, one at a time, each with `SpeculativeDecoder`.

    Drafters are built on first use per method spec and kept (a trained drafter loads its checkpoint once);
    every generation resets the drafter's per-sequence state. Every job submitted gets a final event, even
    when its drafter cannot be built, its generation fails or the server shuts down.
    """

    def __init__(self, target, default_method: str, metrics: Metrics | None = None, max_batch: int = 1):
        self.target, self.default_method, self.max_batch = target, default_method, max_batch
        self.metrics = metrics or Metrics()
        self.queue: queue.Queue = queue.Queue()
        self.drafters: dict[str, object] = {}
        self.active = 0
        self._stopping = False
        self._thread = threading.Thread(target=self._work, name="blockdraft-worker", daemon=True)

    # --- called from the event loop ----------------------------------------------
    def start(self) -> None:
        if not self._thread.is_alive() and not self._stopping:
            self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self, job: Job) -> None:
        if self._stopping:
            raise APIError(503, "the server is shutting down", kind="server_error", code="shutting_down")
        self.start()
        self.queue.put(job)
        self._report_load()

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping = True
        self.queue.put(None)
        if self._thread.is_alive():
            self._thread.join(timeout)

    # --- the worker thread ----------------------------------------------------------
    def _report_load(self) -> None:
        self.metrics.set_load(self.queue.qsize(), self.active)

    def drafter(self, method: str):
        if method not in self.drafters:
            self.drafters[method] = make_drafter(method, self.target)
        return self.drafters[method]

    def _work(self) -> None:
        while True:
            job = self.queue.get()
            if job is None:
                break
            self.active = 1
            self._report_load()
            try:
                self._run(job)
            except Exception as e:  # a bug must not kill the worker: this job fails, the next one runs
                log.exception("generation failed")
                job.finish("error", APIError(500, f"internal error: {type(e).__name__}: {e}", kind="server_error"))
            finally:
                self.active = 0
                self._report_load()
        self._drain()

    def _drain(self) -> None:
        """Answer whatever is still queued at shutdown."""
        while True:
            try:
                job = self.queue.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                job.finish("error", APIError(503, "the server is shutting down", kind="server_error",
                                             code="shutting_down"))

    def _run(self, job: Job) -> None:
        if job.cancelled.is_set():
            job.finish("cancelled")
            return
        req = job.request
        try:
            decoder = SpeculativeDecoder(self.target, self.drafter(req.method), req.params)
        except BlockdraftError as e:
            job.finish("error", APIError(400, str(e), param="method", code="invalid_method"))
            return
        job.emit("started")

        def on_tokens(ids: list[int]) -> None:
            if job.cancelled.is_set():
                raise Cancelled
            # each step emits its accepted drafts, then the target's bonus token (only a stop rule can cut
            # that bonus off, on the last step)
            job.emit("tokens", (ids, [True] * (len(ids) - 1) + [False]))

        try:
            result = decoder.generate(req.prompt_ids, req.max_tokens, req.stop, req.seed, on_tokens=on_tokens)
        except Cancelled:
            job.finish("cancelled")
            return
        except BlockdraftError as e:
            job.finish("error", APIError(400, str(e)))
            return
        s = result.stats
        self.metrics.count_generation(req.method, len(req.prompt_ids), s.new_tokens, s.target_calls,
                                      dict(s.accepted_hist))
        self.metrics.count_batch(1, s.target_calls)  # one-at-a-time: every forward verifies one sequence
        job.finish("done", result)
