"""OpenAI's Responses API request (POST /v1/responses), and its translation onto chat completions.

What Codex CLI and the `openai` client's `responses.create` send: `input` (a string, or items:
messages with text parts, `function_call` items an earlier turn made, `function_call_output`
items carrying their results), `instructions` (the system prompt), function `tools` (flat:
name, description, parameters, strict), `tool_choice`, `parallel_tool_calls`,
`max_output_tokens`, `temperature`, `top_p`, `text.format` (plain text, a JSON object or a JSON
schema), `stream`. `to_chat` turns it into the chat request the rest of the server runs.

Refused with a 400 naming the field, never ignored: `previous_response_id` and `store: true`
(responses are not kept: send the whole conversation), `background`, tools other than
functions, non-text input parts, reasoning items and `reasoning` settings (the model does not
reason in a separate channel), `include` of logprobs, `truncation: "auto"`, `top_logprobs`.
Unknown fields are logged and ignored, as on the chat endpoint.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, StrictBool, model_validator
from pydantic_core import PydanticCustomError

from ..schema import OpenAIBaseModel, integer, number
from .schema_chat import ChatCompletionRequest


class InputPart(OpenAIBaseModel):
    type: str
    text: str | None = None


class InputItem(OpenAIBaseModel):
    """One item of `input`: a message (type "message" or no type), a function call an earlier
    turn made, or a function call's output."""

    type: str = "message"
    role: Literal["user", "assistant", "system", "developer"] | None = None
    content: str | list[InputPart] | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | list[InputPart] | None = None


class FunctionTool(OpenAIBaseModel):
    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class TextFormat(OpenAIBaseModel):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None


class TextConfig(OpenAIBaseModel):
    format: TextFormat | None = None


class Reasoning(OpenAIBaseModel):
    effort: str | None = None
    summary: str | None = None


class NamedFunction(OpenAIBaseModel):
    type: Literal["function"]
    name: str


_TEXT_PARTS = ("input_text", "output_text", "text")


class ResponsesRequest(OpenAIBaseModel):
    model: str = Field(min_length=1)
    input: str | list[InputItem]
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | None = None
    parallel_tool_calls: StrictBool | None = None
    max_output_tokens: integer(ge=1, le=10**12) | None = None
    temperature: number(ge=0, le=2) | None = None
    top_p: number(gt=0, le=1) | None = None
    seed: integer() | None = Field(default=None, description="extension (as chat's)")
    stream: StrictBool | None = False
    ignore_eos: StrictBool | None = Field(default=None, description="extension (as chat's): run to the budget")
    text: TextConfig | None = None
    previous_response_id: str | None = None
    store: StrictBool | None = None
    background: StrictBool | None = None
    reasoning: Reasoning | None = None
    include: list[str] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    top_logprobs: integer(ge=0, le=20) | None = None

    @model_validator(mode="after")
    def _refusals(self):
        for param, why in _refused(self):
            raise PydanticCustomError("unsupported_parameter", "'{param}' is not supported by this server: {why}",
                                      {"param": param, "why": why})
        for param, why in _malformed(self.input):
            raise PydanticCustomError("invalid_combination", "'{param}': {why}", {"param": param, "why": why})
        return self

    def to_chat(self) -> dict:
        """The chat completions body this request means."""
        body = {"model": self.model, "messages": self.messages(), "stream": bool(self.stream),
                "max_completion_tokens": self.max_output_tokens, "temperature": self.temperature,
                "top_p": self.top_p, "seed": self.seed, "parallel_tool_calls": self.parallel_tool_calls,
                "ignore_eos": self.ignore_eos}
        if self.stream:
            body["stream_options"] = {"include_usage": True}  # response.completed carries usage
        if self.tools:
            body["tools"] = [{"type": "function", "function": t.model_dump(exclude_none=True, exclude={"type"})}
                             for t in self.tools]
        if self.tool_choice is not None:
            tc = self.tool_choice
            body["tool_choice"] = tc if isinstance(tc, str) else {"type": "function", "function": {"name": tc.name}}
        fmt = self.text.format if self.text else None
        if fmt is not None and fmt.type != "text":
            body["response_format"] = {"type": fmt.type} | ({"json_schema": {
                "name": fmt.name or "output", "schema": fmt.schema_ or {}, "strict": fmt.strict}}
                if fmt.type == "json_schema" else {})
        return {k: v for k, v in body.items() if v is not None}

    def messages(self) -> list[dict]:
        """`instructions` and `input` as chat messages: consecutive function calls join the
        assistant turn before them, outputs become `tool` messages."""
        out = [{"role": "system", "content": self.instructions}] if self.instructions else []
        if isinstance(self.input, str):
            return out + [{"role": "user", "content": self.input}]
        for item in self.input:
            if item.type == "function_call":
                call = {"id": item.call_id, "type": "function",
                        "function": {"name": item.name, "arguments": item.arguments or "{}"}}
                if not (out and out[-1]["role"] == "assistant"):
                    out.append({"role": "assistant", "content": ""})
                out[-1].setdefault("tool_calls", []).append(call)
            elif item.type == "function_call_output":
                out.append({"role": "tool", "tool_call_id": item.call_id, "content": _text(item.output)})
            else:
                out.append({"role": item.role, "content": _text(item.content)})
        return out


