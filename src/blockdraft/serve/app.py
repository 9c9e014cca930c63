"""The FastAPI app: OpenAI-compatible completions and chat (streamed or not), models, health, metrics, playground."""

from __future__ import annotations

import asyncio
import hmac
import json
import time
import uuid
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .jobs import DEFAULT_MAX_QUEUE
from .metrics import Metrics
from .scheduler import Job, Scheduler
from .schemas import APIError, GenerationRequest, parse_generation, parse_json

MAX_BODY_BYTES = 1 << 20  # 1 MiB: far above any prompt the context can hold, far below a memory problem
STATIC = Path(__file__).parent / "static"
DISCONNECT_POLL_S = 0.5  # how often a queued or non-streamed request checks whether its client is still there


def _finish_reason(stop_reason: str) -> str:
    return "length" if stop_reason == "length" else "stop"


def _stats(result, method: str) -> dict:
    s = result.stats
    return {"method": method, "tau": s.tau, "target_calls": s.target_calls, "tree_nodes": s.tree_nodes,
            "tokens_per_s": s.tokens_per_s,
            "accepted_hist": {int(k): v for k, v in sorted(s.accepted_hist.items())}, "stop_reason": s.stop_reason}


class TextDeltas:
    """The new text of each step, so that the streamed pieces add up to exactly the final text: the whole
    output is decoded each time (multi-byte characters stay whole) and the tail that could still turn
    into a stop string, or is an incomplete character, is held back until the end."""

    def __init__(self, decode, stop_strings: tuple[str, ...]):
        self.decode, self.stop_strings = decode, stop_strings
        self.hold = max((len(s) for s in stop_strings), default=1) - 1
        self.tokens: list[int] = []
        self.sent = 0

    def add(self, ids: list[int]) -> str:
        self.tokens += ids
        text = self.decode(self.tokens)
        safe = len(text) - self.hold
        if text.endswith("\ufffd"):
            safe = min(safe, len(text) - 1)
        for stop in self.stop_strings:  # the step that completes a stop string still carries its tokens
            if stop in text:
                safe = min(safe, text.find(stop))
        if safe <= self.sent:
            return ""
        delta, self.sent = text[self.sent : safe], safe
        return delta

    def rest(self, final_text: str) -> str:
        return final_text[self.sent :]

    def pieces(self, ids: list[int]) -> list[str]:
        """Each new token's own text, for the playground's colouring (a few tokens of left context, so
        that tokenizers that drop a leading space of a lone token still show it)."""
        out, start = [], len(self.tokens) - len(ids)
        for i in range(start, len(self.tokens)):
            left = self.tokens[max(0, i - 4) : i]
            out.append(self.decode(left + [self.tokens[i]])[len(self.decode(left)) :])
        return out


