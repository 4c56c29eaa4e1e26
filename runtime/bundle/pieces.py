"""Each token's bytes, as llama.cpp's `token_to_piece` gives them: what `/tokenize`'s
`with_pieces` and `/detokenize` report, and what llama.cpp's `infill` sampler compares
(runtime/sampling/infill.py).

A token's piece is its own bytes, not a decoded string: a byte-level BPE token (GPT-2, SmolLM,
Qwen) may hold part of a UTF-8 character, a SentencePiece byte token `<0xE3>` is one byte, and
SentencePiece's `▁` is a space kept even at the start (HF's decoders drop that one). Added
tokens are their text; with `special=False` the special ones (control tokens: EOS, the chat
markers) are empty, as llama.cpp renders control tokens without `special`. Ids past the
tokenizer's vocabulary (a model's padded rows) are empty.

A table of every id is built once per tokenizer (~0.1 s for a 150k vocabulary).
"""

from __future__ import annotations

import functools
import json
import re

from .tokenizer import Tokenizer

_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")  # SentencePiece's byte fallback


@functools.cache
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet: printable stand-in character -> the byte it stands for."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


def _decoder_kinds(tk) -> set[str]:
    """The decoder types of a `tokenizers.Tokenizer` (a Sequence's members included)."""
    dec = json.loads(tk.to_str()).get("decoder") or {}
    members = dec.get("decoders", [dec]) if dec.get("type") == "Sequence" else [dec]
    kinds = {d.get("type") for d in members}
    if any(d.get("type") == "Replace" and d.get("pattern", {}).get("String") == "\u2581" for d in members):
        kinds.add("Metaspace")  # Llama's SentencePiece decoder: Replace ▁ -> space, ByteFallback, ...
    return kinds


class Pieces:
    """The pieces of one tokenizer's tokens (`pieces(tok)`: one per tokenizer)."""

    def __init__(self, tok: Tokenizer):
        self.tk = tok.tk
        kinds = _decoder_kinds(self.tk)
        self.added = self.tk.get_added_tokens_decoder()
        self.bmap = _byte_decoder() if "ByteLevel" in kinds else None
        self.byte_fallback, self.metaspace = "ByteFallback" in kinds, "Metaspace" in kinds
        self._tables: dict[tuple[int, bool], tuple[bytes, ...]] = {}

    def piece(self, token_id: int, special: bool = True) -> bytes:
        """One token's bytes. special: whether a special added token renders as its text (True:
        `/tokenize`, `/detokenize`) or as nothing (False: the infill sampler's comparison)."""
        a = self.added.get(token_id)
        if a is not None:
            return a.content.encode() if special or not a.special else b""
        s = self.tk.id_to_token(token_id)
        if s is None:
            return b""
        if self.bmap is not None and all(c in self.bmap for c in s):
            return bytes(self.bmap[c] for c in s)
        if self.byte_fallback and (m := _BYTE_TOKEN.match(s)):
            return bytes([int(m.group(1), 16)])
        if self.metaspace:
            return s.replace("\u2581", " ").encode()
        return self.tk.decode([token_id], skip_special_tokens=False).encode()  # WordLevel, WordPiece, ...

    def table(self, vocab: int, special: bool) -> tuple[bytes, ...]:
        """The piece of every id in [0, vocab) (a model's rows may outnumber the tokenizer's
        tokens: those are empty). Built once per (vocab, special)."""
        key = (vocab, special)
        if key not in self._tables:
            self._tables[key] = tuple(self.piece(i, special) for i in range(vocab))
        return self._tables[key]


@functools.lru_cache(maxsize=8)
def pieces(tok: Tokenizer) -> Pieces:
    """The one `Pieces` of a tokenizer."""
    return Pieces(tok)


def piece_json(piece: bytes) -> str | list[int]:
    """A piece as llama.cpp's /tokenize writes it: the text if it is valid UTF-8, else its bytes."""
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        return list(piece)
