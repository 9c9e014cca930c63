"""The decoding worker: one thread owns the Target (it is not thread-safe) and serves a queue of jobs."""

from __future__ import annotations

import logging
import queue
import threading

from ..decoding import BatchDecoder, SpeculativeDecoder
from ..errors import BlockdraftError
from ..methods import make_drafter
from .jobs import DEFAULT_MAX_QUEUE, Job, JobQueue, shutting_down
from .metrics import Metrics
from .schemas import APIError, pick_method, served_methods

__all__ = ["Cancelled", "Job", "Scheduler", "MAX_TREE_NODES"]
log = logging.getLogger("blockdraft.serve")
# Draft tree nodes verified per sequence and step, root included: no method's options can make one forward
# arbitrarily large. The defaults draft <= 17.
MAX_TREE_NODES = 128


class Cancelled(Exception):
    """Raised inside the decoding loop when the client has gone: it stops the generation and frees the slot."""


def _internal(e: Exception) -> APIError:
    return APIError(500, f"internal error: {type(e).__name__}: {e}", kind="server_error")


def _as_api_error(e: Exception) -> APIError:
    if isinstance(e, APIError):
        return e
    if isinstance(e, BlockdraftError):
        return APIError(400, str(e))
    log.error("generation failed", exc_info=e)
    return _internal(e)


def build_drafter(spec: str, target):
    """The drafter of a served method spec, or a BlockdraftError naming the spec and why it cannot be built."""
    try:
        return make_drafter(spec, target)
    except BlockdraftError:
        raise
    except Exception as e:  # a bad option value deep in a factory (float('x')), a broken checkpoint
        raise BlockdraftError(f"method '{spec}' cannot be built: {type(e).__name__}: {e}") from None


