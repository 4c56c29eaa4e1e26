"""The (legacy) completions endpoint's bodies (POST /v1/completions): one prompt per request;
a streamed chunk has the whole response's shape."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, Field, StrictBool
from pydantic_core import PydanticCustomError

from ..schema import FinishReason, GenerationRequest, UsageInfo, integer, none


def _one_prompt(v):
    if isinstance(v, list) and len(v) == 1 and isinstance(v[0], str):
        return v[0]
    if not isinstance(v, str):
        raise PydanticCustomError("prompt_type", "must be a string (one prompt per request)")
    return v



class CompletionRequest(GenerationRequest):
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

class CompletionLogprobs(BaseModel):
    """Completions' legacy shape: parallel lists per generated token."""

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float] = Field(default_factory=list)
    top_logprobs: list[dict[str, float]] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)



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
    usage: UsageInfo | None = Field(default=None, exclude_if=none)

