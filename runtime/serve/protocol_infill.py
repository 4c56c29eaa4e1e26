"""llama.cpp's `/infill` bodies (fill-in-the-middle for editors: llama.vscode, llama.vim).

Honoured, as llama.cpp defines them: `input_prefix`, `input_suffix`, `input_extra`
([{filename, text}], laid out before the prefix), `prompt` (the text typed on the cursor's line:
appended to the prefix), `n_predict` (-1: to the end of the context; 0: a warm-up that only reads
the prompt into the cache), `temperature` / `top_k` / `top_p` (llama.cpp's defaults 0.8 / 40 /
0.95), `seed` (-1: random), `stop`, `stream`, `cache_prompt` (the prefix cache is always on and
never changes output, so either value is honoured), `n_indent`, `t_max_predict_ms`,
`ignore_eos`, `response_fields`, `samplers` when it names only top_k, top_p and
temperature, and `model` (optional). Also the OpenAI fields this server shares across endpoints
(`max_tokens`, grammars, `min_tokens`, `repetition_penalty`, `logit_bias` as OpenAI's object).
llama.cpp options that change the output and are not built are refused with a 400 naming them
(`REFUSED_LLAMA`) rather than ignored; other unknown fields are ignored, as on every endpoint.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, Field, StrictBool, model_validator
from pydantic_core import PydanticCustomError

from ..text.fim import ExtraFile
from .protocol import GenerationRequest, OpenAIBaseModel, integer, none, number

SAMPLERS = ("top_k", "top_p", "temperature")  # the llama.cpp samplers this server applies


def _num(v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError
    return v


# llama.cpp /completion options the engine does not apply: refused unless neutral (name ->
# whether the value asks for the option); a value of the wrong type counts as asking
REFUSED_LLAMA: dict[str, Any] = {
    "samplers": lambda v: not isinstance(v, list) or any(s not in SAMPLERS for s in v),
    "t_max_prompt_ms": lambda v: _num(v) > 0,
    "n_probs": lambda v: _num(v) > 0,
    "return_tokens": bool,
    "typical_p": lambda v: _num(v) != 1,
    "mirostat": lambda v: _num(v) != 0,
    "dry_multiplier": lambda v: _num(v) > 0,
    "xtc_probability": lambda v: _num(v) > 0,
    "top_n_sigma": lambda v: _num(v) > 0,
    "dynatemp_range": lambda v: _num(v) > 0,
    "repeat_penalty": lambda v: _num(v) != 1,
    "presence_penalty": lambda v: _num(v) != 0,  # llama.cpp's count only the last n tokens
    "frequency_penalty": lambda v: _num(v) != 0,
    "n_keep": lambda v: _num(v) != 0,
    "id_slot": lambda v: _num(v) != -1,
    "lora": bool,
    "n_cmpl": lambda v: _num(v) > 1,
    "post_sampling_probs": bool,
    "multimodal_data": bool,
    "image_data": bool,
}


def _seed(v):
    return None if v == -1 else v  # llama.cpp: -1 = a random seed


class InputExtra(OpenAIBaseModel):
    """An extra file (context from elsewhere in the project)."""

    text: str
    filename: str = "tmp"


class InfillRequest(GenerationRequest):
    model: str | None = Field(default=None, description="optional; if given, the served model's id")
    input_prefix: str = ""
    input_suffix: str = ""
    input_extra: list[InputExtra] = Field(default_factory=list, max_length=256)
    prompt: str = Field(default="", description="the cursor's line so far: appended to input_prefix")
    n_predict: integer(ge=-1, le=10**12) | None = Field(default=None, description="-1: to the context's end; "
                                                         "0: read the prompt into the cache only")
    temperature: number(ge=0, le=2) | None = 0.8
    top_k: integer(ge=0, le=10**9) | None = 40
    top_p: number(gt=0, le=1) | None = 0.95
    seed: Annotated[integer() | None, BeforeValidator(_seed)] = None
    cache_prompt: StrictBool = True
    n_indent: integer(ge=0, le=10**6) = 0
    t_max_predict_ms: integer(ge=-1) = -1
    response_fields: list[str] | None = None
    samplers: list[str] | None = None

    @model_validator(mode="after")
    def _refuse_llama_options(self):
        declared = {name: getattr(self, name) for name in REFUSED_LLAMA if name in type(self).model_fields}
        given = {**(self.model_extra or {}), **declared}
        for name, asks in REFUSED_LLAMA.items():
            if given.get(name) is not None and _asks(asks, given[name]):
                raise PydanticCustomError("unsupported_parameter", "'{param}' is not supported by this server: "
                                          "{why}", {"param": name, "why": _why(name)})
        if (self.n or 1) > 1:
            raise PydanticCustomError("unsupported_parameter", "'{param}' is not supported by /infill: one "
                                      "completion per request", {"param": "n"})
        return self

    @property
    def warmup(self) -> bool:
        return self.n_predict == 0

    @property
    def prefix(self) -> str:
        return self.input_prefix + self.prompt

    @property
    def extra(self) -> tuple[ExtraFile, ...]:
        return tuple(ExtraFile(x.filename, x.text) for x in self.input_extra)

    def _requested_max_tokens(self) -> int | None:
        if self.n_predict is not None:
            return None if self.n_predict < 0 else max(1, self.n_predict)  # 0: one token, not returned
        return self.max_tokens

    def _max_tokens_field(self) -> str:
        return "n_predict" if self.n_predict is not None else "max_tokens"

    def default_max_tokens(self, room: int) -> int:
        return room  # llama.cpp's n_predict -1: until the context is full

    def _logprobs(self) -> int | None:
        return None

    @property
    def t_max_s(self) -> float | None:
        return self.t_max_predict_ms / 1000 if self.t_max_predict_ms > 0 else None


def _asks(asks, value) -> bool:
    try:
        return bool(asks(value))
    except (TypeError, ValueError):
        return True


def _why(name: str) -> str:
    if name == "samplers":
        return f"only {', '.join(SAMPLERS)} are applied (llama.cpp's 'infill' sampler and others are not built)"
    return "this llama.cpp option is not built"


# ---- responses ------------------------------------------------------------------------------

class InfillTimings(BaseModel):
    prompt_n: int = 0  # prompt tokens computed (not taken from the cache)
    predicted_n: int = 0
    predicted_ms: float = 0.0  # the request's time from arrival to its last token, prompt included


class InfillResponse(BaseModel):
    """A whole /infill answer, or one streamed chunk (`stop` false; counts only on the last)."""

    index: int = 0
    content: str
    stop: bool
    model: str | None = Field(default=None, exclude_if=none)
    tokens_predicted: int | None = Field(default=None, exclude_if=none)
    tokens_evaluated: int | None = Field(default=None, exclude_if=none)
    tokens_cached: int | None = Field(default=None, exclude_if=none)
    truncated: bool | None = Field(default=None, exclude_if=none)
    stop_type: str | None = Field(default=None, exclude_if=none)  # "eos" (EOS, a stop string, an editor stop) | "limit"
    timings: InfillTimings | None = Field(default=None, exclude_if=none)
