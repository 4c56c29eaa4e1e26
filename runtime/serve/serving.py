"""The serving layer: a validated request in, a JSON or SSE response out.

`OpenAIServing` does what every deployment shares — the API key, the model check, the chat
template and tokenizing, /v1/models — and hands the prompt's token ids to an engine client,
which runs the request and answers (named for the engine it reaches, so that "backend" keeps
meaning runtime/backends/):
- `LocalClient`: one Pipeline in this process (`specrt serve`; each Ray engine replica);
- ray/deploy.py `RayClient`: engine replicas behind a Ray Serve handle (`--replicas`).
Errors are raised as exceptions and turned into OpenAI's bodies by errors.py, in one place.
"""

from __future__ import annotations

import hmac
import logging
import time
from dataclasses import replace
from typing import Protocol

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from ..errors import InvalidRequest
from ..sampling.grammar import GrammarError
from ..text.toolcalls import ToolError
from .config import ServerConfig
from .errors import APIError, bad
from .llama.infill import completion_prompt, infill_prompt
from .llama.schema_infill import InfillRequest
from .llama.schema_tokenize import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)
from .llama.tokens import detokenize, tokenize
from .metrics import Metrics
from .openai.outputs import CompletionOutput
from .openai.schema_chat import ChatCompletionRequest
from .openai.schema_completion import CompletionRequest
from .openai.tool_chat import chat_prompt, tool_grammar_field, with_tool_grammar
from .schema import GenerationRequest, ModelCard, ModelList, dump
from .shape import ResponseShape
from .streaming import SSE_HEADERS, Job, Reply, Stream

log = logging.getLogger("specrt.serve")


class EngineClient(Protocol):
    """What `OpenAIServing` drives."""

    metrics: Metrics | None  # None until the model is loaded

    def ready(self):
        """-> what the shared steps need of the model: `tokenizer`, `max_seq_len` (a Pipeline
        does). Raises APIError (503) while no request can be taken."""

    async def health(self) -> tuple[int, dict]:
        """(status, body) of GET /health."""

    async def respond(self, req: GenerationRequest, ids: list[int], prompt_param: str, out: ResponseShape,
                      request: Request | None) -> Response:
        """Run the request (prompt token ids `ids`; `prompt_param`: the field a too-long prompt
        is blamed on; `out`: its response shape, shape.py) -> JSON or SSE."""

    def close(self) -> None: ...


class OpenAIServing:
    """The steps every deployment shares, over an engine client."""

    def __init__(self, cfg: ServerConfig, client: EngineClient):
        self.cfg, self.client = cfg, client
        self.created = int(time.time())

    @property
    def metrics(self) -> Metrics | None:
        return self.client.metrics

    def ready(self):
        return self.client.ready()

    async def health(self) -> tuple[int, dict]:
        return await self.client.health()

    def close(self) -> None:
        self.client.close()

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

    async def chat(self, req: ChatCompletionRequest, request: Request, shape=None) -> Response:
        """shape(model, plan, prompt tokens) -> the output of an API translated onto chat
        (translate.py: /v1/responses, /v1/messages); None: chat's own."""
        ids, out = self.render(req, shape)
        return await self.client.respond(req, ids, "messages", out, request)

    def render(self, req: ChatCompletionRequest, shape=None) -> tuple[list[int], ResponseShape]:
        """A chat request -> (prompt ids, response shape). Raises APIError (400)."""
        front = self._served(req.model)
        try:  # tools go through the template (serve/openai/tool_chat.py); the response shape follows them
            return chat_prompt(req, front.tokenizer, shape)
        except ToolError as e:  # tools this bundle's template cannot render, malformed tools
            raise APIError(400, str(e), param=e.param, code=e.code) from None
        except Exception as e:  # noqa: BLE001 - the bundle's chat template refused these messages
            raise bad(f"the chat template cannot render these messages: {str(e)[:300]}", "messages") from None

    async def complete(self, req: CompletionRequest, request: Request) -> Response:
        front = self._served(req.model)
        ids, heal = completion_prompt(front, req, self.cfg.fim_window)  # a FIM prompt when the request has a suffix
        # fim: the server's drafter for editors (ServerConfig.fim_draft); heal: the text the
        # output must begin with (infill.py)
        out = CompletionOutput(req.model, fim=bool(req.suffix), heal=heal)
        return await self.client.respond(req, ids, "prompt", out, request)

    async def infill(self, req: InfillRequest, request: Request) -> Response:
        ids, out = infill_prompt(self._served(self._model(req.model)), req, self.cfg.fim_window)
        return await self.client.respond(req, ids, "input_prefix", out, request)

    def tokenize(self, req: TokenizeRequest) -> TokenizeResponse:
        return tokenize(self._served(self._model(req.model)).tokenizer, req)  # llama.cpp's (serve/llama/tokens.py)

    def detokenize(self, req: DetokenizeRequest) -> DetokenizeResponse:
        return detokenize(self._served(self._model(req.model)).tokenizer, req)

    def _model(self, model: str | None) -> str:
        return self.cfg.model_id if model is None else model  # llama.cpp's endpoints: `model` optional

    def _served(self, model: str):
        if model != self.cfg.model_id:
            raise APIError(404, f"model {model!r} does not exist; this server serves {self.cfg.model_id!r}",
                           "invalid_request_error", "model", "model_not_found")
        return self.ready()


