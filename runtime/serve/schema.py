"""OpenAI's request and response bodies as pydantic models (the `serve` extra only): the types
both endpoints share. Each endpoint's own models are in `schema_chat.py` and
`schema_completion.py`, the fields parsed but refused in `refusals.py` (vLLM's layout:
engine/protocol.py shared, one module per endpoint; named schema here, since `protocol` means a
`typing.Protocol` in specrt: runtime/backends/protocol.py, serve/shape.py).

Models hold data, validation and conversion, nothing else: FastAPI validates a body against
`ChatCompletionRequest` / `CompletionRequest` before a route runs, and `to_options` turns a
checked request into the runtime's `RequestOptions` (runtime/options.py). The serving layer
(serving.py) calls the engine; errors.py turns pydantic's errors into OpenAI's, with `param`
naming the field as the client wrote it.

Unknown fields are ignored (logged at debug level), as OpenAI-compatible servers do.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, model_validator
from pydantic_core import PydanticCustomError

from ..options import RequestOptions
from ..sampling.grammar import Constraint
from .refusals import refuse_unsupported

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



class OpenAIBaseModel(BaseModel):
    """Request models: unknown fields are allowed (OpenAI's API grows; clients send fields of
    other servers) and logged, so a field that is silently dropped can still be found."""

    model_config = ConfigDict(extra="allow")

    @model_validator(mode="after")
    def _log_ignored(self):
        if self.model_extra:
            log.debug("specrt: %s ignores fields %s", type(self).__name__, sorted(self.model_extra))
        return self



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



# ---- requests -------------------------------------------------------------------------------

# structured-output fields, in the order a conflict names them
GRAMMAR_FIELDS = ("response_format", "guided_json", "guided_regex", "guided_grammar", "guided_choice", "grammar",
                  "json_schema")


class GenerationRequest(OpenAIBaseModel):
    """Fields both endpoints share, and their conversion to the runtime's `RequestOptions`."""

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
    # sampling controls (runtime/sampling/logits.py), applied at every verified position
    frequency_penalty: number(ge=-2, le=2) | None = 0.0
    presence_penalty: number(ge=-2, le=2) | None = 0.0
    repetition_penalty: number(gt=0, le=2) | None = Field(default=1.0, description="extension (vLLM)")
    logit_bias: dict[Annotated[str, Field(pattern=r"^\d+$")], number(ge=-100, le=100)] | None = None
    min_tokens: integer(ge=0) | None = Field(default=0, description="extension (vLLM)")
    min_p: number(ge=0, le=1) | None = Field(default=0.0, description="extension (vLLM, llama.cpp)")
    stop_token_ids: list[integer()] | None = Field(default=None, description="extension (vLLM)")
    # structured output (runtime/sampling/grammar.py, llguidance): at most one of these
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
        refuse_unsupported(self)
        return self

    def _requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def default_max_tokens(self, room: int) -> int:
        """The server's default when the request names none; room: tokens left in the context."""
        raise NotImplementedError

    def to_options(self, room: int, **server) -> RequestOptions:
        """The runtime's options for this request: the request's value, else the server's
        default, else the built-in default. room: tokens left in the context after the prompt;
        server: options the server sets, not the client (draft, adaptive, timeout_s). The
        request itself is left as it is. Raises InvalidRequest (runtime/errors.py) for a
        combination the runtime refuses; `field_of` names the field to blame."""
        asked, grammar = self._requested_max_tokens(), self.grammar_field()
        return RequestOptions(
            max_new_tokens=asked if asked is not None else self.default_max_tokens(room),
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=self.top_k or 0,
            seed=self.seed,
            ignore_eos=bool(self.ignore_eos),
            stop=tuple(self.stop or ()),
            frequency_penalty=self.frequency_penalty or 0.0,
            presence_penalty=self.presence_penalty or 0.0,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            logit_bias={int(t): b for t, b in (self.logit_bias or {}).items()},
            min_tokens=self.min_tokens or 0,
            logprobs=self._logprobs(),
            grammar=None if grammar is None else self._constraint(grammar),
            **server,
        )

    def field_of(self, option: str | None) -> str | None:
        """The field of this request a runtime option came from (an InvalidRequest's `param`);
        None for what the server sets (timeout_s, k, draft) or no option."""
        if option == "max_new_tokens":
            return self._max_tokens_field()
        return option if option in type(self).model_fields else None

    def _max_tokens_field(self) -> str:
        return "max_tokens"

    def grammar_field(self) -> str | None:
        """The structured-output field the request uses (OpenAI's response_format; vLLM's
        guided_*; llama.cpp's grammar / json_schema), or None."""
        return next((name for name in GRAMMAR_FIELDS if self._constraint(name) is not None), None)

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


# ---- responses ------------------------------------------------------------------------------

def none(v) -> bool:
    """`exclude_if` of the response fields that are left out of the JSON when None."""
    return v is None


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class UsageInfo(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    # prompt tokens whose KV rows were reused (prefix cache); always sent by specrt serve
    prompt_tokens_details: PromptTokensDetails | None = Field(default=None, exclude_if=none)


FinishReason = Literal["stop", "length", "timeout", "tool_calls"]  # timeout: --request-timeout (not OpenAI's)




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


def dump(model) -> dict:
    """A response as the JSON clients read: null fields kept (`"logprobs": null`), fields
    marked `exclude_if` dropped."""
    return model.model_dump(mode="json")
