"""What a client reads back from the engine: a request's events (runtime/engine/request.py
`sink`) as token chunks (`Events`), and the finished `Result` (built by output.py's
`TextOutput`)."""

from __future__ import annotations

from dataclasses import dataclass

from ..engine import Request, Stats
from ..sampling.logits import TokenLogprob


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


END = object()  # what `Events.take` returns once a request's events are over (its state is then engine/request.py DONE)


class Events:
    """A request's engine events (`sink`'s kinds, request.py) as its client reads them."""

    def __init__(self, r: Request):
        self.r, self.finished = r, False  # finished: "done" or "error" was read

    def take(self, kind: str, value):
        """-> a chunk; None ("logprobs": kept in r.token_logprobs); END; or raises the error."""
        if kind == "tokens":
            return value
        if kind == "logprobs":
            self.r.token_logprobs.extend(value)
            return None
        self.finished = True
        if kind == "done":
            return END
        raise value
