"""Anthropic's routes: /v1/messages and /v1/messages/count_tokens (errors in Anthropic's shape:
the app's exception handler asks `messages_api.error_body` for any path under /v1/messages)."""

from __future__ import annotations

from fastapi import Request

from ..routes import Serving, api_router
from . import messages_api
from .schema_messages import CountTokensRequest, MessagesRequest

router = api_router("/v1")


@router.post("/messages")
async def create_message(req: MessagesRequest, request: Request, serving: Serving):
    return await messages_api.create(serving, req, request)


@router.post("/messages/count_tokens")
async def count_message_tokens(req: CountTokensRequest, serving: Serving):
    return await messages_api.count_tokens(serving, req)
