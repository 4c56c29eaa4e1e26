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
from ..grammar import GrammarError
from ..sampling import InvalidSampling
from ..textstream import TextStream
from ..toolcalls import ToolError
from .metrics import CONTENT_TYPE, Metrics
from .protocol import (
    AssistantMessage,
    ChatCompletionChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionStreamChoice,
    ChatCompletionStreamResponse,
    ChatCompletionTokenLogprob,
    ChoiceLogprobs,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    DeltaMessage,
    ErrorInfo,
    ErrorResponse,
    ModelCard,
    ModelList,
    PromptTokensDetails,
    TopLogprob,
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
            self.metrics = Metrics(self.cfg.model_id, pipe.counters, pipe.kv_bytes)
            self.pipe = pipe
            log.info("specrt: %s ready (%d slots, %d KV bytes)", self.cfg.model_id, pipe.counters()["slots"],
                     pipe.kv_bytes)
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
        from .tools import chat_prompt  # tool calls (serve/tools.py)

        pipe = self._served(req.model)
        try:
            ids, out = chat_prompt(req, pipe.tokenizer)
        except ToolError as e:  # tools this bundle's template cannot render, malformed tools
            raise APIError(400, str(e), param=e.param, code=e.code) from None
        except Exception as e:  # noqa: BLE001 - the bundle's chat template refused these messages
            raise bad(f"the chat template cannot render these messages: {str(e)[:300]}", "messages") from None
        return await self._generate(req, ids, "messages", out, request)

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
        reply = self.start(req, ids, prompt_param, out)
        if req.stream:
            return _Stream(reply.sse(req.include_usage), reply.cancel, media_type="text/event-stream",
                           headers=SSE_HEADERS)
        return JSONResponse(_dump(await reply.collect(request)))

    def start(self, req, ids: list[int], prompt_param: str, out) -> _Reply:
        """Submit the request's choices to the engine now. Raises APIError (400: the prompt or
        max_tokens does not fit, a grammar that cannot compile), EngineBusy or EngineClosed
        (503: see `as_api_error`)."""
        pipe = self.pipe
        room = pipe.max_seq_len - len(ids)
        if room < 1:
            raise bad(f"the prompt has {len(ids)} tokens and the context holds {pipe.max_seq_len}: shorten it",
                      prompt_param, "context_length_exceeded")
        from .tools import with_tool_grammar  # tool calls (serve/tools.py)

        p = with_tool_grammar(req.to_gen_params(room), out)
        n = req.n or 1
        try:  # choice i samples from its own stream derived from the seed (runtime/pipeline.py `sibling`)
            rs = [pipe.request(ids, **p.engine_kwargs(), draft=self.cfg.draft, adaptive=self.cfg.adaptive,
                               timeout_s=self.cfg.request_timeout_s, sibling=i) for i in range(n)]
        except GrammarError as e:  # a schema / regex / grammar the engine cannot compile
            raise bad(str(e), p.grammar_param, "invalid_grammar") from None
        except (ValueError, InvalidSampling) as e:  # ContextOverflow is a ValueError
            param = "max_completion_tokens" if getattr(req, "max_completion_tokens", None) else "max_tokens"
            named = next((n for n in ("logit_bias", "min_tokens", "ignore_eos") if n in str(e)), None)
            raise bad(f"{e} (prompt: {len(ids)} tokens, context: {pipe.max_seq_len})",
                      named or (param if "max_new_tokens" in str(e) else None)) from None
        jobs: list[_Job] = []
        try:  # all choices go in together: the later ones wait for the first one's prefill and copy it
            for i, r in enumerate(rs):
                jobs.append(_Job(pipe, r, pipe.asubmit(r), TextStream(pipe.tokenizer, list(p.stop)), i))
        except Exception:  # EngineBusy / EngineClosed (503, see as_api_error): the choices already in stop
            for job in jobs:
                job.cancel()
            raise
        return _Reply(jobs, out, len(ids), self.metrics.finished if self.metrics is not None else None)

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

def _token(text: str, logprob: float) -> dict:
    return {"token": text, "logprob": logprob, "bytes": list(text.encode())}


class _ChatOutput:
    """Chat's response shapes. Plain data (the Ray ingress sends it to an engine replica): token
    logprobs arrive as text already (`_Job.new_logprobs`)."""

    def __init__(self, model: str):
        self.id, self.model, self.created = "chatcmpl-" + uuid.uuid4().hex[:24], model, int(time.time())

    def first(self, index: int) -> list[ChatCompletionStreamResponse]:
        return [self.chunk(index, DeltaMessage(role="assistant", content=""))]

    def piece(self, index: int, text: str, lp: list | None = None) -> ChatCompletionStreamResponse:
        return self.chunk(index, DeltaMessage(content=text), logprobs=self.logprobs(index, lp))

    def chunk(self, index: int, delta: DeltaMessage, finish: str | None = None,
              logprobs=None) -> ChatCompletionStreamResponse:
        choice = ChatCompletionStreamChoice(index=index, delta=delta, finish_reason=finish, logprobs=logprobs)
        return ChatCompletionStreamResponse(id=self.id, created=self.created, model=self.model, choices=[choice])

    def last(self, index: int, finish: str) -> ChatCompletionStreamResponse:
        return self.chunk(index, DeltaMessage(), finish)

    def usage(self, usage: UsageInfo) -> ChatCompletionStreamResponse:
        return ChatCompletionStreamResponse(id=self.id, created=self.created, model=self.model, choices=[],
                                            usage=usage)

    def logprobs(self, index: int, lp: list | None) -> ChoiceLogprobs | None:
        """(token text, logprob, [(text, logprob)] alternatives) per token -> OpenAI's chat
        logprobs (None: not asked)."""
        if lp is None:
            return None
        return ChoiceLogprobs(content=[
            ChatCompletionTokenLogprob(**_token(text, v), top_logprobs=[TopLogprob(**_token(t, w)) for t, w in top])
            for text, v, top in lp])

    def whole(self, choices: list[tuple[str, str, list | None]], usage: UsageInfo) -> ChatCompletionResponse:
        """choices: (text, finish_reason, logprobs) per choice, in index order."""
        return ChatCompletionResponse(id=self.id, created=self.created, model=self.model, usage=usage, choices=[
            ChatCompletionChoice(index=i, message=AssistantMessage(content=text), finish_reason=finish,
                                 logprobs=self.logprobs(i, lp))
            for i, (text, finish, lp) in enumerate(choices)])


class _CompletionOutput:
    """Completions' response shapes (plain data, as `_ChatOutput`)."""

    def __init__(self, model: str):
        self.id, self.model, self.created = "cmpl-" + uuid.uuid4().hex[:24], model, int(time.time())
        self.offsets: dict[int, int] = {}  # per choice: characters its logprobs' text_offset has passed

    def first(self, index: int) -> list[CompletionResponse]:
        return []  # completions have no role chunk

    def piece(self, index: int, text: str, lp: list | None = None, finish: str | None = None) -> CompletionResponse:
        choice = CompletionChoice(index=index, text=text, finish_reason=finish, logprobs=self.logprobs(index, lp))
        return CompletionResponse(id=self.id, created=self.created, model=self.model, choices=[choice])

    def last(self, index: int, finish: str) -> CompletionResponse:
        return self.piece(index, "", finish=finish)

    def usage(self, usage: UsageInfo) -> CompletionResponse:
        return CompletionResponse(id=self.id, created=self.created, model=self.model, choices=[], usage=usage)

    def logprobs(self, index: int, lp: list | None) -> CompletionLogprobs | None:
        """TokenLogprob entries -> the legacy parallel lists (text_offset: where each token's
        text starts in the choice's text)."""
        if lp is None:
            return None
        out = CompletionLogprobs()
        for text, v, top in lp:
            out.tokens.append(text)
            out.token_logprobs.append(v)
            out.top_logprobs.append(dict(top))
            out.text_offset.append(self.offsets.get(index, 0))
            self.offsets[index] = self.offsets.get(index, 0) + len(text)
        return out

    def whole(self, choices: list[tuple[str, str, list | None]], usage: UsageInfo) -> CompletionResponse:
        return CompletionResponse(id=self.id, created=self.created, model=self.model, usage=usage, choices=[
            CompletionChoice(index=i, text=text, finish_reason=finish, logprobs=self.logprobs(i, lp))
            for i, (text, finish, lp) in enumerate(choices)])


class _Stream(StreamingResponse):
    """A streamed response that cancels its requests however the response ends: a client that
    disconnects before the first chunk leaves the generator unstarted (no `finally` of its
    own runs), and the requests would otherwise hold their slots to the end."""

    def __init__(self, content, on_close, **kw):
        super().__init__(content, **kw)
        self._on_close = on_close

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()  # requests that already finished ignore it


class _Job:
    """One choice: its request, token events and text."""

    def __init__(self, pipe, r, events, text: TextStream, index: int):
        self.pipe, self.r, self.events, self.text, self.index = pipe, r, events, text, index
        self.t0 = time.perf_counter()
        self.t_first = None
        self.lp_sent = 0  # tokens whose logprobs went out

    def cancel(self) -> None:
        """Stop the request (a request that already finished ignores it)."""
        self.pipe.engine.cancel(self.r)

    async def close(self) -> None:
        await self.events.aclose()  # cancels a request still running

    def new_logprobs(self) -> list | None:
        """(token text, logprob, [(text, logprob)] alternatives) of the tokens pushed since the
        last call (None when not asked)."""
        if self.r.logprobs is None:
            return None
        n = len(self.text.ids)
        lp, self.lp_sent = self.r.token_logprobs[self.lp_sent : n], n
        text = self.pipe.tokenizer.token_text
        return [(text(e.token), e.logprob, [(text(t), v) for t, v in e.top]) for e in lp]

    def finish(self) -> str:
        if self.text.stopped:
            return "stop"
        return FINISH.get(self.r.stats.stop_reason, "stop")

    async def pieces(self):
        """Text pieces as they are safe to show; ends at EOS / length / a stop string / timeout
        (then the request is over: a stop string cancels it)."""
        async for chunk in self.events:
            if self.t_first is None:
                self.t_first = time.perf_counter()
            piece = self.text.push(chunk)
            if piece:
                yield piece
            if self.text.stopped:
                break
        else:
            self.text.flush()
        await self.events.aclose()

    def outcome(self, n_prompt: int) -> tuple:
        """`Metrics.finished`'s arguments: (prompt tokens, new tokens, finish reason, TTFT s,
        TPOT s, end-to-end s)."""
        n = len(self.text.ids)
        end = time.perf_counter()
        ttft = self.t_first - self.t0 if self.t_first else None
        tpot = (end - self.t_first) / (n - 1) if self.t_first and n > 1 else None
        return n_prompt, n, self.finish(), ttft, tpot, end - self.t0


class _Reply:
    """One response over n choices: streamed as SSE chunks (choices interleaved as their tokens
    come, each chunk naming its `index`) or collected into one body. The prompt counts once in
    usage; its cached tokens are the first choice's (the others copy its rows)."""

    def __init__(self, jobs: list[_Job], out, n_prompt: int, record=None):
        """record(prompt_tokens, new_tokens, finish_reason, ttft_s, tpot_s, e2e_s): called once
        per choice that ends normally (`Metrics.finished`); None records nothing."""
        self.jobs, self.out, self.n_prompt, self.record = jobs, out, n_prompt, record
        self.finished: list[tuple] = []  # what was recorded, per choice that ended normally

    def _done(self, job: _Job) -> None:
        rec = job.outcome(self.n_prompt if job.index == 0 else 0)  # the prompt counts once
        self.finished.append(rec)
        if self.record is not None:
            self.record(*rec)

    def usage(self) -> UsageInfo:
        n = sum(len(j.text.ids) for j in self.jobs)
        return UsageInfo(prompt_tokens=self.n_prompt, completion_tokens=n, total_tokens=self.n_prompt + n,
                         prompt_tokens_details=PromptTokensDetails(cached_tokens=self.jobs[0].r.stats.cached_tokens))

    def cancel(self) -> None:
        for j in self.jobs:
            j.cancel()

    async def _choice(self, job: _Job):
        """One choice's chunks: role, content pieces (with their logprobs), the finish chunk."""
        out, i = self.out, job.index
        for chunk in out.first(i):
            yield chunk
        async for piece in job.pieces():
            chunk = out.piece(i, piece, job.new_logprobs())
            if chunk is not None:  # None: nothing to say yet (tool calls: a tag held back, serve/tools.py)
                yield chunk
        tail, lp = job.text.tail(), job.new_logprobs()
        if tail or lp:
            yield out.piece(i, tail, lp)
        yield out.last(i, job.finish())

    async def sse(self, include_usage: bool):
        def data(model) -> str:
            return f"data: {json.dumps(_dump(model), ensure_ascii=False)}\n\n"

        queue: asyncio.Queue = asyncio.Queue()

        async def pump(job):
            try:
                async for chunk in self._choice(job):
                    await queue.put(chunk)
                await queue.put(job)  # this choice is done
            except Exception as e:  # noqa: BLE001 - reported in the stream below
                await queue.put(e)

        tasks = [asyncio.ensure_future(pump(j)) for j in self.jobs]
        try:
            left = len(self.jobs)
            while left:
                item = await queue.get()
                if isinstance(item, Exception):
                    raise item
                if isinstance(item, _Job):
                    left -= 1
                    self._done(item)
                    continue
                yield data(item)
            if include_usage:
                yield data(self.out.usage(self.usage()))
            yield "data: [DONE]\n\n"
        except Exception as e:  # noqa: BLE001 - mid-stream: the status is sent; say it in the stream
            log.error("specrt: request %s failed mid-stream: %s", self.out.id, e)
            yield data(ErrorResponse(error=ErrorInfo(message=f"generation failed: {e}", type="server_error")))
            yield "data: [DONE]\n\n"
        finally:  # a client that went away cancels its requests; each pump ends with its request
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for j in self.jobs:
                await j.close()

    async def collect(self, request: Request | None = None):
        """The whole response. With an HTTP `request`, a client that disconnects cancels the
        requests (polled every 0.5 s); without one, cancelling the calling task does."""

        async def whole(job: _Job):
            text = "".join([piece async for piece in job.pieces()]) + job.text.tail()
            self._done(job)
            return text, job.finish(), job.new_logprobs()

        watcher = asyncio.ensure_future(watch_disconnect(request, self.cancel)) if request is not None else None
        tasks = [asyncio.ensure_future(whole(j)) for j in self.jobs]
        try:
            choices = await asyncio.gather(*tasks)
        finally:  # one choice failed (or the caller was cancelled): the others stop, then close
            if watcher is not None:
                watcher.cancel()
            self.cancel()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for j in self.jobs:
                await j.close()
        return self.out.whole(list(choices), self.usage())


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