class Scheduler:
    """Queues jobs and decodes them on one worker thread: its own (`start()`), or the caller's (`run()`).

    With `max_batch` > 1 (and a Llama-family target, which the batch engine needs) jobs are decoded by
    continuous batching: a job joins the running batch before the next step as soon as a slot is free and
    leaves it when it stops (`BatchDecoder`). Otherwise one at a time, each with `SpeculativeDecoder`.
    The served `methods` (specs, or one string of them separated by commas; the first is the default) are
    built here, once: a request picks among them, and nothing it sends can make the server read a file or
    compile. Each generation gets its drafter's per-sequence state afresh. At most `max_queue` jobs wait for
    a slot (past it, 429). Every job submitted gets a final event, even when its generation fails (its own
    failure: the others go on) or the server shuts down.
    """

    def __init__(self, target, methods, metrics: Metrics | None = None, max_batch: int = 8,
                 own_thread: bool = True, prefix_cache_mb: float = 256, max_queue: int = DEFAULT_MAX_QUEUE):
        self.target, self.max_batch = target, max_batch
        self.methods = served_methods(methods)
        self.default_method = self.methods[0]
        self.prefix_cache_mb = prefix_cache_mb  # the batch decoder's (BatchDecoder)
        self.own_thread = own_thread  # False: the caller runs run() itself (blockdraft serve: the main thread)
        self.metrics = metrics or Metrics()
        self.queue = JobQueue(max_queue)
        self.drafters = {spec: build_drafter(spec, target) for spec in self.methods}
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
        """Queue a job; raises the APIError to answer instead: 429 when the queue is full, 503 when stopping."""
        if self._stopping:
            raise shutting_down()
        if self._finished.is_set():  # (cannot happen but through a bug: then say so rather than hang)
            raise APIError(503, "the decoding worker has stopped", kind="server_error", code="worker_stopped")
        self.start()
        self.queue.put(job)
        self._report_load()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving: running generations and queued jobs are answered 'shutting down'; returns when the
        worker has finished (or after `timeout`)."""
        self._stopping = True
        self.queue.stop()
        if self._running.is_set() or self._thread.is_alive():
            self._finished.wait(timeout)

    # --- the worker thread ----------------------------------------------------------
    def _report_load(self) -> None:
        self.metrics.set_load(self.queue.qsize(), self.active)

    def drafter(self, method: str):
        """The loaded drafter of a served method spec (or of its name alone, when one spec has it)."""
        return self.drafters[pick_method(method, self.methods)]

    def prepare(self) -> None:
        """Build the batch decoder (on a compiled target this compiles the batched steps: minutes), so that the
        first request does not pay for it. Call it in the thread that will run()."""
        if self._prepared:
            return
        self._prepared = True
        single = [m for m in self.methods if self.drafters[m].single_sequence]
        if single and self.max_batch > 1:
            # what the server was launched to run is served, one request at a time, rather than refused
            log.warning("one request at a time: method '%s' drafts through the target's single-sequence cache",
                        single[0])
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
            while True:
                try:
                    if self.batch is not None:
                        self._work_batched(self.batch)
                    else:
                        self._work_single()
                    break
                except Exception as e:  # a bug outside any one request's guard: answer those in flight, go on
                    log.exception("the decoding worker failed; it answers its requests and goes on")
                    self._fail_active(_internal(e))
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
            if stopping:
                self._fail_active(shutting_down())
            for seq in list(batch.active):
                if seq.tag.cancelled.is_set():  # its client went away: free the slot now
                    batch.remove(seq)
                    seq.tag.finish("cancelled")
            self.active = len(batch.active)
            self._report_load()
            if not batch.active:
                continue
            size = len(batch.active)
            try:
                finished = batch.step()
            except Exception as e:  # the shared forward failed: each sequence in it gets an answer, the worker goes on
                log.exception("batched step failed")
                self._fail_active(_internal(e))
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

    def _fail_active(self, error: APIError) -> None:
        """End every sequence in the batch with `error` (the server stops, or a failure no sequence owns)."""
        for seq in list(self.batch.active if self.batch is not None else ()):
            self.batch.remove(seq)
            if not seq.tag.finished:
                seq.tag.finish("error", error)

    def _admit(self, batch: BatchDecoder, job: Job) -> None:
        """Take a job into the batch (the next steps prefill its prompt, then decode it), or answer why not."""
        if job.cancelled.is_set():
            job.finish("cancelled")
            return
        req = job.request
        # Only a stream reads each step's tokens: a non-streamed reply waits for "done", and every event
        # wakes the event loop, whose thread then competes with this one for the GIL
        on_tokens = (lambda ids, accepted: job.emit("tokens", (ids, accepted))) if req.stream else None
        try:
            batch.add(req.prompt_ids, self.drafter(req.method), req.params, req.max_tokens, req.stop, req.seed,
                      on_tokens=on_tokens, tag=job)
        except Exception as e:  # its drafter's fork, its seed, ...: this request alone is refused
            job.finish("error", _as_api_error(e))
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
            except Exception as e:  # its drafter or its sampling failed: this job fails, the next one runs
                kind, payload = "error", _as_api_error(e)
            # the slot is free before the client hears the end, so /health and /metrics agree with it
            self.active = 0
            self._report_load()
            job.finish(kind, payload)

    def _drain(self) -> None:
        """Answer whatever is still queued at shutdown."""
        for job in self.queue.drain():
            job.finish("error", shutting_down())

    def _run(self, job: Job) -> tuple[str, object]:
        """Decode one job; returns its final event."""
        if self._stopping:
            return "error", shutting_down()
        if job.cancelled.is_set():
            return "cancelled", None
        req = job.request
        decoder = SpeculativeDecoder(self.target, self.drafter(req.method), req.params, max_nodes=MAX_TREE_NODES)
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
        s = result.stats
        self.metrics.count_generation(req.method, len(req.prompt_ids), s.new_tokens, s.target_calls,
                                      dict(s.accepted_hist))
        self.metrics.count_batch(1, s.target_calls)  # one-at-a-time: every forward verifies one sequence
        return "done", result
