"""`specrt serve`: an OpenAI-compatible HTTP API over one Pipeline (FastAPI + uvicorn).

Routes: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health (503
while the bundle loads), GET /metrics (Prometheus), GET /openapi.json (the schema of the
protocol models). Three layers, as in the OpenAI reference servers:
- routes only take a checked body and hand it on; FastAPI validates it against the models
  in `protocol.py` first;
- `OpenAIServing` holds the pipeline, config and metrics and turns a request into a response
  (`chat`, `complete`); `_Job` streams or collects one request's text;
- `_error` maps every exception to OpenAI's `{"error": {...}}` by its class, in one place. A
  user's mistake is a 4xx with a message that says what to change, never a traceback.
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
from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..engine import EngineBusy, EngineClosed
from ..sampling import InvalidSampling
from ..textstream import TextStream
from .metrics import CONTENT_TYPE, Metrics
from .protocol import (
    AssistantMessage,
    ChatCompletionChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionStreamChoice,
    ChatCompletionStreamResponse,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    DeltaMessage,
    ErrorInfo,
    ErrorResponse,
    ModelCard,
    ModelList,
    PromptTokensDetails,
    UsageInfo,
    openai_error,
)

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


class APIError(HTTPException):
    """An error with OpenAI's body. An HTTPException, so FastAPI lets it through when raised
    while the body is read (it turns any other exception there into a bare 400)."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict | None = None):
        super().__init__(status, message, headers)
        self.info = ErrorInfo(message=message, type=type, param=param, code=code)


def bad(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, "invalid_request_error", param, code)


# ---- the serving layer ----------------------------------------------------------------------

class OpenAIServing:
    """The pipeline (loaded in a thread: the port opens at once), its config and metrics;
    `chat` / `complete` turn a validated request into a JSON or SSE response."""

    def __init__(self, cfg: ServerConfig, load, on_load_error=None):
        self.cfg, self._load, self._on_load_error = cfg, load, on_load_error
        self.pipe = None  # Pipeline once loaded
        self.error: str | None = None  # why loading failed
        self.metrics: Metrics | None = None
        self.created = int(time.time())

    def load(self) -> None:
        """Run in a thread at startup; /health says 503 until it returns."""
        try:
            pipe = self._load()
            self.metrics = Metrics(self.cfg.model_id, pipe.counters)
            self.pipe = pipe
            log.info("specrt: %s ready (%d slots)", self.cfg.model_id, pipe.counters()["slots"])
        except Exception as e:  # noqa: BLE001 - reported by /health and the log
            self.error = str(e)
            log.error("specrt: cannot load %s: %s", self.cfg.model_id, e)
            if self._on_load_error is not None:
                self._on_load_error(e)

    def close(self) -> None:
        if self.pipe is not None:
            self.pipe.close()

    def ready(self):
        if self.pipe is None:
            msg = f"the model failed to load: {self.error}" if self.error else "the model is loading"
            raise APIError(503, msg, "server_error", code="model_loading", headers={"Retry-After": "2"})
        return self.pipe

    def check_key(self, authorization: str) -> None:
        if self.cfg.api_key is None:
            return
        token = authorization[7:] if authorization[:7].lower() == "bearer " else ""
        if not hmac.compare_digest(token.encode(), self.cfg.api_key.encode()):
            raise APIError(401, "invalid or missing API key (Authorization: Bearer <key>)", "authentication_error",
                           code="invalid_api_key")

    def models(self) -> ModelList:
        return ModelList(data=[ModelCard(id=self.cfg.model_id, created=self.created,
                                         max_model_len=self.ready().max_seq_len)])

    async def chat(self, req: ChatCompletionRequest, request: Request) -> Response:
        pipe = self._served(req.model)
        try:
            ids = pipe.tokenizer.encode_messages(req.chat_messages())
        except Exception as e:  # noqa: BLE001 - the bundle's chat template refused these messages
            raise bad(f"the chat template cannot render these messages: {str(e)[:300]}", "messages") from None
        return await self._generate(req, ids, "messages", _ChatOutput(req.model), request)

    async def complete(self, req: CompletionRequest, request: Request) -> Response:
        pipe = self._served(req.model)
        ids = pipe.tokenizer.encode(req.prompt, chat=False)
        return await self._generate(req, ids, "prompt", _CompletionOutput(req.model), request)

    def _served(self, model: str):
        if model != self.cfg.model_id:
            raise APIError(404, f"model {model!r} does not exist; this server serves {self.cfg.model_id!r}",
                           "invalid_request_error", "model", "model_not_found")
        return self.ready()

    async def _generate(self, req, ids: list[int], prompt_param: str, out, request: Request) -> Response:
        job = self.start(req, ids, prompt_param, out)
        if req.stream:
            return _Stream(job.sse(req.include_usage), job.cancel, media_type="text/event-stream", headers=SSE_HEADERS)
        return JSONResponse(_dump(await job.collect(request)))

    def start(self, req, ids: list[int], prompt_param: str, out) -> _Job:
        """Submit a checked request to the engine now. Raises APIError (400: the prompt or
        max_tokens does not fit), EngineBusy or EngineClosed (503: see `as_api_error`)."""
        pipe = self.pipe
        room = pipe.max_seq_len - len(ids)
        if room < 1:
            raise bad(f"the prompt has {len(ids)} tokens and the context holds {pipe.max_seq_len}: shorten it",
                      prompt_param, "context_length_exceeded")
        p = req.to_gen_params(room)
        try:
            r = pipe.request(ids, **p.engine_kwargs(), draft=self.cfg.draft, adaptive=self.cfg.adaptive,
                             timeout_s=self.cfg.request_timeout_s)
        except (ValueError, InvalidSampling) as e:  # ContextOverflow is a ValueError
            param = "max_completion_tokens" if getattr(req, "max_completion_tokens", None) else "max_tokens"
            raise bad(f"{e} (prompt: {len(ids)} tokens, context: {pipe.max_seq_len})",
                      param if "max_new_tokens" in str(e) else None) from None
        events = pipe.asubmit(r)  # EngineBusy / EngineClosed: 503
        return _Job(pipe, r, events, TextStream(pipe.tokenizer, list(p.stop)), out, len(ids),
                    self.metrics.finished if self.metrics is not None else None)

    async def health(self) -> tuple[int, dict]:
        """(status, body) of GET /health: 200 once the pipeline is loaded."""
        if self.pipe is None:
            return 503, {"status": "error" if self.error else "loading", "error": self.error}
        return 200, {"status": "ok"}


SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _dump(model) -> dict:
    """A response as the JSON clients read: null fields kept (`"logprobs": null`), fields
    marked `exclude_if` dropped."""
    return model.model_dump(mode="json")


# ---- responses: the two endpoints' shapes ---------------------------------------------------

class _ChatOutput:
    def __init__(self, model: str):
        self.id, self.model, self.created = "chatcmpl-" + uuid.uuid4().hex[:24], model, int(time.time())

    def first(self) -> list[ChatCompletionStreamResponse]:
        return [self.chunk(DeltaMessage(role="assistant", content=""))]

    def piece(self, text: str) -> ChatCompletionStreamResponse:
        return self.chunk(DeltaMessage(content=text))

    def chunk(self, delta: DeltaMessage, finish: str | None = None) -> ChatCompletionStreamResponse:
        return ChatCompletionStreamResponse(id=self.id, created=self.created, model=self.model,
                                            choices=[ChatCompletionStreamChoice(delta=delta, finish_reason=finish)])

    def last(self, finish: str) -> ChatCompletionStreamResponse:
        return self.chunk(DeltaMessage(), finish)

    def usage(self, usage: UsageInfo) -> ChatCompletionStreamResponse:
        return ChatCompletionStreamResponse(id=self.id, created=self.created, model=self.model, choices=[],
                                            usage=usage)

    def whole(self, text: str, finish: str, usage: UsageInfo) -> ChatCompletionResponse:
        choice = ChatCompletionChoice(message=AssistantMessage(content=text), finish_reason=finish)
        return ChatCompletionResponse(id=self.id, created=self.created, model=self.model, choices=[choice],
                                      usage=usage)


