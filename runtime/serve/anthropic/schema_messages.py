"""Anthropic's Messages API requests (POST /v1/messages, /v1/messages/count_tokens), and their
translation onto chat completions.

What Claude Code and the `anthropic` client send: `system` (a string or text blocks),
`messages` whose content is a string or blocks — `text`, `tool_use` (a call an assistant turn
made: id, name, input object), `tool_result` (its result: tool_use_id, content string or text
blocks, is_error) — `tools` (name, description, input_schema), `tool_choice` (auto | any | tool
| none, `disable_parallel_tool_use`), `max_tokens` (required), `stop_sequences`, `temperature`
(0-1), `top_p`, `top_k` (older clients; the current SDK no longer sends them), `stream`,
`output_config.format` (a JSON schema the output follows). `cache_control` marks are accepted: the prefix cache reuses
every shared prefix by itself. `to_chat` turns a request into the chat request the rest of the
server runs.

Refused with a 400 naming the field, never ignored: non-text content (images, documents),
`thinking` enabled and thinking blocks (the model does not think in a separate channel),
`output_config.effort` (one effort level), tools
other than client tools (Anthropic's server tools: bash, web search, ...).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field, StrictBool, model_validator
from pydantic_core import PydanticCustomError

from ..openai.schema_chat import ChatCompletionRequest
from ..schema import OpenAIBaseModel, integer, number


class ContentBlock(OpenAIBaseModel):
    type: str
    text: str | None = None
    id: str | None = None  # tool_use
    name: str | None = None
    input: dict[str, Any] | None = None
    tool_use_id: str | None = None  # tool_result
    content: str | list[ContentBlock] | None = None
    is_error: StrictBool | None = None


class Message(OpenAIBaseModel):
    role: Literal["user", "assistant"]
    content: str | list[ContentBlock]


class AnthropicTool(OpenAIBaseModel):
    name: str = Field(max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None  # "custom" (or none): a client tool; others are Anthropic's server tools


class ToolChoice(OpenAIBaseModel):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: StrictBool | None = None


class Thinking(OpenAIBaseModel):
    type: Literal["enabled", "disabled", "adaptive"]


class OutputFormat(OpenAIBaseModel):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(OpenAIBaseModel):
    effort: str | None = None
    format: OutputFormat | None = None


_CHOICE = {"auto": "auto", "any": "required", "none": "none"}


class CountTokensRequest(OpenAIBaseModel):
    """POST /v1/messages/count_tokens: what the prompt of these messages and tools costs."""

    model: str = Field(min_length=1)
    messages: list[Message] = Field(min_length=1)
    system: str | list[ContentBlock] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None

    @model_validator(mode="after")
    def _refusals(self):
        for param, why in _refused(self):
            raise PydanticCustomError("unsupported_parameter", "'{param}' is not supported by this server: {why}",
                                      {"param": param, "why": why})
        if self.tool_choice is not None and self.tool_choice.type == "tool" and not self.tool_choice.name:
            raise PydanticCustomError("invalid_combination", "'{param}': a tool choice of type 'tool' needs its name",
                                      {"param": "tool_choice.name"})
        return self

    def to_chat(self) -> dict:
        """The chat completions body this request means."""
        body: dict = {"model": self.model, "messages": self.chat_messages()}
        if self.tools:
            body["tools"] = [{"type": "function", "function": {
                "name": t.name, "parameters": t.input_schema or {"type": "object"},
                **({"description": t.description} if t.description is not None else {})}} for t in self.tools]
        tc = self.tool_choice
        if tc is not None:
            body["tool_choice"] = _CHOICE.get(tc.type) or {"type": "function", "function": {"name": tc.name}}
            if tc.disable_parallel_tool_use is False:
                body["parallel_tool_calls"] = True  # several calls only when asked (docs/design.md "Tool calls")
        return body

    def chat_messages(self) -> list[dict]:
        out = [{"role": "system", "content": _text(self.system)}] if self.system else []
        for m in self.messages:
            out += _message(m)
        return out


class MessagesRequest(CountTokensRequest):
    max_tokens: integer(ge=1, le=10**12)
    stop_sequences: list[str] | None = Field(default=None, max_length=16)
    temperature: number(ge=0, le=1) | None = None
    top_p: number(gt=0, le=1) | None = None
    top_k: integer(ge=0, le=10**9) | None = None
    seed: integer() | None = Field(default=None, description="extension (as chat's)")
    stream: StrictBool | None = False
    ignore_eos: StrictBool | None = Field(default=None, description="extension (as chat's): run to max_tokens")
    output_config: OutputConfig | None = None  # its format: a JSON schema the output follows

    @model_validator(mode="after")
    def _no_effort(self):
        if self.output_config is not None and self.output_config.effort is not None:
            raise PydanticCustomError("unsupported_parameter", "'{param}' is not supported by this server: the model "
                                      "has one effort level", {"param": "output_config.effort"})
        return self

    def to_chat(self) -> dict:
        fmt = self.output_config.format if self.output_config is not None else None
        if fmt is not None:
            body = {"response_format": {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt.schema_}}}
        else:
            body = {}
        body |= super().to_chat() | {"max_tokens": self.max_tokens, "stop": self.stop_sequences,
                                    "temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                                    "seed": self.seed, "stream": bool(self.stream),
                                    "ignore_eos": self.ignore_eos}
        if self.stream:
            body["stream_options"] = {"include_usage": True}  # message_delta carries the usage
        return {k: v for k, v in body.items() if v is not None}


def _text(content) -> str:
    if isinstance(content, list):
        return "".join(b.text or "" for b in content if b.type == "text")
    return content or ""


def _message(m: Message) -> list[dict]:
    """One Anthropic message -> chat messages: an assistant's text and tool_use blocks one
    assistant turn with tool_calls; a user's tool_result blocks `tool` messages, its text a
    user turn (in the order they come)."""
    if isinstance(m.content, str):
        return [{"role": m.role, "content": m.content}]
    if m.role == "assistant":
        calls = [{"id": b.id, "type": "function", "function": {"name": b.name, "arguments": json.dumps(b.input or {})}}
                 for b in m.content if b.type == "tool_use"]
        return [{"role": "assistant", "content": _text(m.content), **({"tool_calls": calls} if calls else {})}]
    out: list[dict] = []
    for b in m.content:
        if b.type == "tool_result":
            text = _text(b.content)
            out.append({"role": "tool", "tool_call_id": b.tool_use_id,
                        "content": f"Error: {text}" if b.is_error else text})
        elif out and out[-1]["role"] == "user":
            out[-1]["content"] += b.text or ""
        else:
            out.append({"role": "user", "content": b.text or ""})
    return out


_BLOCKS = {"user": ("text", "tool_result"), "assistant": ("text", "tool_use")}


def _refused(r: CountTokensRequest):
    """(param, why) of what the request asks for that this server cannot honour."""
    if r.thinking is not None and r.thinking.type != "disabled":
        yield "thinking", "the model does not think in a separate channel"
    for i, t in enumerate(r.tools or ()):
        if t.type not in (None, "custom"):
            yield f"tools[{i}]", f"server tools ({t.type!r}) are not served: client tools with an input_schema are"
    for i, m in enumerate(r.messages):
        for j, b in enumerate(m.content if isinstance(m.content, list) else ()):
            if b.type not in _BLOCKS[m.role]:
                yield f"messages[{i}].content[{j}]", f"{b.type!r} blocks are not served in {m.role} turns " \
                      "(the model reads text, tool_use and tool_result blocks)"


class MessagesChat(ChatCompletionRequest):
    """The chat request a Messages request became (max_tokens keeps its name). Anthropic's
    `max_tokens` is a required bound that clients set far above a small model's context (Claude
    Code sends 32000): a reply runs at most to the end of the context, where it ends with
    stop_reason "max_tokens", rather than the request being refused."""

    def to_options(self, room: int, **server):
        if self.max_tokens is not None and self.max_tokens > room:  # the bound, at the context's end
            return self.model_copy(update={"max_tokens": room}).to_options(room, **server)
        return super().to_options(room, **server)


def rename(param: str) -> str:
    """A chat field's name -> the Messages field it came from."""
    if param == "stop":
        return "stop_sequences"
    for chat, ours in ((".function.parameters", ".input_schema"), (".function.", "."),
                       ("response_format", "output_config.format")):
        param = param.replace(chat, ours)
    return param
