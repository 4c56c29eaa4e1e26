"""`specrt serve`: an OpenAI-compatible HTTP API over one Pipeline (FastAPI + uvicorn).

Routes: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health (503
while the bundle loads), GET /metrics (Prometheus). Every error is OpenAI's shape
`{"error": {"message", "type", "param", "code"}}`; a user's mistake is a 4xx with a message
that says what to change, never a traceback. The handlers are thin: `protocol.parse` checks
the body, `Pipeline.request` checks the limits, the engine runs it, `TextStream` makes text.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..engine import EngineBusy, EngineClosed
from ..sampling import InvalidSampling
from ..textstream import TextStream
from . import protocol
from .metrics import CONTENT_TYPE, Metrics
from .protocol import APIError

log = logging.getLogger("specrt.serve")
FINISH = {"eos": "stop", "stop": "stop", "length": "length", "timeout": "timeout"}


@dataclass
class ServerConfig:
    model_id: str  # what /v1/models lists and requests must name
    api_key: str | None = None  # Bearer token required on /v1/* (None: open)
    max_body_bytes: int = 1 << 20  # larger bodies get 413
    request_timeout_s: float | None = None  # a request still running then ends (finish_reason "timeout")
    draft: str | None = None  # per-request drafter (None: the pipeline's default)
    adaptive: bool | None = None


@dataclass
class _State:
    cfg: ServerConfig
    pipe: object = None  # Pipeline once loaded
    error: str | None = None  # why loading failed
    metrics: Metrics | None = None
    created: int = field(default_factory=lambda: int(time.time()))


def build_app(cfg: ServerConfig, load, on_load_error=None) -> FastAPI:
    """load() -> Pipeline, run in a thread at startup; /health says 503 until it returns.
    on_load_error(exception): called if it raises (the CLI stops the server)."""
    st = _State(cfg)

    def _load():
        try:
            pipe = load()
            st.metrics = Metrics(cfg.model_id, pipe.counters, pipe.kv_bytes)
            st.pipe = pipe
            log.info("specrt: %s ready (%d slots, %d KV bytes)", cfg.model_id, pipe.counters()["slots"], pipe.kv_bytes)
        except Exception as e:  # noqa: BLE001 - reported by /health and the log
            st.error = str(e)
            log.error("specrt: cannot load %s: %s", cfg.model_id, e)
            if on_load_error is not None:
                on_load_error(e)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        threading.Thread(target=_load, name="specrt-load", daemon=True).start()
        yield
        if st.pipe is not None:
            st.pipe.close()

    app = FastAPI(title="specrt", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.specrt = st

    def fail(e: APIError) -> JSONResponse:
        if st.metrics is not None:
            st.metrics.error(e.status)
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, e: APIError):
        return fail(e)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException):
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        msg = f"no route {request.method} {request.url.path}" if e.status_code in (404, 405) else str(e.detail)
        return fail(APIError(e.status_code, msg, kind, None, "not_found" if e.status_code == 404 else None))

    @app.exception_handler(Exception)
    async def _internal(request: Request, e: Exception):
        log.exception("specrt: internal error on %s", request.url.path)
        return fail(APIError(500, "internal server error", "server_error"))

    def ready():
        if st.pipe is None:
            msg = f"the model failed to load: {st.error}" if st.error else "the model is loading"
            raise APIError(503, msg, "server_error", code="model_loading", headers={"Retry-After": "2"})
        return st.pipe

    def auth(request: Request):
        if cfg.api_key is None:
            return
        got = request.headers.get("authorization", "")
        token = got[7:] if got[:7].lower() == "bearer " else ""
        if not hmac.compare_digest(token.encode(), cfg.api_key.encode()):
            raise APIError(401, "invalid or missing API key (Authorization: Bearer <key>)", "authentication_error",
                           code="invalid_api_key")

    async def read_json(request: Request):
        n = request.headers.get("content-length")
        if n is not None and n.isdigit() and int(n) > cfg.max_body_bytes:
            raise APIError(413, f"request body of {n} bytes exceeds the limit of {cfg.max_body_bytes}", code="body_too_large")
        buf = bytearray()
        async for part in request.stream():
            buf += part
            if len(buf) > cfg.max_body_bytes:
                raise APIError(413, f"request body exceeds the limit of {cfg.max_body_bytes} bytes", code="body_too_large")
        try:
            return json.loads(buf)
        except (ValueError, UnicodeDecodeError, RecursionError) as e:
            raise protocol.bad(f"the request body is not valid JSON: {str(e)[:200]}") from None

    @app.get("/health")
    async def health():
        if st.pipe is None:
            return JSONResponse({"status": "error" if st.error else "loading", "error": st.error}, status_code=503,
                                headers={"Retry-After": "2"})
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        if st.metrics is None:
            return Response(b"", media_type=CONTENT_TYPE)
        return Response(st.metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def models(request: Request):
        auth(request)
        pipe = ready()
        return {"object": "list", "data": [{"id": cfg.model_id, "object": "model", "created": st.created,
                                            "owned_by": "specrt", "max_model_len": pipe.max_seq_len}]}

    async def generate(request: Request, chat: bool):
        auth(request)
        pipe = ready()
        p = protocol.parse(await read_json(request), chat)
        if p.model != cfg.model_id:
            raise APIError(404, f"model {p.model!r} does not exist; this server serves {cfg.model_id!r}",
                           "invalid_request_error", "model", "model_not_found")
        tok = pipe.tokenizer
        try:
            ids = tok.encode_messages(p.messages) if chat else tok.encode(p.prompt, chat=False)
        except Exception as e:  # noqa: BLE001 - the bundle's chat template refused these messages
            raise protocol.bad(f"the chat template cannot render these messages: {str(e)[:300]}",
                               "messages" if chat else "prompt") from None
        room = pipe.max_seq_len - len(ids)
        if room < 1:
            raise protocol.bad(f"the prompt has {len(ids)} tokens and the context holds {pipe.max_seq_len}: "
                               "shorten it", "messages" if chat else "prompt", "context_length_exceeded")
        # defaults as OpenAI-compatible servers: chat runs to the context's end, completions 16
        max_new = p.max_tokens if p.max_tokens is not None else (room if chat else 16)
        try:
            r = pipe.request(ids, max_new_tokens=max_new, temperature=p.temperature, top_k=p.top_k, top_p=p.top_p,
                             seed=p.seed, draft=cfg.draft, adaptive=cfg.adaptive, timeout_s=cfg.request_timeout_s,
                             ignore_eos=p.ignore_eos)
        except (ValueError, InvalidSampling) as e:  # ContextOverflow is a ValueError
            raise protocol.bad(f"{e} (prompt: {len(ids)} tokens, context: {pipe.max_seq_len})",
                               "max_tokens" if "max_new_tokens" in str(e) else None) from None
        try:
            events = pipe.asubmit(r)
        except EngineBusy as e:
            raise APIError(503, str(e), "server_error", code="queue_full", headers={"Retry-After": "1"}) from None
        except EngineClosed:
            raise APIError(503, "the server is shutting down", "server_error", code="shutting_down") from None
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        job = _Job(st, pipe, r, events, TextStream(tok, p.stop), rid, chat, p, len(ids))
        if p.stream:
            return _Stream(job.sse(), lambda: pipe.engine.cancel(r), media_type="text/event-stream",
                           headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return JSONResponse(await job.collect(request))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await generate(request, True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await generate(request, False)

    return app


class _Stream(StreamingResponse):
    """A streamed response that cancels its request however the response ends: a client that
    disconnects before the first chunk leaves the generator unstarted (no `finally` of its
    own runs), and the request would otherwise hold a slot to its end."""

    def __init__(self, content, on_close, **kw):
        super().__init__(content, **kw)
        self._on_close = on_close

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()  # a request that already finished ignores it


class _Job:
    """One request's response: streamed as SSE chunks or collected into one body."""

    def __init__(self, st, pipe, r, events, text, rid, chat, p, n_prompt):
        self.st, self.pipe, self.r, self.events, self.text = st, pipe, r, events, text
        self.rid, self.chat, self.p, self.n_prompt = rid, chat, p, n_prompt
        self.created = int(time.time())
        self.t0 = time.perf_counter()
        self.t_first = None

    def _finish(self) -> str:
        if self.text.stopped:
            return "stop"
        return FINISH.get(self.r.stats.stop_reason, "stop")

    def _usage(self) -> dict:
        n = len(self.text.ids)
        return {"prompt_tokens": self.n_prompt, "completion_tokens": n, "total_tokens": self.n_prompt + n}

    def _record(self) -> None:
        m = self.st.metrics
        if m is None:
            return
        n = len(self.text.ids)
        end = time.perf_counter()
        ttft = self.t_first - self.t0 if self.t_first else None
        tpot = (end - self.t_first) / (n - 1) if self.t_first and n > 1 else None
        m.finished(self.n_prompt, n, self._finish(), ttft, tpot, end - self.t0)

    async def _pieces(self):
        """Text pieces as they are safe to show; ends at EOS / length / a stop string / timeout."""
        async for chunk in self.events:
            if self.t_first is None:
                self.t_first = time.perf_counter()
            piece = self.text.push(chunk)
            if piece:
                yield piece
            if self.text.stopped:
                return
        self.text.flush()

    def _chunk(self, content: str | None = None, finish: str | None = None, role: bool = False) -> dict:
        if self.chat:
            delta = {"role": "assistant", "content": ""} if role else ({"content": content} if content else {})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": content or "", "logprobs": None, "finish_reason": finish}
            obj = "text_completion"
        return {"id": self.rid, "object": obj, "created": self.created, "model": self.p.model, "choices": [choice]}

    async def sse(self):
        def data(obj) -> str:
            return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"

        try:
            if self.chat:
                yield data(self._chunk(role=True))
            async for piece in self._pieces():
                yield data(self._chunk(piece))
            tail = self.text.tail()
            if tail:
                yield data(self._chunk(tail))
            await self.events.aclose()  # a stop string ends the request now
            yield data(self._chunk(finish=self._finish()))
            if self.p.include_usage:
                u = self._chunk()
                u["choices"], u["usage"] = [], self._usage()
                yield data(u)
            yield "data: [DONE]\n\n"
            self._record()
        except Exception as e:  # noqa: BLE001 - mid-stream: the status is sent; say it in the stream
            log.error("specrt: request %s failed mid-stream: %s", self.rid, e)
            yield data(APIError(500, f"generation failed: {e}", "server_error").body())
            yield "data: [DONE]\n\n"
        finally:
            await self.events.aclose()  # a client that went away cancels its request

    async def collect(self, request: Request) -> dict:
        async def watch():  # a client that disconnects cancels its request
            while True:
                await asyncio.sleep(0.5)
                if await request.is_disconnected():
                    self.pipe.engine.cancel(self.r)
                    return

        watcher = asyncio.ensure_future(watch())
        try:
            parts = [piece async for piece in self._pieces()]
        finally:
            watcher.cancel()
            await self.events.aclose()
        text = "".join(parts) + self.text.tail()
        self._record()
        finish = self._finish()
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": finish}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
            obj = "text_completion"
        return {"id": self.rid, "object": obj, "created": self.created, "model": self.p.model, "choices": [choice],
                "usage": self._usage()}
