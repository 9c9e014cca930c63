"""One request's life on the decoding worker (Job), and the bounded queue of those waiting for it (JobQueue)."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections import deque

from ..errors import BlockdraftError
from .schemas import APIError

DEFAULT_MAX_QUEUE = 64  # requests waiting for a slot, beyond those decoding: past it, 429


def shutting_down() -> APIError:
    return APIError(503, "the server is shutting down", kind="server_error", code="shutting_down")


def queue_full(bound: int) -> APIError:
    return APIError(429, f"the server is busy: {bound} requests are already waiting for a slot (its --max-queue); "
                         "retry later", kind="rate_limit_error", code="queue_full")


class Job:
    """One request's life on the worker. The worker reports through `emit`; the HTTP handler awaits `next()`.

    Events: ("started", None) once the worker has taken the request in; ("tokens", (ids, accepted))
    per decoding step, `accepted[i]` True for a draft token the target accepted, False for its own bonus token;
    then exactly one of ("done", GenerationResult), ("error", APIError), ("cancelled", None).
    """

    def __init__(self, request, loop: asyncio.AbstractEventLoop):
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


class JobQueue:
    """The jobs waiting for the worker, first in, first out: at most `bound` whose client is still there.

    A job whose client has gone (`cancelled`) neither counts nor starts: it is answered "cancelled" and dropped
    whenever the queue is looked at. After `stop()` `get` returns None, and `drain` hands over what is left.
    """

    def __init__(self, bound: int = DEFAULT_MAX_QUEUE):
        if not isinstance(bound, int) or isinstance(bound, bool) or bound < 1:
            raise BlockdraftError(f"max_queue must be a positive integer (requests waiting for a slot), got {bound!r}")
        self.bound = bound
        self._jobs: deque[Job] = deque()
        self._changed = threading.Condition()
        self._stopped = False

    def _drop_cancelled(self) -> None:
        for job in [j for j in self._jobs if j.cancelled.is_set()]:
            self._jobs.remove(job)
            job.finish("cancelled")

    def put(self, job: Job) -> None:
        """Queue `job`, or raise the 429 APIError when `bound` jobs already wait (503 once stopped)."""
        with self._changed:
            if self._stopped:
                raise shutting_down()
            self._drop_cancelled()
            if len(self._jobs) >= self.bound:
                raise queue_full(self.bound)
            self._jobs.append(job)
            self._changed.notify()

    def get(self, block: bool = True) -> Job | None:
        """The next job whose client is still there; None once stopped. Without `block`, queue.Empty if none."""
        with self._changed:
            while True:
                self._drop_cancelled()
                if self._stopped:
                    return None
                if self._jobs:
                    return self._jobs.popleft()
                if not block:
                    raise queue.Empty
                self._changed.wait()

    def stop(self) -> None:
        with self._changed:
            self._stopped = True
            self._changed.notify_all()

    def drain(self) -> list[Job]:
        """Every job still waiting (at shutdown, to answer each)."""
        with self._changed:
            jobs, self._jobs = list(self._jobs), deque()
        return jobs

    def qsize(self) -> int:
        with self._changed:
            self._drop_cancelled()
            return len(self._jobs)
