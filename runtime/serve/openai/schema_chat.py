"""The chat completions endpoint's bodies (POST /v1/chat/completions): messages, the request,
the whole response and the stream's chunks."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, StrictBool, model_validator
from pydantic_core import PydanticCustomError

from ..schema import (
    FinishReason,
    GenerationRequest,
    OpenAIBaseModel,
    UsageInfo,
    integer,
    none,
)

# ---- messages -------------------------------------------------------------------------------

class ImageURL(OpenAIBaseModel):
    url: str
    detail: Literal["auto", "low", "high"] | None = None


class InputAudio(OpenAIBaseModel):
    data: str
    format: Literal["wav", "mp3"]


class ContentPart(OpenAIBaseModel):
    """One part of a message's content. The model reads text only; the other kinds are parsed
    so that `UNSUPPORTED` can name them in its refusal."""

    type: Literal["text", "image_url", "input_audio", "file"]
    text: str | None = None
    image_url: ImageURL | None = None
    input_audio: InputAudio | None = None
    file: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _payload(self):
        if getattr(self, self.type) is None:
            raise PydanticCustomError("missing", "a {kind} part needs its '{kind}' field", {"kind": self.type})
        return self


class ToolCallFunction(OpenAIBaseModel):
    name: str
    arguments: str  # a JSON object as a string (OpenAI's shape; runtime/text/toolcalls.py parses it)


class MessageToolCall(OpenAIBaseModel):
    """A call an earlier assistant turn made (history)."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(OpenAIBaseModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    # tool calls (runtime/text/toolcalls.py): an assistant's calls, a tool result's call id
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    @model_validator(mode="after")
    def _needs_content(self):
        if self.content is None and self.role != "assistant":  # an assistant turn may be empty
            raise PydanticCustomError("missing", "'content' is required (a string or a list of text parts)")
        return self

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)  # text parts only: others are refused
        return self.content or ""



# ---- tools (parsed; refused while the template has no tool calling) ---------------------------

class FunctionDefinition(OpenAIBaseModel):
    name: str = Field(max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class Tool(OpenAIBaseModel):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(OpenAIBaseModel):
    name: str


class NamedToolChoice(OpenAIBaseModel):
    type: Literal["function"]
    function: FunctionName



# ---- the request ----------------------------------------------------------------------------

class ChatCompletionRequest(GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: integer(ge=1, le=10**12) | None = None
    logprobs: StrictBool | None = False
    top_logprobs: integer(ge=0, le=20) | None = None
    # tool calls (serve/openai/tool_chat.py): honoured where the bundle's template renders tools, else a 400
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: StrictBool | None = None  # unset or false: at most one call; true: several
    audio: dict[str, Any] | None = None
    modalities: list[Literal["text", "audio"]] | None = None

    @model_validator(mode="before")
    @classmethod
    def _top_logprobs_need_logprobs(cls, data):
        asked = data.get("top_logprobs") if isinstance(data, dict) else None
        if isinstance(asked, int) and asked > 0 and data.get("logprobs") is not True:
            raise PydanticCustomError("invalid_combination", "'{param}' needs 'logprobs': true",
                                      {"param": "top_logprobs"})
        return data

    @model_validator(mode="after")
    def _tool_choice_fits(self):
        """A forced tool_choice needs tools that include it; tool calls follow their own grammar."""
        tc, names = self.tool_choice, [t.function.name for t in self.tools or ()]
        if tc not in (None, "none", "auto") and not names:
            raise PydanticCustomError("invalid_combination", "'{param}' needs 'tools'", {"param": "tool_choice"})
        if isinstance(tc, NamedToolChoice) and tc.function.name not in names:
            raise PydanticCustomError("invalid_combination", "'{param}': {name!r} is not among the offered tools",
                                      {"param": "tool_choice.function.name", "name": tc.function.name})
        used = self.grammar_field()
        if names and tc != "none" and used:
            raise PydanticCustomError("invalid_combination", "'{param}' cannot be combined with 'tools': tool calls "
                                      "follow a grammar of their own", {"param": used})
        return self

    def _requested_max_tokens(self) -> int | None:
        # max_tokens is deprecated in OpenAI's chat API in favour of max_completion_tokens
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def _max_tokens_field(self) -> str:
        return "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"

    def default_max_tokens(self, room: int) -> int:
        return room  # to the end of the context (vLLM's default)

    def _logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def chat_messages(self) -> list[dict]:
        """{role, content} for the chat template; `developer` is OpenAI's new name for system;
        an assistant's tool_calls and a tool result's tool_call_id as OpenAI sends them."""
        out = []
        for m in self.messages:
            d = {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
            if m.tool_calls:
                d["tool_calls"] = [c.model_dump(exclude_none=True) for c in m.tool_calls]
            if m.tool_call_id is not None:
                d["tool_call_id"] = m.tool_call_id
            out.append(d)
        return out



# ---- responses ------------------------------------------------------------------------------

class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text


class AssistantToolCall(BaseModel):
    """A call the reply makes (runtime/text/toolstream.py `ToolCall` on the wire)."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None  # None: the reply is only tool calls
    tool_calls: list[AssistantToolCall] | None = Field(default=None, exclude_if=none)


class DeltaFunctionCall(BaseModel):
    name: str | None = Field(default=None, exclude_if=none)
    arguments: str | None = None


class DeltaToolCall(BaseModel):
    """A piece of call `index`: its first piece carries id, type and name; later ones pieces of
    the arguments."""

    index: int
    id: str | None = Field(default=None, exclude_if=none)
    type: Literal["function"] | None = Field(default=None, exclude_if=none)
    function: DeltaFunctionCall


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatCompletionTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(BaseModel):
    """Chat: one entry per generated token (the target's raw log-softmax, runtime/sampling/logits.py)."""

    content: list[ChatCompletionTokenLogprob] | None = None



class ChatCompletionChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None = None  # null unless asked; clients expect the key
    finish_reason: FinishReason


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatCompletionChoice]
    usage: UsageInfo


class DeltaMessage(BaseModel):
    """What a chunk adds: the role once, then content pieces; the last chunk's delta is {}."""

    role: Literal["assistant"] | None = Field(default=None, exclude_if=none)
    content: str | None = Field(default=None, exclude_if=none)
    tool_calls: list[DeltaToolCall] | None = Field(default=None, exclude_if=none)


class ChatCompletionStreamChoice(BaseModel):
    index: int = 0
    delta: DeltaMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: FinishReason | None = None


class ChatCompletionStreamResponse(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatCompletionStreamChoice]  # [] in the usage chunk
    usage: UsageInfo | None = Field(default=None, exclude_if=none)  # only in the usage chunk