class LocalClient:
    """One pipeline in this process (loaded in a thread: the port opens at once)."""

    def __init__(self, cfg: ServerConfig, load, on_load_error=None):
        """load() -> Pipeline; on_load_error(exception): called if it raises."""
        self.cfg, self._load, self._on_load_error = cfg, load, on_load_error
        self.pipe = None  # Pipeline once loaded
        self.error: str | None = None  # why loading failed
        self.metrics: Metrics | None = None

    def load(self) -> None:
        """Run in a thread at startup; /health says 503 until it returns."""
        try:
            pipe = self._load()
            self.metrics = Metrics(self.cfg.model_id, pipe.counters)
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

    async def health(self) -> tuple[int, dict]:
        if self.pipe is None:
            return 503, {"status": "error" if self.error else "loading", "error": self.error}
        return 200, {"status": "ok"}

    async def respond(self, req, ids: list[int], prompt_param: str, out: ResponseShape,
                      request: Request | None) -> Response:
        reply = self.start(req, ids, prompt_param, out)
        if req.stream:
            return Stream(reply.sse(req.include_usage), reply.cancel, media_type="text/event-stream",
                          headers=SSE_HEADERS)
        return JSONResponse(dump(await reply.collect(request)))

    def start(self, req: GenerationRequest, ids: list[int], prompt_param: str, out: ResponseShape) -> Reply:
        """Submit the request's choices to the engine now. Raises APIError (400: the prompt or
        max_tokens does not fit, an option the runtime refuses, a grammar that cannot compile),
        EngineBusy or EngineClosed (503: errors.py)."""
        pipe = self.pipe
        try:  # choice i samples from its own stream derived from the seed (RequestOptions.stream_seed)
            opts = with_tool_grammar(req.to_options(pipe.room(len(ids)), **self.cfg.server_options(out.fim)), out)
            if out.heal:  # a FIM prompt's healed last token (infill.py)
                opts = replace(opts, text_prefix=out.heal)
            rs = [pipe.request(ids, opts, sibling=i) for i in range(req.n or 1)]
        except GrammarError as e:  # a schema / regex / grammar (or the tools' schemas) the engine cannot compile
            raise bad(str(e), tool_grammar_field(out) or req.grammar_field(), "invalid_grammar") from None
        except ValueError as e:  # InvalidRequest (ContextOverflow, InvalidSampling) names its option
            raise _refused(e, req, prompt_param, len(ids), pipe.max_seq_len) from None
        jobs: list[Job] = []
        try:  # all choices go in together: the later ones wait for the first one's prefill and copy it
            for i, r in enumerate(rs):
                text = out.text_stream(pipe.tokenizer, list(opts.stop))  # /infill's cuts more than stop strings
                jobs.append(Job(pipe.astart(r, opts.stop, text), i))
        except Exception:  # EngineBusy / EngineClosed (503, errors.py): the choices already in stop
            for job in jobs:
                job.cancel()
            raise
        return Reply(jobs, out, len(ids), self.metrics.finished if self.metrics is not None else None)


def _refused(e: ValueError, req: GenerationRequest, prompt_param: str, n_prompt: int, context: int) -> APIError:
    """A runtime refusal (runtime/errors.py InvalidRequest: its `param` names the option) -> a
    400 blaming the request's field; a prompt that leaves no room is the prompt's fault."""
    param = e.param if isinstance(e, InvalidRequest) else None
    if param == "prompt":  # Pipeline.room
        return bad(str(e), prompt_param, "context_length_exceeded")
    return bad(f"{e} (prompt: {n_prompt} tokens, context: {context})", req.field_of(param))
