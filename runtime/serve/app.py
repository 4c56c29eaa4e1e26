"""`specrt serve`: an OpenAI-compatible HTTP API (FastAPI + uvicorn) over a serving object.

Routes: POST /v1/chat/completions, POST /v1/completions, POST /infill, /tokenize and /detokenize
(llama.cpp's), GET /v1/models, GET /health (503 while the bundle loads), GET /metrics
(Prometheus), GET /openapi.json (the schema of the wire models). Layers, as in the OpenAI
reference servers:
- this file: routes that only take a checked body and hand it on (FastAPI validates it against
  the wire models (schema*.py) first; bodies are read under a size limit), and one exception handler;
- serving.py: `OpenAIServing` turns a request into a response over an engine client (the pipeline in
  this process, or Ray replicas: ray/deploy.py); streaming.py runs one response's choices;
  outputs.py builds their shapes;
- errors.py maps every exception to OpenAI's `{"error": {...}}` by its class. A user's mistake
  is a 4xx with a message that says what to change, never a traceback.
"""

from __future__ import annotations

import contextlib
import json
import threading
from typing import Annotated

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..engine import EngineBusy, EngineClosed
from .anthropic import messages_api
from .anthropic.schema_messages import CountTokensRequest, MessagesRequest
from .config import ServerConfig
from .errors import APIError, ReplicaFailed, as_api_error, bad
from .llama.schema_infill import InfillRequest, InfillResponse
from .llama.schema_tokenize import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)
from .metrics import CONTENT_TYPE
from .openai import responses_api
from .openai.schema_chat import ChatCompletionRequest, ChatCompletionResponse
from .openai.schema_completion import CompletionRequest, CompletionResponse
from .openai.schema_responses import ResponsesRequest
from .schema import ErrorResponse, ModelList, dump
from .serving import LocalClient, OpenAIServing

__all__ = ["ServerConfig", "build_app", "make_app"]


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
    key = request.headers.get("x-api-key")  # Anthropic's clients send the key so
    serving.check_key(request.headers.get("authorization") or (f"Bearer {key}" if key else ""))


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
llama = APIRouter(route_class=_Route, dependencies=[Depends(_authorized), Depends(_ready)], responses=_ERRORS)


@v1.post("/chat/completions", response_model=ChatCompletionResponse)
async def create_chat_completion(req: ChatCompletionRequest, request: Request, serving: Serving):
    return await serving.chat(req, request)


@v1.post("/completions", response_model=CompletionResponse)
async def create_completion(req: CompletionRequest, request: Request, serving: Serving):
    return await serving.complete(req, request)


@llama.post("/infill", response_model=InfillResponse)
async def create_infill(req: InfillRequest, request: Request, serving: Serving):
    return await serving.infill(req, request)  # llama.cpp's fill-in-the-middle (serve/llama/infill.py)


@llama.post("/tokenize", response_model=TokenizeResponse)
async def tokenize(req: TokenizeRequest, serving: Serving):
    return JSONResponse(dump(serving.tokenize(req)))


@llama.post("/detokenize", response_model=DetokenizeResponse)
async def detokenize(req: DetokenizeRequest, serving: Serving):
    return JSONResponse(dump(serving.detokenize(req)))


@v1.post("/responses")
async def create_response(req: ResponsesRequest, request: Request, serving: Serving):
    return await responses_api.create(serving, req, request)


@v1.post("/messages")
async def create_message(req: MessagesRequest, request: Request, serving: Serving):
    return await messages_api.create(serving, req, request)


@v1.post("/messages/count_tokens")
async def count_message_tokens(req: CountTokensRequest, serving: Serving):
    return await messages_api.count_tokens(serving, req)


@v1.get("/models", response_model=ModelList)
async def list_models(serving: Serving):
    return JSONResponse(dump(serving.models()))


@ops.get("/health")
async def health(serving: Serving):
    status, body = await serving.health()
    return JSONResponse(body, status_code=status, headers={"Retry-After": "2"} if status != 200 else None)


@ops.get("/metrics")
async def metrics(serving: Serving):
    return Response(serving.metrics.render() if serving.metrics else b"", media_type=CONTENT_TYPE)


# ---- the one exception handler ------------------------------------------------------------

async def _error(request: Request, e: Exception) -> JSONResponse:
    err = as_api_error(e, request.method, request.url.path)
    serving = request.app.state.serving
    if serving.metrics is not None:
        serving.metrics.error(err.status_code)
    body = (messages_api.error_body(err) if request.url.path.startswith(messages_api.PATH)  # Anthropic's shape
            else dump(ErrorResponse(error=err.info)))
    return JSONResponse(body, status_code=err.status_code, headers=err.headers)


def build_app(cfg: ServerConfig, load, on_load_error=None) -> FastAPI:
    """load() -> Pipeline, run in a thread at startup; /health says 503 until it returns.
    on_load_error(exception): called if it raises (the CLI stops the server)."""
    client = LocalClient(cfg, load, on_load_error)
    serving = OpenAIServing(cfg, client)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        threading.Thread(target=client.load, name="specrt-load", daemon=True).start()
        yield
        serving.close()

    return make_app(serving, lifespan)


def make_app(serving: OpenAIServing, lifespan=None) -> FastAPI:
    """The HTTP API over a serving object (its engine client: this process's pipeline, or Ray's
    engine replicas, ray/deploy.py)."""
    # /openapi.json is served (the wire models' schema); the docs UIs stay off. A body
    # without Content-Type is read as JSON, as before FastAPI 0.132 made that strict.
    app = FastAPI(title="specrt", docs_url=None, redoc_url=None, lifespan=lifespan, strict_content_type=False)
    app.state.serving = serving
    for cls in (RequestValidationError, StarletteHTTPException, EngineBusy, EngineClosed, ReplicaFailed, Exception):
        app.add_exception_handler(cls, _error)
    app.include_router(v1)
    app.include_router(llama)
    app.include_router(ops)
    return app
