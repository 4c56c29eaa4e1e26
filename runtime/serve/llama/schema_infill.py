"""llama.cpp's `/infill` bodies (fill-in-the-middle for editors: llama.vscode, llama.vim).

Honoured, as llama.cpp defines them: `input_prefix`, `input_suffix`, `input_extra`
([{filename, text}], laid out before the prefix), `prompt` (the text typed on the cursor's line:
appended to the prefix), `n_predict` (-1: to the end of the context; 0: a warm-up that only reads
the prompt into the cache), `temperature` / `top_k` / `top_p` (llama.cpp's defaults 0.8 / 40 /
0.95), `samplers` (which of those apply, and llama.cpp's `infill` sampler: serve/llama/samplers.py),
`n_cmpl` (alias `n`: that many completions, a list of answers), `seed` (-1: random), `stop`,
`stream`, `cache_prompt` (the prefix cache is always on and never changes output, so either
value is honoured), `n_indent`, `t_max_predict_ms`, `ignore_eos`, `response_fields`, and
`model` (optional). Accepted because they cannot change what an exact server writes:
`t_max_prompt_ms` (llama.cpp parses it and never acts on it) and `id_slot` (a slot to run in:
no slot holds state a request's output depends on, and placement already starts a request from
the longest prefix any slot holds, which is what editors pin a slot for). Also the OpenAI fields
this server shares across endpoints (`max_tokens`, grammars, `min_tokens`,
`repetition_penalty`, `logit_bias` as OpenAI's object). llama.cpp options that change the
output and are not built are refused with a 400 naming them (`REFUSED_LLAMA`) rather than
ignored; other unknown fields are ignored, as on every endpoint.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Any

from pydantic import AliasChoices, BaseModel, BeforeValidator, Field, StrictBool, model_validator
from pydantic_core import PydanticCustomError

from ...options import RequestOptions
from ...text.fim import ExtraFile
from ..schema import GenerationRequest, OpenAIBaseModel, integer, none, number
from .samplers import SamplerChain, chain_options


def _num(v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError
    return v


# llama.cpp /completion options the engine does not apply: refused unless neutral (name ->
# whether the value asks for the option); a value of the wrong type counts as asking
REFUSED_LLAMA: dict[str, Any] = {
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
    "lora": bool,
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
    n: integer(ge=1, le=16) | None = Field(default=1, validation_alias=AliasChoices("n_cmpl", "n"),
                                           description="llama.cpp's n_cmpl (n: its fallback): completions of the "
                                                       "prompt, answered as a list")
    cache_prompt: StrictBool = True
    n_indent: integer(ge=0, le=10**6) = 0
    t_max_predict_ms: integer(ge=-1) = -1
    t_max_prompt_ms: integer() | None = Field(default=None, description="accepted: llama.cpp never acts on it")
    id_slot: integer(ge=-1) = Field(default=-1, description="accepted: no slot holds state an output depends on")
    response_fields: list[str] | None = None
    samplers: SamplerChain = Field(default=None, description="llama.cpp's sampler chain (names, or one character "
                                   "each): those of temperature, top_k, top_p, infill that apply, in this order")

    @model_validator(mode="after")
    def _refuse_llama_options(self):
        declared = {name: getattr(self, name) for name in REFUSED_LLAMA if name in type(self).model_fields}
        given = {**(self.model_extra or {}), **declared}
        for name, asks in REFUSED_LLAMA.items():
            if given.get(name) is not None and _asks(asks, given[name]):
                raise PydanticCustomError("unsupported_parameter", "'{param}' is not supported by this server: "
                                          "this llama.cpp option is not built", {"param": name})
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

    def to_options(self, room: int, **server) -> RequestOptions:
        """With `samplers`, what llama.cpp's chain does: a sampler left out does not apply (its
        field is then ignored, as llama.cpp ignores it), `infill` applies after top-p."""
        o = super().to_options(room, **server)
        return o if self.samplers is None else replace(o, **chain_options(self.samplers, o))

    def field_of(self, option: str | None) -> str | None:
        return "samplers" if option == "infill" else super().field_of(option)

    @property
    def t_max_s(self) -> float | None:
        return self.t_max_predict_ms / 1000 if self.t_max_predict_ms > 0 else None


def _asks(asks, value) -> bool:
    try:
        return bool(asks(value))
    except (TypeError, ValueError):
        return True


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