def _text(content) -> str:
    if isinstance(content, list):
        return "".join(p.text or "" for p in content)
    return content or ""


# (field, asks for what this server cannot honour, why): refused with a 400, never ignored
_REFUSED = (
    ("previous_response_id", lambda r: r.previous_response_id is not None,
     "responses are not stored; send the whole conversation in 'input'"),
    ("store", lambda r: bool(r.store), "responses are not stored (send 'store': false, or leave it out)"),
    ("background", lambda r: bool(r.background), "background responses are not built"),
    ("reasoning", lambda r: r.reasoning is not None and bool(r.reasoning.effort or r.reasoning.summary),
     "the model has no separate reasoning to configure"),
    ("top_logprobs", lambda r: bool(r.top_logprobs), "logprobs are not built for this endpoint (chat has them)"),
    ("truncation", lambda r: r.truncation == "auto", "dropping input to fit the context is not built"),
)


def _refused(r: ResponsesRequest):
    """(param, why) of every field the request asks for that this server cannot honour."""
    for param, used, why in _REFUSED:
        if used(r):
            yield param, why
    for i, inc in enumerate(r.include or ()):
        if "logprobs" in inc:
            yield f"include[{i}]", "logprobs are not built for this endpoint"
    for i, t in enumerate(r.tools or ()):
        if t.type != "function" or not t.name:
            yield f"tools[{i}]", "only function tools are served ({'type': 'function', 'name': ...})"
    yield from _refused_items(r.input)


def _refused_items(items):
    for i, item in enumerate(items if isinstance(items, list) else ()):
        if item.type not in ("message", "function_call", "function_call_output"):
            yield f"input[{i}]", f"input items of type {item.type!r} are not served (messages and function calls are)"
        for j, part in enumerate(item.content if isinstance(item.content, list) else ()):
            if part.type not in _TEXT_PARTS or part.text is None:
                yield f"input[{i}].content[{j}]", "the model reads text only: send {'type': 'input_text', 'text': ...}"


def _malformed(items):
    for i, item in enumerate(items if isinstance(items, list) else ()):
        if item.type == "message" and item.role is None:
            yield f"input[{i}].role", "a message needs its role"
        elif item.type == "function_call" and not (item.call_id and item.name):
            yield f"input[{i}]", "a function_call item needs its call_id and name"
        elif item.type == "function_call_output" and item.call_id is None:
            yield f"input[{i}].call_id", "a function_call_output item needs its call_id"


class ResponsesChat(ChatCompletionRequest):
    """The chat request a Responses request became: errors name the Responses field."""

    def _max_tokens_field(self) -> str:
        return "max_output_tokens"


def rename(param: str) -> str:
    """A chat field's name -> the Responses field it came from."""
    for chat, ours in (("max_completion_tokens", "max_output_tokens"), ("messages", "input"),
                       (".function.", "."), ("response_format", "text.format")):
        param = param.replace(chat, ours)
    return param
