"""OpenAI's routes: /v1/chat/completions, /v1/completions, /v1/responses, /v1/models. Each takes
a checked body (FastAPI validates it against the wire models first) and hands it on."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse

from ..routes import Serving, api_router
from ..schema import ModelList, dump
from . import responses_api
from .schema_chat import ChatCompletionRequest, ChatCompletionResponse
from .schema_completion import CompletionRequest, CompletionResponse
from .schema_responses import ResponsesRequest

router = api_router("/v1")


@router.post("/chat/completions", response_model=ChatCompletionResponse)
async def create_chat_completion(req: ChatCompletionRequest, request: Request, serving: Serving):
    return await serving.chat(req, request)


@router.post("/completions", response_model=CompletionResponse)
async def create_completion(req: CompletionRequest, request: Request, serving: Serving):
    return await serving.complete(req, request)


@router.post("/responses")
async def create_response(req: ResponsesRequest, request: Request, serving: Serving):
    return await responses_api.create(serving, req, request)


@router.get("/models", response_model=ModelList)
async def list_models(serving: Serving):
    return JSONResponse(dump(serving.models()))
