"""What the APIs translated onto chat completions share (llama.cpp's and vLLM's shape: one engine
path, one module per wire format): the translated request, and the output base class.

A wire format (schema_responses.py + responses_api.py, schema_messages.py + messages_api.py)
turns its request into a `ChatCompletionRequest` (`to_chat`: the messages, tools, tool_choice and
sampling fields the chat endpoint reads) and hands it to `OpenAIServing.chat` with its own output
class: the same template rendering, tool grammar, engine request, streaming, cancellation and
usage as chat completions, so every guarantee of that path holds. `BlockOutput` is the output
side: the streaming machinery (streaming.py `Reply`) calls `first` / `piece` / `last` / `usage`
/ `whole` as on `ChatOutput`; this class runs each choice's text through `Blocks` and asks the
subclass to render the block events in its format. Chunks are SSE text (named events).
"""

from __future__ import annotations

import json
import time
import uuid

from pydantic import ValidationError

from .blocks import Block, Blocks
from .errors import APIError, openai_error
from .openai.schema_chat import ChatCompletionRequest
from .schema import UsageInfo
from .shape import ResponseShape


def to_chat(cls: type[ChatCompletionRequest], body: dict, rename=lambda p: p) -> ChatCompletionRequest:
    """The chat request a translation built (a `ChatCompletionRequest` subclass that names the
    original API's fields in errors). A value the chat endpoint refuses is a 400 naming the
    field as `rename` maps the chat field's name."""
    try:
        return cls.model_validate(body)
    except ValidationError as e:
        info = openai_error(list(e.errors()))
        raise APIError(400, info.message, param=rename(info.param) if info.param else None, code=info.code) from None


class Body(dict):
    """A whole response built as a dict, dumped as chat's pydantic models are (`schema.dump`)."""

    def model_dump(self, mode: str = "json") -> dict:
        return dict(self)


def sse(name: str, data: dict) -> str:
    """A named SSE event (both the Responses API and Anthropic's name every event by its type)."""
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


class BlockOutput(ResponseShape):
    """Output of a translated API: n = 1 choice as blocks (text runs, tool calls), streamed as
    named SSE events or collected whole. Subclasses render: `_start` (the events before any
    block), `_render(event)` (one block event), `_finish(finish, usage)` (the events after the
    last block), `_body(blocks, finish, usage)` (the whole response)."""

    prefix = "resp_"
    done = ""  # no `data: [DONE]` line: these APIs end with their own last event

    def __init__(self, model: str, plan, n_prompt: int):
        self.id = self.prefix + uuid.uuid4().hex[:24]
        self.model, self.plan, self.n_prompt, self.created = model, plan, n_prompt, int(time.time())
        self.blocks = Blocks(plan if plan is not None and plan.tools is not None else None)
        self.finish = "stop"

    # ---- what streaming.Reply calls ------------------------------------------------------
    def first(self, index: int) -> list[str]:
        return ["".join(self._start())]

    def piece(self, index: int, text: str, lp: list | None = None) -> str:
        return "".join(self._render(e) for e in self.blocks.push(text))

    def last(self, index: int, finish: str) -> str:
        self.finish = finish
        return "".join(self._render(e) for e in self.blocks.flush())

    def usage(self, usage: UsageInfo) -> str:
        return "".join(self._finish(self.finish, usage))

    def whole(self, choices: list[tuple[str, str, list | None, int]], usage: UsageInfo):
        (text, finish, _, _), = choices
        self.finish = finish
        return self._body(self.blocks.whole(text), finish, usage)

    def sse_error(self, e: Exception) -> str:
        return sse("error", {"type": "error", "error": {"type": "api_error", "message": f"generation failed: {e}"}})

    # ---- the format --------------------------------------------------------------------------
    def finish_reason(self, finish: str) -> str:
        """The engine's finish ("stop" | "length" | "timeout") with calls made: "tool_calls"."""
        return "tool_calls" if finish == "stop" and self.blocks.calls else finish

    def _start(self) -> list[str]:
        raise NotImplementedError

    def _render(self, event: tuple) -> str:
        raise NotImplementedError

    def _finish(self, finish: str, usage: UsageInfo) -> list[str]:
        raise NotImplementedError

    def _body(self, blocks: list[Block], finish: str, usage: UsageInfo):
        raise NotImplementedError
