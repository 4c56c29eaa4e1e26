"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API as a translation onto
chat completions.

The request becomes a chat request (schema_messages.py `to_chat`) that `OpenAIServing.chat`
runs like any other; `MessagesOutput` renders the reply as Anthropic's message: `content` blocks
(`text`, and `tool_use` with id, name and the input object), `stop_reason` ("end_turn",
"max_tokens", "tool_use", "stop_sequence" with `stop_sequence` the matched string of
`stop_sequences`; a reply with tool calls says "tool_use" whatever ended it, as chat's finish_reason
says "tool_calls"), `usage` (input, output and cache-read tokens). Streamed, the events
are Anthropic's named ones: `message_start`, `content_block_start`, `content_block_delta`
(`text_delta` as text comes; one `input_json_delta` with a call's whole input, once complete),
`content_block_stop`, `message_delta` (stop_reason, usage), `message_stop`. Errors are
Anthropic's shape, `{"type": "error", "error": {"type", "message"}}` (`error_body`, used by the
app's one exception handler for these paths); the key may come as `x-api-key` or a Bearer token.
"""

from __future__ import annotations

import json

from fastapi import Request
from fastapi.responses import JSONResponse

from ..blocks import Block
from ..errors import APIError
from ..schema import UsageInfo
from ..translate import BlockOutput, Body, sse, to_chat
from .schema_messages import CountTokensRequest, MessagesChat, MessagesRequest, rename

PATH = "/v1/messages"
# the finish of a reply -> Anthropic's stop_reason (a timeout cut the reply short, as max_tokens does)
STOP = {"stop": "end_turn", "length": "max_tokens", "timeout": "max_tokens", "tool_calls": "tool_use"}
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}


def _renamed(e: APIError) -> APIError:
    e.info.param = rename(e.info.param) if e.info.param else None
    return e


async def create(serving, req: MessagesRequest, request: Request):
    chat = to_chat(MessagesChat, req.to_chat(), rename)
    try:
        return await serving.chat(chat, request, MessagesOutput)
    except APIError as e:
        raise _renamed(e) from None


async def count_tokens(serving, req: CountTokensRequest) -> JSONResponse:
    chat = to_chat(MessagesChat, req.to_chat() | {"max_tokens": 1}, rename)
    try:
        ids, _ = serving.render(chat)
    except APIError as e:
        raise _renamed(e) from None
    return JSONResponse({"input_tokens": len(ids)})


def error_body(err: APIError) -> dict:
    """An error as Anthropic's clients read it (the param, when there is one, in the message)."""
    msg = err.info.message
    if err.info.param and err.info.param not in msg:
        msg = f"{err.info.param}: {msg}"
    return {"type": "error", "error": {"type": ERROR_TYPES.get(err.status_code, "api_error"), "message": msg}}


def _usage(u: UsageInfo | None, n_prompt: int) -> dict:
    if u is None:
        return {"input_tokens": n_prompt, "output_tokens": 0}
    cached = u.prompt_tokens_details.cached_tokens if u.prompt_tokens_details else 0
    # Anthropic counts the prompt as uncached input + cache reads (+ cache writes: none here)
    return {"input_tokens": u.prompt_tokens - cached, "output_tokens": u.completion_tokens,
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}


class MessagesOutput(BlockOutput):
    prefix = "msg_"
    stop_sequence: str | None = None  # the stop_sequences entry that ended the reply

    def stopped_by(self, index: int, stop: str) -> None:
        """streaming.Reply: a stop string ended the (one) choice."""
        self.stop_sequence = stop

    def _stop(self, finish: str) -> tuple[str, str | None]:
        """(stop_reason, stop_sequence) of the reply."""
        reason = self.finish_reason(finish)
        if reason == "stop" and self.stop_sequence is not None:
            return "stop_sequence", self.stop_sequence
        return STOP.get(reason, "end_turn"), None

    def _message(self, content: list[dict], stop: tuple[str | None, str | None], usage: dict) -> dict:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
                "stop_reason": stop[0], "stop_sequence": stop[1], "usage": usage}

    def _block(self, b: Block, done: bool) -> dict:
        if b.kind == "call":
            return {"type": "tool_use", "id": "toolu_" + b.call.id.removeprefix("call_"), "name": b.call.name,
                    "input": json.loads(b.call.arguments) if done else {}}
        return {"type": "text", "text": b.text if done else ""}

    def _start(self) -> list[str]:
        msg = self._message([], (None, None), _usage(None, self.n_prompt))
        return [sse("message_start", {"type": "message_start", "message": msg})]

    def _render(self, event: tuple) -> str:
        kind, b = event[0], event[1]
        if kind == "start":
            return sse("content_block_start", {"type": "content_block_start", "index": b.index,
                                               "content_block": self._block(b, False)})
        if kind == "end":
            return sse("content_block_stop", {"type": "content_block_stop", "index": b.index})
        delta = ({"type": "input_json_delta", "partial_json": event[2]} if b.kind == "call"
                 else {"type": "text_delta", "text": event[2]})
        return sse("content_block_delta", {"type": "content_block_delta", "index": b.index, "delta": delta})

    def _finish(self, finish: str, usage: UsageInfo) -> list[str]:
        reason, sequence = self._stop(finish)
        return [sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                                      "usage": _usage(usage, self.n_prompt)}),
                sse("message_stop", {"type": "message_stop"})]

    def _body(self, blocks: list[Block], finish: str, usage: UsageInfo) -> Body:
        return Body(self._message([self._block(b, True) for b in blocks], self._stop(finish), _usage(usage, self.n_prompt)))
