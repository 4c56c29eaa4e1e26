"""Every error as OpenAI's `{"error": {...}}`, chosen by the exception's class, in one place.

A user's mistake is a 4xx with a message that says what to change and `param` naming the
field: pydantic's validation errors through `openai_error`, the runtime's `InvalidRequest`
through its own `param` (mapped onto the request's field by the request model's `field_of`). A
full queue, a closing engine and a failed Ray replica are 503s with Retry-After; anything
else is our bug: a 500 whose traceback is logged, never sent.
"""

from __future__ import annotations

import json
import logging

from fastapi import HTTPException
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..engine import EngineBusy, EngineClosed
from .schema import ErrorInfo

log = logging.getLogger("specrt.serve")


class APIError(HTTPException):
    """An error with OpenAI's body. An HTTPException, so FastAPI lets it through when raised
    while the body is read (it turns any other exception there into a bare 400)."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict | None = None):
        super().__init__(status, message, headers)
        self.info = ErrorInfo(message=message, type=type, param=param, code=code)


def bad(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, "invalid_request_error", param, code)


class ReplicaFailed(Exception):
    """The engine replica serving a request died (Ray); the client may retry. headers: sent
    with the 503 (the replica's name)."""

    def __init__(self, message: str, headers: dict | None = None):
        super().__init__(message)
        self.headers = headers or {}


# 503s: exception class -> (code, Retry-After seconds or None, fixed message or None: str(e))
_UNAVAILABLE = {
    EngineBusy: ("queue_full", "1", None),
    EngineClosed: ("shutting_down", None, "the server is shutting down"),
    ReplicaFailed: ("replica_failed", "1", None),
}


def as_api_error(e: Exception, method: str = "", path: str = "") -> APIError:
    """Any exception as the APIError the client gets (method and path: for routing errors and
    the log). Anything unexpected is a 500 whose traceback is logged: our bug."""
    if isinstance(e, APIError):
        return e
    if isinstance(e, RequestValidationError):
        info = openai_error(list(e.errors()))
        return APIError(400, info.message, info.type, info.param, info.code)
    for cls, (code, retry, message) in _UNAVAILABLE.items():
        if isinstance(e, cls):
            headers = ({"Retry-After": retry} if retry else {}) | (e.headers if isinstance(e, ReplicaFailed) else {})
            return APIError(503, message or str(e), "server_error", code=code, headers=headers or None)
    if isinstance(e, StarletteHTTPException):  # routing: unknown path or method
        if e.status_code in (404, 405):
            return APIError(e.status_code, f"no route {method} {path}",
                            "not_found_error" if e.status_code == 404 else "invalid_request_error",
                            code="not_found" if e.status_code == 404 else None)
        return APIError(e.status_code, str(e.detail))
    log.error("specrt: internal error on %s", path, exc_info=e)  # our bug: the only traceback logged
    return APIError(500, "internal server error", "server_error")


def stream_error(e: Exception) -> ErrorInfo:
    """The error chunk that ends a stream whose 200 is already sent: a failed replica as its
    503 would say, anything else as a failed generation."""
    if isinstance(e, ReplicaFailed):
        return as_api_error(e).info
    return ErrorInfo(message=f"generation failed: {e}", type="server_error")


# ---- pydantic's errors as OpenAI's ----------------------------------------------------------

# pydantic names each member of a union in an error's location ("str", "list[...]",
# "literal['none','auto']", a model's class name) and a dict key's own error "[key]"; clients
# wrote only field names, keys and indexes
_KINDS = {"str": "a string", "int": "an integer", "float": "a number", "bool": "a boolean"}
_OWN_CODES = {"unsupported_parameter"}  # our codes, passed on as the error's `code`


def _is_member(part) -> bool:
    return isinstance(part, str) and (part in _KINDS or "[" in part or part[:1].isupper())


def _kind(member: str) -> str:
    if member.startswith("literal["):
        return member[len("literal["):-1]
    return _KINDS.get(member) or ("a list" if member.startswith("list[") else "an object")


def _param(loc) -> str | None:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not _is_member(part):
            out += f".{part}" if out else part
    return out or None


def _got(value) -> str:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return f" (got {json.dumps(value)[:40]})"
    return ""  # objects and lists: the param says where


def openai_error(errors: list[dict]) -> ErrorInfo:
    """pydantic's (or FastAPI's) validation errors -> one OpenAI error. The deepest error is the
    one a client can act on: a union reports one error per member, the member that matched
    furthest has the longest location."""
    e = max(errors, key=lambda e: len(e.get("loc", ())))
    loc = tuple(e.get("loc", ()))
    if loc[:1] == ("body",):  # FastAPI's prefix for the request body
        loc = loc[1:]
    ctx = e.get("ctx") or {}
    param = ctx.get("param") or _param(loc)
    if e["type"] in _OWN_CODES or e["type"] == "invalid_combination":
        return ErrorInfo(message=e["msg"], type="invalid_request_error", param=param,
                         code=e["type"] if e["type"] in _OWN_CODES else None)
    if param is None:
        return ErrorInfo(message="the request body must be a JSON object (Content-Type: application/json) "
                                 "with the endpoint's fields", type="invalid_request_error")
    msg = e["msg"]
    members = [p for p in loc if _is_member(p)]
    if members and loc[-1] == members[-1] and len(errors) > 1:  # no member of a union matched at all
        kinds = dict.fromkeys(_kind(p) for x in errors for p in x["loc"][-1:] if _is_member(p))
        msg = "must be " + " or ".join(kinds)
    if e["type"] == "missing" and not ctx:
        msg = "is required" if msg == "Field required" else msg
    return ErrorInfo(message=f"'{param}': {msg}{_got(e.get('input')) if e['type'] != 'missing' else ''}",
                     type="invalid_request_error", param=param)
