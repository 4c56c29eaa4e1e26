"""OpenAI request and response bodies as pydantic models (the `serve` extra only).

Models hold data, validation and conversion, nothing else: FastAPI validates a body against
`ChatCompletionRequest` / `CompletionRequest` before a route runs, `to_gen_params` turns a
checked request into engine settings, and `openai_error` turns pydantic's errors into OpenAI's
`{"error": {...}}` with `param` naming the field as the client wrote it (`messages[0].content`).
The serving layer (app.py) calls the engine and picks HTTP statuses.

Unknown fields are ignored (logged at debug level), as OpenAI-compatible servers do. Fields the
server understands but cannot honour yet are refused with a 400, never ignored: `UNSUPPORTED`
is the one table to edit as the engine gains each feature (issue 20).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, model_validator
from pydantic_core import PydanticCustomError

from ..grammar import Constraint

log = logging.getLogger("specrt.serve")


# ---- scalar types: JSON numbers and booleans as they are written ----------------------------

def _json_number(v):
    # pydantic's lax mode reads true as 1 and "0.5" as 0.5; a client that sends either has a bug
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise PydanticCustomError("number_type", "must be a number")
    return v


def number(**limits):
    """A JSON number within `limits` (ge, gt, le). NaN and infinities are refused (Python's json
    reads the NaN / Infinity literals); so is an integer too large for a float. The limits sit
    inside the check so the OpenAPI schema shows them as minimum / maximum."""
    return Annotated[float, Field(allow_inf_nan=False, **limits), BeforeValidator(_json_number)]


def integer(**limits):
    """A JSON integer within `limits`; 5.0 is 5, 5.5 is refused."""
    return Annotated[int, Field(**limits), BeforeValidator(_json_number)]


def _as_list(v):
    return [v] if isinstance(v, str) else v


def _one_prompt(v):
    if isinstance(v, list) and len(v) == 1 and isinstance(v[0], str):
        return v[0]
    if not isinstance(v, str):
        raise PydanticCustomError("prompt_type", "must be a string (one prompt per request)")
    return v


class OpenAIBaseModel(BaseModel):
    """Request models: unknown fields are allowed (OpenAI's API grows; clients send fields of
    other servers) and logged, so a field that is silently dropped can still be found."""

    model_config = ConfigDict(extra="allow")

    @model_validator(mode="after")
    def _log_ignored(self):
        if self.model_extra:
            log.debug("specrt: %s ignores fields %s", type(self).__name__, sorted(self.model_extra))
        return self


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
    arguments: str  # a JSON object as a string (OpenAI's shape; runtime/toolcalls.py parses it)


class MessageToolCall(OpenAIBaseModel):
    """A call an earlier assistant turn made (history)."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(OpenAIBaseModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    # tool calls (runtime/toolcalls.py): an assistant's calls, a tool result's call id
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


# ---- request options ------------------------------------------------------------------------

class StreamOptions(OpenAIBaseModel):
    include_usage: StrictBool | None = None


