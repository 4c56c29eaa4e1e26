"""llama.cpp's `/tokenize` and `/detokenize` bodies (editors count tokens with them: llama.vscode
posts `{content, add_special: false, parse_special: true}`).

Every field llama.cpp defines is honoured, with its default: `content` (a string, or llama.cpp's
mixed list of strings and token ids), `add_special` (false: no BOS / EOS), `parse_special`
(true: special-token text in `content` is read as those tokens; false: all of it is text, as
this server reads FIM user text), `with_pieces` (false). `model` is optional; if given it must
be the served model's id. Other fields are ignored, as on every endpoint.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field, StrictBool

from ..schema import OpenAIBaseModel, integer

TokenId = integer(ge=0, le=2**31 - 1)


class TokenizeRequest(OpenAIBaseModel):
    model: str | None = Field(default=None, description="optional; if given, the served model's id")
    content: str | Annotated[list[str | TokenId], Field(max_length=1 << 20)] = Field(
        description="text, or text and token ids mixed (ids are kept as they are)")
    add_special: StrictBool = Field(default=False, description="add the tokens the tokenizer puts around a text "
                                                               "(BOS, EOS) to the first text part")
    parse_special: StrictBool = Field(default=True, description="read special-token text as those tokens")
    with_pieces: StrictBool = Field(default=False, description="each token as {id, piece}")


class DetokenizeRequest(OpenAIBaseModel):
    model: str | None = Field(default=None, description="optional; if given, the served model's id")
    tokens: Annotated[list[TokenId], Field(max_length=1 << 20)] = Field(default_factory=list)


# ---- responses ------------------------------------------------------------------------------

class TokenPiece(BaseModel):
    id: int
    piece: str | list[int]  # the token's text, or its bytes when they are not valid UTF-8 alone


class TokenizeResponse(BaseModel):
    tokens: list[int] | list[TokenPiece]


class DetokenizeResponse(BaseModel):
    content: str
