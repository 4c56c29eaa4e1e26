"""What every wire API's routes share (serve/openai/routes.py, serve/anthropic/routes.py,
serve/llama/routes.py; the app mounts them: serve/app.py): the body read under the server's
size limit, the API key, 503 while the bundle loads, and the serving object a route hands the
checked body to (`Serving`)."""

from __future__ import annotations

import json
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from fastapi.routing import APIRoute

from .errors import APIError, bad
from .schema import ErrorResponse
from .serving import OpenAIServing

__all__ = ["Serving", "api_router"]


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


# ---- what every API route depends on -----------------------------------------------------------------------------

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


def api_router(prefix: str = "") -> APIRouter:
    """A router for one wire API's routes: bodies read under the size limit, the key checked,
    503 while loading, OpenAI's error body documented (an API with its own error shape, as
    Anthropic's, gets it from the app's one exception handler)."""
    return APIRouter(prefix=prefix, route_class=_Route, dependencies=[Depends(_authorized), Depends(_ready)],
                     responses=_ERRORS)
