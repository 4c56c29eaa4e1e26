"""`specrt serve`: an OpenAI-compatible HTTP API (FastAPI + uvicorn) over a serving object.

Routes: POST /v1/chat/completions, POST /v1/completions, POST /infill, /tokenize and /detokenize
(llama.cpp's), GET /v1/models, GET /health (503 while the bundle loads), GET /metrics
(Prometheus), GET /openapi.json (the schema of the wire models). Layers, as in the OpenAI
reference servers:
- this file: the app, which mounts each wire API's router (openai/routes.py, anthropic/routes.py,
  llama/routes.py: routes that only take a checked body and hand it on; FastAPI validates it
  against the wire models (schema*.py) first; routes.py: what they share, bodies read under a
  size limit), the operator's /health and /metrics, and one exception handler;
- serving.py: `OpenAIServing` turns a request into a response over an engine client (the pipeline in
  this process, or Ray replicas: ray/deploy.py); streaming.py runs one response's choices;
  outputs.py builds their shapes;
- errors.py maps every exception to OpenAI's `{"error": {...}}` by its class. A user's mistake
  is a 4xx with a message that says what to change, never a traceback.
"""

from __future__ import annotations

import contextlib
import threading

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..engine import EngineBusy, EngineClosed
from .anthropic import messages_api
from .anthropic.routes import router as anthropic_routes
from .config import ServerConfig
from .errors import ReplicaFailed, as_api_error
from .llama.routes import router as llama_routes
from .metrics import CONTENT_TYPE
from .openai.routes import router as openai_routes
from .routes import Serving
from .schema import ErrorResponse, dump
from .serving import LocalClient, OpenAIServing

__all__ = ["ServerConfig", "build_app", "make_app"]

ops = APIRouter()  # the operator's: no key, answered while loading


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
    for router in (openai_routes, anthropic_routes, llama_routes, ops):
        app.include_router(router)
    return app