class JsonSchemaFormat(OpenAIBaseModel):
    name: str = Field(max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None


class ResponseFormat(OpenAIBaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self):
        if self.type == "json_schema" and self.json_schema is None:
            raise PydanticCustomError("missing", "type 'json_schema' needs a 'json_schema' object")
        return self


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


# ---- what is parsed but refused -------------------------------------------------------------

@dataclass(frozen=True)
class Unsupported:
    """A field the server parses and checks but cannot honour: `used(value)` says whether the
    request asks for it (True, or the exact param path inside the field); `why` ends the 400."""

    field: str
    used: Callable[[Any], bool | str | None]
    why: str


def _non_text_part(messages: list[ChatMessage]) -> str | None:
    for i, m in enumerate(messages):
        for j, part in enumerate(m.content if isinstance(m.content, list) else []):
            if part.type != "text":
                return f"messages[{i}].content[{j}]"
    return None


_SPEC = "not exact under speculative decoding yet (issue 20)"

# Each entry is lifted (removed) when the engine honours the field; types and ranges stay in
# the models above, so a lifted field is already validated.
UNSUPPORTED: tuple[Unsupported, ...] = (
    Unsupported("best_of", lambda v: v > 1, "server-side ranking of choices is not built (use 'n')"),
    Unsupported("min_p", lambda v: v > 0, "min_p sampling is " + _SPEC),
    Unsupported("stop_token_ids", bool, "stop token ids are not implemented yet; use 'stop' strings"),
    Unsupported("messages", _non_text_part, "the model reads text only: send {'type': 'text', 'text': ...} parts"),
    Unsupported("audio", lambda v: True, "the model writes text only"),
    Unsupported("modalities", lambda v: "audio" in v, "the model writes text only"),
    Unsupported("echo", bool, "echoing the prompt is not implemented"),
    Unsupported("suffix", bool, "the model has no fill-in-the-middle format"),
)


def _unsupported(name: str, why: str) -> PydanticCustomError:
    return PydanticCustomError("unsupported_parameter", "'{param}' is not supported by this server: {why}",
                               {"param": name, "why": why})


# ---- requests -------------------------------------------------------------------------------

@dataclass(frozen=True)
class GenParams:
    """What the engine needs from a request; the keyword names are `Pipeline.request`'s."""

    max_new_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    ignore_eos: bool
    stop: tuple[str, ...]  # for TextStream: stop strings end the text, not the engine
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    min_tokens: int = 0
    logprobs: int | None = None  # alternatives per token (None: no logprobs)
    grammar: Constraint | None = None  # the output must match it (runtime/grammar.py)
    grammar_param: str | None = None  # the field that asked for it (a 400 that cannot compile names it)

    def engine_kwargs(self) -> dict:
        return dict(max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_p=self.top_p,
                    top_k=self.top_k, seed=self.seed, ignore_eos=self.ignore_eos,
                    frequency_penalty=self.frequency_penalty, presence_penalty=self.presence_penalty,
                    repetition_penalty=self.repetition_penalty, logit_bias=dict(self.logit_bias),
                    min_tokens=self.min_tokens, logprobs=self.logprobs, grammar=self.grammar)


# structured-output fields, in the order a conflict names them
GRAMMAR_FIELDS = ("response_format", "guided_json", "guided_regex", "guided_grammar", "guided_choice", "grammar",
                  "json_schema")


class _GenerationRequest(OpenAIBaseModel):
    """Fields both endpoints share."""

    model: str = Field(min_length=1, description="the served model's id: see GET /v1/models")
    max_tokens: integer(ge=1, le=10**12) | None = None
    temperature: number(ge=0, le=2) | None = None
    top_p: number(gt=0, le=1) | None = None
    top_k: integer(ge=0, le=10**9) | None = Field(default=None, description="extension (vLLM, llama.cpp); 0 = off")
    seed: integer() | None = None
    stop: Annotated[list[str] | None, Field(max_length=16),
                    BeforeValidator(_as_list, json_schema_input_type=str | list[str] | None)] = None
    stream: StrictBool | None = False
    stream_options: StreamOptions | None = None
    n: integer(ge=1, le=16) | None = Field(default=1, description="choices of the prompt, decoded together")
    ignore_eos: StrictBool | None = Field(default=False, description="extension (vLLM): run to max_tokens")
    # sampling controls (runtime/logits.py), applied at every verified position
    frequency_penalty: number(ge=-2, le=2) | None = 0.0
    presence_penalty: number(ge=-2, le=2) | None = 0.0
    repetition_penalty: number(gt=0, le=2) | None = Field(default=1.0, description="extension (vLLM)")
    logit_bias: dict[Annotated[str, Field(pattern=r"^\d+$")], number(ge=-100, le=100)] | None = None
    min_tokens: integer(ge=0) | None = Field(default=0, description="extension (vLLM)")
    min_p: number(ge=0, le=1) | None = Field(default=0.0, description="extension (vLLM, llama.cpp)")
    stop_token_ids: list[integer()] | None = Field(default=None, description="extension (vLLM)")
    # structured output (runtime/grammar.py, llguidance): at most one of these
    response_format: ResponseFormat | None = None
    guided_json: str | dict[str, Any] | None = Field(default=None, description="extension (vLLM)")
    guided_regex: str | None = Field(default=None, description="extension (vLLM)")
    guided_grammar: str | None = Field(default=None, description="extension (vLLM)")
    guided_choice: list[str] | None = Field(default=None, description="extension (vLLM)")
    grammar: str | None = Field(default=None, description="extension (llama.cpp)")
    json_schema: dict[str, Any] | None = Field(default=None, description="extension (llama.cpp)")

    @model_validator(mode="before")
    @classmethod
    def _stream_options_need_stream(cls, data):
        if isinstance(data, dict) and data.get("stream_options") is not None and data.get("stream") is not True:
            raise PydanticCustomError("invalid_combination", "'{param}' is only allowed with 'stream': true",
                                      {"param": "stream_options"})
        return data

    @model_validator(mode="after")
    def _refuse_unsupported(self):
        declared = type(self).model_fields
        for u in UNSUPPORTED:
            value = getattr(self, u.field) if u.field in declared else None
            hit = value is not None and u.used(value)
            if hit:
                raise _unsupported(hit if isinstance(hit, str) else u.field, u.why)
        return self

    def _requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def default_max_tokens(self, room: int) -> int:
        """The server's default when the request names none; room: tokens left in the context."""
        raise NotImplementedError

    def to_gen_params(self, room: int) -> GenParams:
        """Request value, else the server's default, else the built-in default; the request
        itself is left as it is."""
        asked = self._requested_max_tokens()
        return GenParams(
            max_new_tokens=asked if asked is not None else self.default_max_tokens(room),
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=self.top_k or 0,
            seed=self.seed,
            ignore_eos=bool(self.ignore_eos),
            stop=tuple(s for s in self.stop or () if s),
            frequency_penalty=self.frequency_penalty or 0.0,
            presence_penalty=self.presence_penalty or 0.0,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            logit_bias=tuple((int(t), b) for t, b in (self.logit_bias or {}).items()),
            min_tokens=self.min_tokens or 0,
            logprobs=self._logprobs(),
            **self._grammar(),
        )

    def _grammar(self) -> dict:
        """The structured-output field the request uses, as a Constraint (OpenAI's
        response_format; vLLM's guided_*; llama.cpp's grammar / json_schema)."""
        for name in GRAMMAR_FIELDS:
            c = self._constraint(name)
            if c is not None:
                return {"grammar": c, "grammar_param": name}
        return {}

    def _constraint(self, name: str) -> Constraint | None:
        v = getattr(self, name)
        if v is None:
            return None
        if name == "response_format":
            if v.type == "json_object":
                return Constraint.json_object()
            if v.type == "json_schema":
                return Constraint.json_schema(v.json_schema.schema_ if v.json_schema.schema_ is not None else {})
            return None  # text
        if name in ("guided_json", "json_schema"):
            return Constraint.json_schema(v)
        if name == "guided_regex":
            return Constraint.regex(v)
        if name == "guided_choice":
            return Constraint.choice(v)
        return Constraint.gbnf(v)  # guided_grammar, grammar: GBNF or Lark

    @model_validator(mode="after")
    def _one_grammar(self):
        used = [name for name in GRAMMAR_FIELDS if self._constraint(name) is not None]
        if len(used) > 1:
            raise PydanticCustomError("invalid_combination", "'{param}' cannot be combined with {other}: the output "
                                      "follows one grammar", {"param": used[1], "other": f"'{used[0]}'"})
        return self

    def _logprobs(self) -> int | None:
        raise NotImplementedError

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(_GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: integer(ge=1, le=10**12) | None = None
    logprobs: StrictBool | None = False
    top_logprobs: integer(ge=0, le=20) | None = None
    # tool calls (serve/tools.py): honoured where the bundle's template renders tools, else a 400
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: StrictBool | None = None  # false: at most one call
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
        used = next((n for n in GRAMMAR_FIELDS if self._constraint(n) is not None), None)
        if names and tc != "none" and used:
            raise PydanticCustomError("invalid_combination", "'{param}' cannot be combined with 'tools': tool calls "
                                      "follow a grammar of their own", {"param": used})
        return self

    def _requested_max_tokens(self) -> int | None:
        # max_tokens is deprecated in OpenAI's chat API in favour of max_completion_tokens
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

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


class CompletionRequest(_GenerationRequest):
    prompt: Annotated[str, Field(min_length=1), BeforeValidator(_one_prompt, json_schema_input_type=str | list[str])]
    logprobs: integer(ge=0, le=5) | None = None
    echo: StrictBool | None = False
    best_of: integer(ge=1, le=20) | None = None
    suffix: str | None = None

    def default_max_tokens(self, room: int) -> int:
        return 16  # OpenAI's and vLLM's default for completions

    def _logprobs(self) -> int | None:
        return self.logprobs


# ---- responses ------------------------------------------------------------------------------

def _none(v) -> bool:
    return v is None


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class UsageInfo(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    # prompt tokens whose KV rows were reused (prefix cache); always sent by specrt serve
    prompt_tokens_details: PromptTokensDetails | None = Field(default=None, exclude_if=_none)


FinishReason = Literal["stop", "length", "timeout", "tool_calls"]  # timeout: --request-timeout (not OpenAI's)


class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None  # None: the reply is only tool calls
    tool_calls: list[ToolCall] | None = Field(default=None, exclude_if=_none)


class DeltaFunctionCall(BaseModel):
    name: str | None = Field(default=None, exclude_if=_none)
    arguments: str | None = None


class DeltaToolCall(BaseModel):
    """A piece of call `index`: its first piece carries id, type and name; later ones pieces of
    the arguments."""

    index: int
    id: str | None = Field(default=None, exclude_if=_none)
    type: Literal["function"] | None = Field(default=None, exclude_if=_none)
    function: DeltaFunctionCall


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatCompletionTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(BaseModel):
    """Chat: one entry per generated token (the target's raw log-softmax, runtime/logits.py)."""

    content: list[ChatCompletionTokenLogprob] | None = None


class CompletionLogprobs(BaseModel):
    """Completions' legacy shape: parallel lists per generated token."""

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float] = Field(default_factory=list)
    top_logprobs: list[dict[str, float]] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


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

    role: Literal["assistant"] | None = Field(default=None, exclude_if=_none)
    content: str | None = Field(default=None, exclude_if=_none)
    tool_calls: list[DeltaToolCall] | None = Field(default=None, exclude_if=_none)


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
    usage: UsageInfo | None = Field(default=None, exclude_if=_none)  # only in the usage chunk


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: FinishReason | None = None  # None in a stream's content chunks


class CompletionResponse(BaseModel):
    """A whole completion, or (usage None) one streamed chunk: OpenAI uses one shape for both."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = Field(default=None, exclude_if=_none)


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "specrt"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo


# ---- pydantic's errors as OpenAI's ----------------------------------------------------------

# pydantic names each member of a union in an error's location ("str", "list[...]",
# "literal['none','auto']", a model's class name) and a dict key's own error "[key]"; clients
# wrote only field names, keys and indexes
_KINDS = {"str": "a string", "int": "an integer", "float": "a number", "bool": "a boolean"}
_OWN_CODES = {"unsupported_parameter"}  # our codes, passed on as the error's `code`


def _is_member(part) -> bool:
    return isinstance(part, str) and (part in _KINDS or "[" in part or part[:1].isupper())


def _kind(member: str) -> str:
    if member.startswith("literal["):
        return member[len("literal["):-1]
    return _KINDS.get(member) or ("a list" if member.startswith("list[") else "an object")


def _param(loc) -> str | None:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not _is_member(part):
            out += f".{part}" if out else part
    return out or None


def _got(value) -> str:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return f" (got {json.dumps(value)[:40]})"
    return ""  # objects and lists: the param says where


def openai_error(errors: list[dict]) -> ErrorInfo:
    """pydantic's (or FastAPI's) validation errors -> one OpenAI error. The deepest error is the
    one a client can act on: a union reports one error per member, the member that matched
    furthest has the longest location."""
    e = max(errors, key=lambda e: len(e.get("loc", ())))
    loc = tuple(e.get("loc", ()))
    if loc[:1] == ("body",):  # FastAPI's prefix for the request body
        loc = loc[1:]
    ctx = e.get("ctx") or {}
    param = ctx.get("param") or _param(loc)
    if e["type"] in _OWN_CODES or e["type"] == "invalid_combination":
        return ErrorInfo(message=e["msg"], type="invalid_request_error", param=param,
                         code=e["type"] if e["type"] in _OWN_CODES else None)
    if param is None:
        return ErrorInfo(message="the request body must be a JSON object (Content-Type: application/json) "
                                 "with the endpoint's fields", type="invalid_request_error")
    msg = e["msg"]
    members = [p for p in loc if _is_member(p)]
    if members and loc[-1] == members[-1] and len(errors) > 1:  # no member of a union matched at all
        kinds = dict.fromkeys(_kind(p) for x in errors for p in x["loc"][-1:] if _is_member(p))
        msg = "must be " + " or ".join(kinds)
    if e["type"] == "missing" and not ctx:
        msg = "is required" if msg == "Field required" else msg
    return ErrorInfo(message=f"'{param}': {msg}{_got(e.get('input')) if e['type'] != 'missing' else ''}",
                     type="invalid_request_error", param=param)