class _CompletionOutput:
    def __init__(self, model: str):
        self.id, self.model, self.created = "cmpl-" + uuid.uuid4().hex[:24], model, int(time.time())

    def first(self) -> list[CompletionResponse]:
        return []  # completions have no role chunk

    def piece(self, text: str, finish: str | None = None) -> CompletionResponse:
        return CompletionResponse(id=self.id, created=self.created, model=self.model,
                                  choices=[CompletionChoice(text=text, finish_reason=finish)])

    def last(self, finish: str) -> CompletionResponse:
        return self.piece("", finish)

    def usage(self, usage: UsageInfo) -> CompletionResponse:
        return CompletionResponse(id=self.id, created=self.created, model=self.model, choices=[], usage=usage)

    def whole(self, text: str, finish: str, usage: UsageInfo) -> CompletionResponse:
        return CompletionResponse(id=self.id, created=self.created, model=self.model,
                                  choices=[CompletionChoice(text=text, finish_reason=finish)], usage=usage)


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

    def __init__(self, pipe, r, events, text: TextStream, out, n_prompt: int, record=None):
        """record(prompt_tokens, new_tokens, finish_reason, ttft_s, tpot_s, e2e_s): called once
        when the request ends normally (`Metrics.finished`); None records nothing."""
        self.pipe, self.r, self.events, self.text, self.out = pipe, r, events, text, out
        self.n_prompt, self.record = n_prompt, record
        self.t0 = time.perf_counter()
        self.t_first = None
        self.finished: tuple | None = None  # what was recorded, once the request ended normally

    def cancel(self) -> None:
        """Stop the request (a request that already finished ignores it)."""
        self.pipe.engine.cancel(self.r)

    def _finish(self) -> str:
        if self.text.stopped:
            return "stop"
        return FINISH.get(self.r.stats.stop_reason, "stop")

    def _usage(self) -> UsageInfo:
        n = len(self.text.ids)
        return UsageInfo(prompt_tokens=self.n_prompt, completion_tokens=n, total_tokens=self.n_prompt + n,
                         prompt_tokens_details=PromptTokensDetails(cached_tokens=self.r.stats.cached_tokens))

    def _record(self) -> None:
        n = len(self.text.ids)
        end = time.perf_counter()
        ttft = self.t_first - self.t0 if self.t_first else None
        tpot = (end - self.t_first) / (n - 1) if self.t_first and n > 1 else None
        self.finished = (self.n_prompt, n, self._finish(), ttft, tpot, end - self.t0)
        if self.record is not None:
            self.record(*self.finished)

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

    async def sse(self, include_usage: bool):
        def data(model) -> str:
            return f"data: {json.dumps(_dump(model), ensure_ascii=False)}\n\n"

        try:
            for chunk in self.out.first():
                yield data(chunk)
            async for piece in self._pieces():
                yield data(self.out.piece(piece))
            tail = self.text.tail()
            if tail:
                yield data(self.out.piece(tail))
            await self.events.aclose()  # a stop string ends the request now
            yield data(self.out.last(self._finish()))
            if include_usage:
                yield data(self.out.usage(self._usage()))
            yield "data: [DONE]\n\n"
            self._record()
        except Exception as e:  # noqa: BLE001 - mid-stream: the status is sent; say it in the stream
            log.error("specrt: request %s failed mid-stream: %s", self.out.id, e)
            yield data(ErrorResponse(error=ErrorInfo(message=f"generation failed: {e}", type="server_error")))
            yield "data: [DONE]\n\n"
        finally:
            await self.events.aclose()  # a client that went away cancels its request

    async def collect(self, request: Request | None = None):
        """The whole response. With an HTTP `request`, a client that disconnects cancels the
        request (polled every 0.5 s); without one, cancelling the calling task does."""
        watcher = asyncio.ensure_future(watch_disconnect(request, self.cancel)) if request is not None else None
        try:
            parts = [piece async for piece in self._pieces()]
        finally:
            if watcher is not None:
                watcher.cancel()
            await self.events.aclose()
        self._record()
        return self.out.whole("".join(parts) + self.text.tail(), self._finish(), self._usage())


async def watch_disconnect(request: Request, on_disconnect) -> None:
    """Call on_disconnect() once the HTTP client has gone (polled every 0.5 s); cancel the task
    that runs this when the response is complete."""
    while True:
        await asyncio.sleep(0.5)
        if await request.is_disconnected():
            on_disconnect()
            return


# ---- reading bodies -------------------------------------------------------------------------

class _BodyRequest(Request):
    """A request whose body is read under the server's size limit (413, checked on
    Content-Length and while a chunked body arrives) and parsed with an error that says what
    is wrong with the JSON."""

    async def body(self) -> bytes:
        if not hasattr(self, "_body"):
            limit = self.app.state.serving.cfg.max_body_bytes
            n = self.headers.get("content-length")
            if n is not None and n.isdigit() and int(n) > limit:
                raise APIError(413, f"request body of {n} bytes exceeds the limit of {limit}", code="body_too_large")
            buf = bytearray()
            async for part in self.stream():
                buf += part
                if len(buf) > limit:
                    raise APIError(413, f"request body exceeds the limit of {limit} bytes", code="body_too_large")
            self._body = bytes(buf)
        return self._body

    async def json(self):
        if not hasattr(self, "_json"):
            try:
                self._json = json.loads(await self.body())
            except (ValueError, UnicodeDecodeError, RecursionError) as e:  # nesting too deep is not a 500
                raise bad(f"the request body is not valid JSON: {str(e)[:200]}") from None
        return self._json


class _Route(APIRoute):
    """FastAPI's route, reading the body through `_BodyRequest` (FastAPI's custom-route idiom)."""

    def get_route_handler(self):
        handle = super().get_route_handler()

        async def route(request: Request) -> Response:
            return await handle(_BodyRequest(request.scope, request.receive))

        return route


# ---- routes ---------------------------------------------------------------------------------

def _serving(request: Request) -> OpenAIServing:
    return request.app.state.serving


