"""The decoding worker: one thread owns the Target (it is not thread-safe) and serves a queue of jobs."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import OrderedDict

from ..decoding import BatchDecoder, SpeculativeDecoder
from ..errors import BlockdraftError
from ..methods import make_drafter
from .metrics import Metrics
from .schemas import APIError, GenerationRequest

log = logging.getLogger("blockdraft.serve")
MAX_DRAFTERS = 8  # method specs whose drafters stay built
# Draft tree nodes verified per sequence and step, root included: a request's method options
# (budget=, num_tokens=, max_branches=) cannot make one forward arbitrarily large. The defaults draft <= 17.
MAX_TREE_NODES = 128


class Cancelled(Exception):
    """Raised inside the decoding loop when the client has gone: it stops the generation and frees the slot."""


def shutting_down() -> APIError:
    return APIError(503, "the server is shutting down", kind="server_error", code="shutting_down")


def _as_api_error(e: Exception) -> APIError:
    if isinstance(e, BlockdraftError):
        return APIError(400, str(e))
    log.error("generation failed", exc_info=e)
    return APIError(500, f"internal error: {type(e).__name__}: {e}", kind="server_error")


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
    """Queues jobs and decodes them on one worker thread: its own (`start()`), or the caller's (`run()`).

    With `max_batch` > 1 (and a Llama-family target, which the batch engine needs) jobs are decoded by
    continuous batching: a job joins the running batch before the next step as soon as a slot is free and
    leaves it when it stops (`BatchDecoder`). Otherwise one at a time, each with `SpeculativeDecoder`.
    Drafters are built on first use per method spec and kept (a trained drafter loads its checkpoint once);
    each generation gets the drafter's per-sequence state afresh. Every job submitted gets a final event,
    even when its drafter cannot be built, its generation fails or the server shuts down.
    """

    def __init__(self, target, default_method: str, metrics: Metrics | None = None, max_batch: int = 8,
                 own_thread: bool = True, prefix_cache_mb: float = 256):
        self.target, self.default_method, self.max_batch = target, default_method, max_batch
        self.prefix_cache_mb = prefix_cache_mb  # the batch decoder's (BatchDecoder)
        self.own_thread = own_thread  # False: the caller runs run() itself (blockdraft serve: the main thread)
        self.metrics = metrics or Metrics()
        self.queue: queue.Queue = queue.Queue()
        self.drafters: OrderedDict[str, object] = OrderedDict()
        self.active = 0
        self.batch: BatchDecoder | None = None
        self._prepared = False
        self._stopping = False
        self._running = threading.Event()  # set while run() serves the queue, in whichever thread
        self._finished = threading.Event()
        self._thread = threading.Thread(target=self.run, name="blockdraft-worker", daemon=True)

    # --- called from the event loop ----------------------------------------------
    def start(self) -> None:
        """Decode on a thread of the scheduler's own (with own_thread; else the caller runs run())."""
        if self.own_thread and not self._thread.is_alive() and not self._stopping:
            self._thread.start()

    @property
    def alive(self) -> bool:
        return self._running.is_set() or self._thread.is_alive()

    def submit(self, job: Job) -> None:
        if self._stopping:
            raise shutting_down()
        self.start()
        self.queue.put(job)
        self._report_load()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving: running generations and queued jobs are answered 'shutting down'; returns when the
        worker has finished (or after `timeout`)."""
        self._stopping = True
        self.queue.put(None)
        if self._running.is_set() or self._thread.is_alive():
            self._finished.wait(timeout)

    # --- the worker thread ----------------------------------------------------------
    def _report_load(self) -> None:
        self.metrics.set_load(self.queue.qsize(), self.active)

    def drafter(self, method: str):
        """The drafter for a method spec, built once; the least recently used goes beyond MAX_DRAFTERS specs,
        so that clients naming ever new options cannot pile up checkpoints in memory."""
        if method in self.drafters:
            self.drafters.move_to_end(method)
        else:
            self.drafters[method] = make_drafter(method, self.target)
            if len(self.drafters) > MAX_DRAFTERS:
                self.drafters.popitem(last=False)  # sequences decoding with it keep their own fork
        return self.drafters[method]

    def prepare(self) -> None:
        """Build the batch decoder (on a compiled target this compiles the batched steps: minutes) and the
        launch method's drafter, so that the first request does not pay for them. Call it in the thread
        that will run()."""
        if self._prepared:
            return
        self._prepared = True
        try:
            launch_drafter = self.drafter(self.default_method)
        except BlockdraftError as e:  # answered per request, as for any method
            launch_drafter = None
            log.warning("the launch method's drafter cannot be built: %s", e)
        if launch_drafter is not None and launch_drafter.single_sequence and self.max_batch > 1:
            # what the server was launched to run is served, one request at a time, rather than refused
            log.warning("one request at a time: method '%s' drafts through the target's single-sequence cache",
                        self.default_method)
        elif self.max_batch > 1:
            try:
                self.batch = BatchDecoder(self.target, self.max_batch, max_nodes=MAX_TREE_NODES,
                                          prefix_cache_mb=self.prefix_cache_mb)
            except BlockdraftError as e:
                log.warning("one request at a time: %s", e)

    def run(self, on_ready=None) -> None:
        """Serve the queue in the calling thread until stop(); `on_ready()` is called once prepared."""
        self._running.set()
        try:
            self.prepare()
            if on_ready is not None:
                on_ready()
            if self.batch is not None:
                self._work_batched(self.batch)
            else:
                self._work_single()
            self._drain()
        finally:
            self._running.clear()
            self._finished.set()

    # --- continuous batching ------------------------------------------------------------
    def _work_batched(self, batch: BatchDecoder) -> None:
        stopping = False
        while not stopping or batch.active:
            self.active = len(batch.active)
            self._report_load()
            while batch.free and not stopping:  # admit: wait for work only when nothing is running
                try:
                    job = self.queue.get(block=not batch.active)
                except queue.Empty:
                    break
                if job is None:
                    stopping = True
                else:
                    self._admit(batch, job)
            stopping = stopping or self._stopping  # a full batch does not read the queue's stop mark
            for seq in list(batch.active):
                if stopping:
                    batch.remove(seq)
                    seq.tag.finish("error", shutting_down())
                elif seq.tag.cancelled.is_set():  # its client went away: free the slot now
                    batch.remove(seq)
                    seq.tag.finish("cancelled")
            self.active = len(batch.active)
            self._report_load()
            if not batch.active:
                continue
            size = len(batch.active)
            try:
                finished = batch.step()
            except Exception as e:  # every sequence of the failed step gets an answer; the worker goes on
                log.exception("batched step failed")
                for seq in list(batch.active):
                    batch.remove(seq)
                    seq.tag.finish("error", APIError(500, f"internal error: {type(e).__name__}: {e}",
                                                     kind="server_error"))
                continue
            self.metrics.count_batch(size)
            if batch.prefix_cache is not None:
                self.metrics.set_prefix_cache(batch.prefix_cache)
            self.active = len(batch.active)  # before the clients hear the end, so /health agrees with them
            self._report_load()
            for seq in finished:
                if seq.error is not None:
                    seq.tag.finish("error", _as_api_error(seq.error))
                    continue
                s = seq.stats
                self.metrics.count_generation(s.method, len(seq.prompt_ids), s.new_tokens, s.target_calls,
                                              dict(s.accepted_hist))
                seq.tag.finish("done", seq.result)
        self.active = 0
        self._report_load()

    def _admit(self, batch: BatchDecoder, job: Job) -> None:
        """Take a job into the batch (the next steps prefill its prompt, then decode it), or answer why not."""
        if job.cancelled.is_set():
            job.finish("cancelled")
            return
        req = job.request
        try:
            drafter = self.drafter(req.method)
        except BlockdraftError as e:
            job.finish("error", APIError(400, str(e), param="method", code="invalid_method"))
            return
        # Only a stream reads each step's tokens: a non-streamed reply waits for "done", and every event
        # wakes the event loop, whose thread then competes with this one for the GIL
        on_tokens = (lambda ids, accepted: job.emit("tokens", (ids, accepted))) if req.stream else None
        try:
            batch.add(req.prompt_ids, drafter, req.params, req.max_tokens, req.stop, req.seed,
                      on_tokens=on_tokens, tag=job)
        except BlockdraftError as e:
            job.finish("error", APIError(400, str(e)))
            return
        except Exception as e:
            log.exception("admission failed")
            job.finish("error", APIError(500, f"internal error: {type(e).__name__}: {e}", kind="server_error"))
            return
        job.emit("started")

    # --- one at a time ---------------------------------------------------------------------
    def _work_single(self) -> None:
        while True:
            job = self.queue.get()
            if job is None:
                break
            self.active = 1
            self._report_load()
            try:
                kind, payload = self._run(job)
            except Exception as e:  # a bug must not kill the worker: this job fails, the next one runs
                log.exception("generation failed")
                kind, payload = "error", APIError(500, f"internal error: {type(e).__name__}: {e}", kind="server_error")
            # the slot is free before the client hears the end, so /health and /metrics agree with it
            self.active = 0
            self._report_load()
            job.finish(kind, payload)

    def _drain(self) -> None:
        """Answer whatever is still queued at shutdown."""
        while True:
            try:
                job = self.queue.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                job.finish("error", shutting_down())

    def _run(self, job: Job) -> tuple[str, object]:
        """Decode one job; returns its final event."""
        if self._stopping:
            return "error", shutting_down()
        if job.cancelled.is_set():
            return "cancelled", None
        req = job.request
        try:
            decoder = SpeculativeDecoder(self.target, self.drafter(req.method), req.params,
                                         max_nodes=MAX_TREE_NODES)
        except BlockdraftError as e:
            return "error", APIError(400, str(e), param="method", code="invalid_method")
        job.emit("started")

        def on_tokens(ids: list[int]) -> None:
            if job.cancelled.is_set() or self._stopping:
                raise Cancelled
            # each step emits its accepted drafts, then the target's bonus token (only a stop rule can cut
            # that bonus off, on the last step); only a stream reads them
            if req.stream:
                job.emit("tokens", (ids, [True] * (len(ids) - 1) + [False]))

        try:
            result = decoder.generate(req.prompt_ids, req.max_tokens, req.stop, req.seed, on_tokens=on_tokens)
        except Cancelled:
            return ("error", shutting_down()) if self._stopping else ("cancelled", None)
        except BlockdraftError as e:
            return "error", APIError(400, str(e))
        s = result.stats
        self.metrics.count_generation(req.method, len(req.prompt_ids), s.new_tokens, s.target_calls,
                                      dict(s.accepted_hist))
        self.metrics.count_batch(1, s.target_calls)  # one-at-a-time: every forward verifies one sequence
        return "done", result
