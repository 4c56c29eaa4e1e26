"""What the serving layer asks of a response shape, and the SSE lines every stream is made of.

A response shape builds one response's chunks and body in its API's format: outputs.py
`ChatOutput` / `CompletionOutput`, tool_chat.py `ToolChatOutput`, infill.py `InfillOutput`,
translate.py `BlockOutput` (the Responses API's and Anthropic's). `serving.LocalClient` reads
what the request needs of it (`fim`, `heal`, `plan`, `text_stream`); `streaming.Reply` calls
`first` / `piece` / `last` / `usage` / `whole` and ends a stream with `done` or `sse_error`.
What only some shapes have carries its default here; a shape takes the defaults by naming
`ResponseShape` as its base. Shapes are plain data: the Ray ingress builds one and sends it
to an engine replica.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from .errors import stream_error
from .schema import ErrorResponse, UsageInfo, dump

if TYPE_CHECKING:
    from ..text.textstream import TextStream
    from ..text.toolcalls import ToolPlan

SSE_DONE = "data: [DONE]\n\n"


def sse_event(model) -> str:
    """One response model as an SSE `data:` line (a str: SSE text an output of another wire
    format built, translate.py)."""
    if isinstance(model, str):
        return model
    return f"data: {json.dumps(dump(model), ensure_ascii=False)}\n\n"


def sse_error(e: Exception) -> str:
    """The end of a stream that failed after its status was sent: an error chunk, then [DONE]."""
    return sse_event(ErrorResponse(error=stream_error(e))) + SSE_DONE


@runtime_checkable
class ResponseShape(Protocol):
    id: str  # the response's id (the log names a failed stream by it)
    # optional
    fim: bool = False  # a fill-in-the-middle request: the server's drafter for editors (ServerConfig.fim_draft)
    heal: str = ""  # text the output must begin with (a FIM prompt's healed last token, text/fim.py)
    plan: ToolPlan | None = None  # the request's tools (text/toolcalls.py); their grammar, if any, binds the output
    done: str = SSE_DONE  # a stream's last line ("": an API that ends with an event of its own)

    def first(self, index: int) -> list:
        """Choice `index`'s chunks before its first piece (chat: the role)."""
        ...

    def piece(self, index: int, text: str, lp: list | None = None):
        """A text piece of choice `index` (and the logprobs of its tokens: streaming.Job
        `new_logprobs`) -> a chunk, or None while there is nothing to say yet."""
        ...

    def last(self, index: int, finish: str):
        """Choice `index`'s last chunk; finish: "stop" | "length" | "timeout"."""
        ...

    def usage(self, usage: UsageInfo):
        """The usage chunk (streamed with include_usage; the translated APIs' closing events)."""
        ...

    def whole(self, choices: list[tuple[str, str, list | None, int]], usage: UsageInfo):
        """The whole response: (text, finish, logprobs, new tokens) per choice, in index order."""
        ...

    def sse_error(self, e: Exception) -> str:
        """The end of a stream that failed after its status was sent."""
        return sse_error(e)

    def stopped_by(self, index: int, stop: str) -> None:
        """A stop string ended choice `index` (Anthropic names it; OpenAI's shapes say "stop")."""
        return None

    def text_stream(self, tokenizer, stop: list[str]) -> TextStream | None:
        """A choice's text stream when it ends by more than stop strings (/infill's editor
        stops); None: the pipeline's own."""
        return None