Serving = Annotated[OpenAIServing, Depends(_serving)]


def _authorized(request: Request, serving: Serving) -> None:
    serving.check_key(request.headers.get("authorization", ""))


def _ready(serving: Serving) -> None:
    serving.ready()  # before the body is validated: a loading server says 503 to any request


# OpenAI's error body for every refusal; "4XX" also keeps FastAPI from documenting its own 422,
# which this server never sends (validation errors are 400s, as OpenAI's)
_ERRORS = {
    "4XX": {"model": ErrorResponse, "description": "400 invalid or unsupported field, 401 key, 404 model or route, "
                                                   "413 body too large"},
    503: {"model": ErrorResponse, "description": "loading, queue full or shutting down (Retry-After)"},
}
v1 = APIRouter(prefix="/v1", route_class=_Route, dependencies=[Depends(_authorized), Depends(_ready)],
               responses=_ERRORS)
ops = APIRouter()


@v1.post("/chat/completions", response_model=ChatCompletionResponse)
async def create_chat_completion(req: ChatCompletionRequest, request: Request, serving: Serving):
    return await serving.chat(req, request)


@v1.post("/completions", response_model=CompletionResponse)
async def create_completion(req: CompletionRequest, request: Request, serving: Serving):
    return await serving.complete(req, request)


@v1.get("/models", response_model=ModelList)
async def list_models(serving: Serving):
    return JSONResponse(_dump(serving.models()))


@ops.get("/health")
async def health(serving: Serving):
    status, body = await serving.health()
    return JSONResponse(body, status_code=status, headers={"Retry-After": "2"} if status != 200 else None)


@ops.get("/metrics")
async def metrics(serving: Serving):
    return Response(serving.metrics.render() if serving.metrics else b"", media_type=CONTENT_TYPE)


# ---- errors: one mapping from exception class to OpenAI's error -----------------------------

def as_api_error(e: Exception, method: str = "", path: str = "") -> APIError:
    """Any exception as the APIError the client gets (method and path: for routing errors and
    the log). Anything unexpected is a 500 whose traceback is logged: our bug."""
    if isinstance(e, APIError):
        return e
    if isinstance(e, RequestValidationError):
        info = openai_error(list(e.errors()))
        return APIError(400, info.message, info.type, info.param, info.code)
    if isinstance(e, EngineBusy):
        return APIError(503, str(e), "server_error", code="queue_full", headers={"Retry-After": "1"})
    if isinstance(e, EngineClosed):
        return APIError(503, "the server is shutting down", "server_error", code="shutting_down")
    if isinstance(e, StarletteHTTPException):  # routing: unknown path or method
        if e.status_code in (404, 405):
            return APIError(e.status_code, f"no route {method} {path}",
                            "not_found_error" if e.status_code == 404 else "invalid_request_error",
                            code="not_found" if e.status_code == 404 else None)
        return APIError(e.status_code, str(e.detail))
    log.error("specrt: internal error on %s", path, exc_info=e)  # our bug: the only traceback logged
    return APIError(500, "internal server error", "server_error")


async def _error(request: Request, e: Exception) -> JSONResponse:
    err = as_api_error(e, request.method, request.url.path)
    serving = request.app.state.serving
    if serving.metrics is not None:
        serving.metrics.error(err.status_code)
    return JSONResponse(_dump(ErrorResponse(error=err.info)), status_code=err.status_code, headers=err.headers)


def build_app(cfg: ServerConfig, load, on_load_error=None) -> FastAPI:
    """load() -> Pipeline, run in a thread at startup; /health says 503 until it returns.
    on_load_error(exception): called if it raises (the CLI stops the server)."""
    serving = OpenAIServing(cfg, load, on_load_error)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        threading.Thread(target=serving.load, name="specrt-load", daemon=True).start()
        yield
        serving.close()

    return make_app(serving, lifespan)


def make_app(serving, lifespan=None) -> FastAPI:
    """The HTTP API over a serving object: `OpenAIServing` here, or `RayServing`
    (ray_deploy.py), which hands requests to engine replicas. The object provides `cfg`,
    `metrics`, `health()`, `ready()`, `check_key()`, `models()`, `chat()`,
    `complete()`."""
    # /openapi.json is served (the protocol models' schema); the docs UIs stay off. A body
    # without Content-Type is read as JSON, as before FastAPI 0.132 made that strict.
    app = FastAPI(title="specrt", docs_url=None, redoc_url=None, lifespan=lifespan, strict_content_type=False)
    app.state.serving = serving
    for cls in (RequestValidationError, StarletteHTTPException, EngineBusy, EngineClosed, Exception):
        app.add_exception_handler(cls, _error)
    app.include_router(v1)
    app.include_router(ops)
    return app
