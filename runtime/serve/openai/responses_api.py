"""POST /v1/responses: OpenAI's Responses API as a translation onto chat completions.

The request becomes a chat request (schema_responses.py `to_chat`) that `OpenAIServing.chat`
runs like any other; `ResponsesOutput` renders the reply: `output` items (a `message` with
`output_text` for each run of text, a `function_call` for each call: `call_id`, `name`,
`arguments`), `status` "completed", or "incomplete" with `incomplete_details.reason`
"max_output_tokens" when the budget ended it, and `usage` (input / output / cached tokens).
Streamed, the events are the Responses API's: `response.created`, `response.in_progress`,
`response.output_item.added`, `response.content_part.added`, `response.output_text.delta`
(text as it comes), `response.output_text.done`, `response.content_part.done`,
`response.function_call_arguments.delta` / `.done` (a call's arguments whole, once complete),
`response.output_item.done`, then `response.completed` or `response.incomplete`; each carries a
`sequence_number`. Errors are OpenAI's shape, as on every other endpoint.
"""

from __future__ import annotations

import uuid

from fastapi import Request

from ..blocks import Block
from ..errors import APIError
from ..schema import UsageInfo
from ..translate import BlockOutput, Body, sse, to_chat
from .schema_responses import ResponsesChat, ResponsesRequest, rename


async def create(serving, req: ResponsesRequest, request: Request):
    chat = to_chat(ResponsesChat, req.to_chat(), rename)
    echo = {"instructions": req.instructions, "tools": [t.model_dump(exclude_none=True) for t in req.tools or ()],
            "tool_choice": req.tool_choice if isinstance(req.tool_choice, str) or req.tool_choice is None
            else req.tool_choice.model_dump(), "parallel_tool_calls": req.parallel_tool_calls is True,
            "temperature": req.temperature, "top_p": req.top_p, "max_output_tokens": req.max_output_tokens}
    try:
        return await serving.chat(chat, request, lambda model, plan, n: ResponsesOutput(model, plan, n, echo))
    except APIError as e:
        e.info.param = rename(e.info.param) if e.info.param else None
        raise


def _usage(u: UsageInfo | None) -> dict | None:
    if u is None:
        return None
    cached = u.prompt_tokens_details.cached_tokens if u.prompt_tokens_details else 0
    return {"input_tokens": u.prompt_tokens, "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": u.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": u.total_tokens}


class ResponsesOutput(BlockOutput):
    prefix = "resp_"

    def __init__(self, model: str, plan, n_prompt: int, echo: dict):
        super().__init__(model, plan, n_prompt)
        self.echo = echo  # the request's settings, as OpenAI echoes them in the response
        self.seq = 0
        self.item_ids: dict[int, str] = {}  # block index -> its output item's id

    # ---- items ------------------------------------------------------------------------------
    def _item_id(self, b: Block) -> str:
        if b.index not in self.item_ids:
            self.item_ids[b.index] = ("msg_" if b.kind == "text" else "fc_") + uuid.uuid4().hex[:24]
        return self.item_ids[b.index]

    def _item(self, b: Block, done: bool) -> dict:
        status = "completed" if done else "in_progress"
        if b.kind == "call":
            return {"type": "function_call", "id": self._item_id(b), "call_id": b.call.id, "name": b.call.name,
                    "arguments": b.call.arguments if done else "", "status": status}
        return {"type": "message", "id": self._item_id(b), "status": status, "role": "assistant",
                "content": [_part(b.text)] if done else []}

    def _response(self, status: str, items: list[dict], usage: UsageInfo | None = None, finish: str = "stop") -> dict:
        incomplete = {"reason": "max_output_tokens" if finish == "length" else finish} if status == "incomplete" else None
        return {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                "model": self.model, "output": items, "incomplete_details": incomplete, "error": None,
                "previous_response_id": None, "store": False, "text": {"format": {"type": "text"}},
                "truncation": "disabled", "metadata": {}, "usage": _usage(usage), **self.echo}

    # ---- events -----------------------------------------------------------------------------
    def _event(self, kind: str, **data) -> str:
        self.seq += 1
        return sse(kind, {"type": kind, "sequence_number": self.seq - 1, **data})

    def _start(self) -> list[str]:
        r = self._response("in_progress", [])
        return [self._event("response.created", response=r), self._event("response.in_progress", response=r)]

    def _render(self, event: tuple) -> str:
        kind, b = event[0], event[1]
        at = {"output_index": b.index, "item_id": self._item_id(b)}
        if kind == "start":
            added = self._event("response.output_item.added", output_index=b.index, item=self._item(b, False))
            if b.kind == "call":
                return added
            return added + self._event("response.content_part.added", **at, content_index=0, part=_part(""))
        if kind == "delta":
            if b.kind == "call":
                return self._event("response.function_call_arguments.delta", **at, delta=event[2])
            return self._event("response.output_text.delta", **at, content_index=0, delta=event[2], logprobs=[])
        if b.kind == "call":
            head = self._event("response.function_call_arguments.done", **at, name=b.call.name,
                               arguments=b.call.arguments)
        else:
            head = (self._event("response.output_text.done", **at, content_index=0, text=b.text, logprobs=[])
                    + self._event("response.content_part.done", **at, content_index=0, part=_part(b.text)))
        return head + self._event("response.output_item.done", output_index=b.index, item=self._item(b, True))

    def _finish(self, finish: str, usage: UsageInfo) -> list[str]:
        status = "completed" if finish == "stop" else "incomplete"
        body = self._response(status, [self._item(b, True) for b in self.blocks.blocks], usage, finish)
        return [self._event(f"response.{status}", response=body)]

    def _body(self, blocks: list[Block], finish: str, usage: UsageInfo) -> Body:
        status = "completed" if finish == "stop" else "incomplete"
        return Body(self._response(status, [self._item(b, True) for b in blocks], usage, finish))


def _part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
