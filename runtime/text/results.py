"""What a client reads back from the engine: a request's events (runtime/engine/request.py
`sink`) as token chunks, the text pieces they release, and the finished `Result`."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ..engine import Request, Stats
from ..sampling.logits import TokenLogprob
from .textstream import TextStream


@dataclass
class Result:
    text: str
    token_ids: list[int]
    stats: Stats
    logprobs: list[TokenLogprob] | None = None  # per token of token_ids, when asked (runtime/sampling/logits.py)

    def as_dict(self) -> dict:
        d = {"text": self.text, "token_ids": self.token_ids, "stats": self.stats.as_dict()}
        if self.logprobs is not None:
            d["logprobs"] = [{"token": e.token, "logprob": e.logprob, "top": e.top} for e in self.logprobs]
        return d


DONE = object()


class Events:
    """A request's engine events (`sink`'s kinds, request.py) as its client reads them."""

    def __init__(self, r: Request):
        self.r, self.finished = r, False  # finished: "done" or "error" was read

    def take(self, kind: str, value):
        """-> a chunk; None ("logprobs": kept in r.token_logprobs); DONE; or raises the error."""
        if kind == "tokens":
            return value
        if kind == "logprobs":
            self.r.token_logprobs.extend(value)
            return None
        self.finished = True
        if kind == "done":
            return DONE
        raise value


def feed(gen, text: TextStream) -> Iterator[list[int]]:
    """The token chunks of `gen` until a stop string in `text` ends them (the caller pushes each
    chunk into `text` before asking for the next); `text.flush()` when they run out. `gen` (a
    request's chunk iterator) is closed however this ends, which cancels an unfinished request."""
    try:
        for chunk in gen:
            yield chunk
            if text.stopped:
                return
        text.flush()
    finally:
        gen.close()


def pieces(r: Request, text: TextStream, chunk: list[int]) -> Iterator[str]:
    """The text a token chunk releases (none while held back); a stop string ends it ("stop")."""
    piece = text.push(chunk)
    if text.stopped:
        r.stats.stop_reason = "stop"
    if piece:
        yield piece


def result_of(r: Request, text: TextStream) -> Result:
    """The Result of a request whose tokens went through `text` (logprobs cut where its ids end)."""
    lp = None if r.logprobs is None else r.token_logprobs[: len(text.ids)]
    return Result(text.full, text.ids, r.stats, lp)
