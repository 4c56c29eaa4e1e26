"""llama.cpp's routes: /infill (fill in the middle: infill.py), /tokenize, /detokenize."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse

from ..routes import Serving, api_router
from ..schema import dump
from .schema_infill import InfillRequest, InfillResponse
from .schema_tokenize import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)

router = api_router()


@router.post("/infill", response_model=InfillResponse)
async def create_infill(req: InfillRequest, request: Request, serving: Serving):
    return await serving.infill(req, request)


@router.post("/tokenize", response_model=TokenizeResponse)
async def tokenize(req: TokenizeRequest, serving: Serving):
    return JSONResponse(dump(serving.tokenize(req)))


@router.post("/detokenize", response_model=DetokenizeResponse)
async def detokenize(req: DetokenizeRequest, serving: Serving):
    return JSONResponse(dump(serving.detokenize(req)))