def create_app(target, method="lookup", max_batch: int = 8, api_key: str | None = None,
               max_body_bytes: int = MAX_BODY_BYTES, own_thread: bool = True, prefix_cache_mb: float = 256,
               max_queue: int = DEFAULT_MAX_QUEUE) -> FastAPI:
    """An app serving `target` with the speculative method specs in `method` ('a,b,...' or a list; the first is
    the default, a request picks another by its `method` field), their drafters built now (a spec that cannot be
    built raises BlockdraftError here), decoding up to `max_batch` requests together, with at most `max_queue`
    waiting: on a worker thread the app starts (own_thread), or in a thread of the caller's, which then runs
    `app.state.scheduler.run()` itself. `prefix_cache_mb`: see BatchDecoder."""
    metrics = Metrics()
    scheduler = Scheduler(target, method, metrics, max_batch, own_thread=own_thread, prefix_cache_mb=prefix_cache_mb,
                          max_queue=max_queue)
    model_name = target.name

    @asynccontextmanager
    async def lifespan(app):
        scheduler.start()
        yield
        # in a thread: the loop must stay free to deliver the answers the worker gives while stopping
        await asyncio.to_thread(scheduler.stop)

    app = FastAPI(title="blockdraft", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.scheduler, app.state.metrics = scheduler, metrics

    # --- errors: always OpenAI's error object, never a stack trace ------------------
    @app.exception_handler(APIError)
    async def api_error(request, exc: APIError):
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, exc: StarletteHTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(APIError(exc.status_code, str(exc.detail), kind=kind).body(), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def internal_error(request, exc: Exception):
        err = APIError(500, f"internal error: {type(exc).__name__}", kind="server_error")
        return JSONResponse(err.body(), status_code=500)

    def authorize(request: Request) -> None:
        if api_key is None:
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        # compare_digest: the time taken does not reveal how much of the key was right
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), api_key.encode()):
            raise APIError(401, "missing or wrong API key: send 'Authorization: Bearer KEY'",
                           kind="authentication_error", code="invalid_api_key")

    async def read_body(request: Request) -> bytes:
        too_big = APIError(413, f"the request body is larger than {max_body_bytes} bytes", code="body_too_large")
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > max_body_bytes:
            raise too_big
        chunks, size = [], 0
        async for chunk in request.stream():  # a chunked body has no length header: count as it comes
            size += len(chunk)
            if size > max_body_bytes:
                raise too_big
            chunks.append(chunk)
        return b"".join(chunks)

    # --- routes --------------------------------------------------------------------
    @app.get("/", response_class=HTMLResponse)
    async def playground():
        return HTMLResponse((STATIC / "index.html").read_text(encoding="utf-8"))

    @app.get("/health")
    async def health():
        ok = scheduler.alive
        body = {"status": "ok" if ok else "worker stopped", "model": model_name, "queue": scheduler.queue.qsize(),
                "active": scheduler.active}
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def prometheus(request: Request):
        authorize(request)
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models(request: Request):
        authorize(request)
        return {"object": "list", "data": [{
            "id": model_name, "object": "model", "created": 0, "owned_by": "blockdraft",
            "blockdraft": {"default_method": scheduler.default_method, "methods": list(scheduler.methods)}}]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await generate(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await generate(request, chat=True)

    async def generate(request: Request, chat: bool):
        endpoint = "chat" if chat else "completions"
        try:
            authorize(request)
            req = parse_generation(target, parse_json(await read_body(request)), scheduler.methods, model_name, chat)
            job = Job(req, asyncio.get_running_loop())
            scheduler.submit(job)  # 429 past the queue's bound, 503 when shutting down
            kind, payload = await until_started(request, job)  # "started", or why it could not start
            if kind == "error":
                raise payload
        except APIError:
            metrics.count_request(endpoint, "error")
            raise
        if kind == "cancelled":  # its client went away while it waited: it never decoded
            metrics.count_request(endpoint, "cancelled")
            return JSONResponse({}, status_code=499)  # nobody reads it
        reply = Reply(req, model_name, chat)
        if req.stream:
            return StreamingResponse(stream(job, reply, endpoint), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await collect(request, job, reply, endpoint)

    async def until_started(request: Request, job: Job):
        """The job's first event, while making sure its client is still there: a request waiting in the queue
        whose client has gone is cancelled, and the worker drops it unread."""
        while True:
            try:
                return await asyncio.wait_for(job.next(), DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    job.cancel()
                    return "cancelled", None

    async def collect(request: Request, job: Job, reply: "Reply", endpoint: str):
        try:
            checked = time.perf_counter()
            while True:
                try:
                    kind, payload = await asyncio.wait_for(job.next(), DISCONNECT_POLL_S)
                except asyncio.TimeoutError:
                    kind = None
                # steps keep arriving while it decodes, so the client is checked on a clock, not on silence
                if time.perf_counter() - checked >= DISCONNECT_POLL_S:
                    checked = time.perf_counter()
                    if await request.is_disconnected():
                        job.cancel()
                        metrics.count_request(endpoint, "cancelled")
                        return JSONResponse({}, status_code=499)  # nobody reads it; the slot is freed
                if kind == "done":
                    metrics.count_request(endpoint, "ok")
                    return reply.full(payload)
                if kind == "error":
                    metrics.count_request(endpoint, "error")
                    raise payload
                if kind == "cancelled":
                    metrics.count_request(endpoint, "cancelled")
                    raise APIError(503, "the generation was cancelled", kind="server_error")
        finally:
            job.cancel()  # no-op once finished; frees the slot if this handler itself was cancelled

    async def stream(job: Job, reply: "Reply", endpoint: str):
        outcome = "cancelled"
        try:
            if reply.chat:  # OpenAI's chat streams open with the role
                yield reply.sse(reply.first_chunk())
            deltas = TextDeltas(target.decode, tuple(reply.req.stop) + target.stop_strings)
            while True:
                kind, payload = await job.next()
                if kind == "tokens":
                    ids, accepted = payload
                    delta = deltas.add(ids)
                    yield reply.sse(reply.chunk(delta, extra={"tokens": deltas.pieces(ids), "token_ids": ids,
                                                              "accepted": accepted}))
                elif kind == "done":
                    rest = deltas.rest(payload.text)
                    yield reply.sse(reply.chunk(rest, finish=_finish_reason(payload.stats.stop_reason),
                                                extra=_stats(payload, reply.req.method)))
                    if reply.req.include_usage:
                        yield reply.sse(reply.usage_chunk(payload))
                    yield b"data: [DONE]\n\n"
                    outcome = "ok"
                    return
                else:  # an error after the first token: the status is sent already, say it in the stream
                    err = payload if kind == "error" else APIError(503, "the generation was cancelled")
                    yield reply.sse(err.body())
                    yield b"data: [DONE]\n\n"
                    outcome = "error"
                    return
        finally:
            job.cancel()  # the client went away (or we are done): the worker stops at its next step
            metrics.count_request(endpoint, outcome)

    return app


class Reply:
    """OpenAI's response shapes for one request: the full object, stream chunks, usage."""

    def __init__(self, req: GenerationRequest, model: str, chat: bool):
        self.req, self.model, self.chat = req, model, chat
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())

    def _envelope(self, obj: str, choices: list, **more) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices,
                **more}

    def usage(self, result) -> dict:
        prompt, new = len(self.req.prompt_ids), result.stats.new_tokens
        return {"prompt_tokens": prompt, "completion_tokens": new, "total_tokens": prompt + new}

    def full(self, result) -> dict:
        finish = _finish_reason(result.stats.stop_reason)
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": result.text}, "finish_reason": finish}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": result.text, "finish_reason": finish, "logprobs": None}
            obj = "text_completion"
        return self._envelope(obj, [choice], usage=self.usage(result), blockdraft=_stats(result, self.req.method))

    def first_chunk(self) -> dict:
        return self._envelope("chat.completion.chunk",
                              [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])

    def chunk(self, text: str, finish: str | None = None, extra: dict | None = None) -> dict:
        if self.chat:
            choice = {"index": 0, "delta": {"content": text} if text else {}, "finish_reason": finish}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
            obj = "text_completion"
        return self._envelope(obj, [choice], **({"blockdraft": extra} if extra else {}))

    def usage_chunk(self, result) -> dict:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return self._envelope(obj, [], usage=self.usage(result))

    @staticmethod
    def sse(obj: dict) -> bytes:
        return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n".encode()
