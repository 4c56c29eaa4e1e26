"""The two endpoints' response shapes, built from what a choice produced: its text pieces,
finish reason and token logprobs. An output object is one response's id, model and creation
time, and builds its chunks (`first`, `piece`, `last`, `usage`) and its whole body (`whole`);
`streaming.py` decides when each is sent.
"""

from __future__ import annotations

import time
import uuid

from ..schema import UsageInfo
from ..shape import ResponseShape
from .schema_chat import (
    AssistantMessage,
    ChatCompletionChoice,
    ChatCompletionResponse,
    ChatCompletionStreamChoice,
    ChatCompletionStreamResponse,
    ChatCompletionTokenLogprob,
    ChoiceLogprobs,
    DeltaMessage,
    TopLogprob,
)
from .schema_completion import CompletionChoice, CompletionLogprobs, CompletionResponse


def _token(text: str, logprob: float) -> dict:
    return {"token": text, "logprob": logprob, "bytes": list(text.encode())}


class ChatOutput(ResponseShape):
    """Chat's response shapes. Plain data (the Ray ingress sends it to an engine replica): token
    logprobs arrive as text already (`streaming.Job.new_logprobs`)."""

    def __init__(self, model: str):
        self.id, self.model, self.created = "chatcmpl-" + uuid.uuid4().hex[:24], model, int(time.time())

    def first(self, index: int) -> list[ChatCompletionStreamResponse]:
        return [self.chunk(index, DeltaMessage(role="assistant", content=""))]

    def piece(self, index: int, text: str, lp: list | None = None) -> ChatCompletionStreamResponse:
        return self.chunk(index, DeltaMessage(content=text), logprobs=self.logprobs(index, lp))

    def chunk(self, index: int, delta: DeltaMessage, finish: str | None = None,
              logprobs=None) -> ChatCompletionStreamResponse:
        choice = ChatCompletionStreamChoice(index=index, delta=delta, finish_reason=finish, logprobs=logprobs)
        return ChatCompletionStreamResponse(id=self.id, created=self.created, model=self.model, choices=[choice])

    def last(self, index: int, finish: str) -> ChatCompletionStreamResponse:
        return self.chunk(index, DeltaMessage(), finish)

    def usage(self, usage: UsageInfo) -> ChatCompletionStreamResponse:
        return ChatCompletionStreamResponse(id=self.id, created=self.created, model=self.model, choices=[],
                                            usage=usage)

    def logprobs(self, index: int, lp: list | None) -> ChoiceLogprobs | None:
        """(token text, logprob, [(text, logprob)] alternatives) per token -> OpenAI's chat
        logprobs (None: not asked)."""
        if lp is None:
            return None
        return ChoiceLogprobs(content=[
            ChatCompletionTokenLogprob(**_token(text, v), top_logprobs=[TopLogprob(**_token(t, w)) for t, w in top])
            for text, v, top in lp])

    def whole(self, choices: list[tuple[str, str, list | None, int]], usage: UsageInfo) -> ChatCompletionResponse:
        """choices: (text, finish_reason, logprobs, new tokens) per choice, in index order."""
        return ChatCompletionResponse(id=self.id, created=self.created, model=self.model, usage=usage, choices=[
            ChatCompletionChoice(index=i, message=AssistantMessage(content=text), finish_reason=finish,
                                 logprobs=self.logprobs(i, lp))
            for i, (text, finish, lp, _) in enumerate(choices)])


class CompletionOutput(ResponseShape):
    """Completions' response shapes (plain data, as `ChatOutput`)."""

    def __init__(self, model: str, fim: bool = False, heal: str = ""):
        """fim: a fill-in-the-middle completion (a suffix); heal: the text its output must begin
        with (infill.py `completion_prompt`)."""
        self.id, self.model, self.created = "cmpl-" + uuid.uuid4().hex[:24], model, int(time.time())
        self.offsets: dict[int, int] = {}  # per choice: characters its logprobs' text_offset has passed
        self.fim, self.heal = fim, heal

    def first(self, index: int) -> list[CompletionResponse]:
        return []  # completions have no role chunk

    def piece(self, index: int, text: str, lp: list | None = None, finish: str | None = None) -> CompletionResponse:
        choice = CompletionChoice(index=index, text=text, finish_reason=finish, logprobs=self.logprobs(index, lp))
        return CompletionResponse(id=self.id, created=self.created, model=self.model, choices=[choice])

    def last(self, index: int, finish: str) -> CompletionResponse:
        return self.piece(index, "", finish=finish)

    def usage(self, usage: UsageInfo) -> CompletionResponse:
        return CompletionResponse(id=self.id, created=self.created, model=self.model, choices=[], usage=usage)

    def logprobs(self, index: int, lp: list | None) -> CompletionLogprobs | None:
        """TokenLogprob entries -> the legacy parallel lists (text_offset: where each token's
        text starts in the choice's text)."""
        if lp is None:
            return None
        out = CompletionLogprobs()
        for text, v, top in lp:
            out.tokens.append(text)
            out.token_logprobs.append(v)
            out.top_logprobs.append(dict(top))
            out.text_offset.append(self.offsets.get(index, 0))
            self.offsets[index] = self.offsets.get(index, 0) + len(text)
        return out

    def whole(self, choices: list[tuple[str, str, list | None, int]], usage: UsageInfo) -> CompletionResponse:
        return CompletionResponse(id=self.id, created=self.created, model=self.model, usage=usage, choices=[
            CompletionChoice(index=i, text=text, finish_reason=finish, logprobs=self.logprobs(i, lp))
            for i, (text, finish, lp, _) in enumerate(choices)])
