"""llama.cpp's `/tokenize` and `/detokenize` over the bundle's tokenizer (no engine call: the Ray
ingress answers them itself).

`/tokenize`: text -> ids as this server reads text. `parse_special` true reads special-token
text (and every other added token's) as those tokens, as a plain prompt is read; false reads
all of it as text, as FIM user text is read (`Tokenizer.encode_text`). `add_special` puts the
tokens the tokenizer's post-processor writes around one text (BOS, EOS: none for Qwen or
SmolLM) around the first text part, as llama.cpp's `tokenize_mixed` does. Pieces and
`/detokenize` are llama.cpp's too: each token's own bytes (runtime/bundle/pieces.py), special
tokens written out; `/detokenize` joins them (bytes that are not UTF-8 read as U+FFFD).
"""

from __future__ import annotations

import functools

from ...bundle.pieces import piece_json, pieces
from ...bundle.tokenizer import Tokenizer
from ..errors import bad
from .schema_tokenize import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
    TokenPiece,
)


@functools.lru_cache(maxsize=8)
def _specials(tok: Tokenizer) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(ids before, ids after) that the tokenizer's post-processor adds around one text."""
    probe = "a"
    bare = tok.tk.encode(probe, add_special_tokens=False).ids
    full = tok.tk.encode(probe, add_special_tokens=True).ids
    for i in range(len(full) - len(bare) + 1):
        if full[i:i + len(bare)] == bare:
            return tuple(full[:i]), tuple(full[i + len(bare):])
    return (), ()


def _vocab(tok: Tokenizer) -> int:
    return tok.tk.get_vocab_size(with_added_tokens=True)


def _check_ids(tok: Tokenizer, ids, param: str, where) -> None:
    n = _vocab(tok)
    for i, t in where(ids):
        if not t < n:
            raise bad(f"token id {t} is outside the vocabulary [0, {n})", f"{param}[{i}]")


def tokenize(tok: Tokenizer, req: TokenizeRequest) -> TokenizeResponse:
    parts = [req.content] if isinstance(req.content, str) else req.content
    _check_ids(tok, parts, "content", lambda ps: [(i, p) for i, p in enumerate(ps) if isinstance(p, int)])
    ids: list[int] = []
    for i, part in enumerate(parts):
        if isinstance(part, int):
            ids.append(part)
            continue
        text = tok.tk.encode(part, add_special_tokens=False).ids if req.parse_special else tok.encode_text(part)
        if req.add_special and i == 0:  # llama.cpp: only a first part that is text
            before, after = _specials(tok)
            text = [*before, *text, *after]
        ids.extend(text)
    if not req.with_pieces:
        return TokenizeResponse(tokens=ids)
    p = pieces(tok)
    return TokenizeResponse(tokens=[TokenPiece(id=t, piece=piece_json(p.piece(t))) for t in ids])


def detokenize(tok: Tokenizer, req: DetokenizeRequest) -> DetokenizeResponse:
    _check_ids(tok, req.tokens, "tokens", enumerate)
    p = pieces(tok)
    return DetokenizeResponse(content=b"".join(p.piece(t) for t in req.tokens).decode("utf-8", "replace"))
