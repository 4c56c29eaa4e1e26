"""One request's output as text: the one place that turns a submitted request's token chunks
into text pieces (detokenized, cut at stop strings), its finish reason and its logprobs.
`Pipeline.stream` / `generate` / `choices` / `astream`, chat with tools (chat.py) and the server
(runtime/serve/streaming.py) all read a request through a `TextOutput`.

    out = pipe.start(request, stop)          # or pipe.astart(...) under asyncio
    for piece in out: ...                    # async for under asyncio; ends at EOS, length,
                                             # timeout or a stop string (which cancels the request)
    out.finish_reason(), out.result(), out.new_logprobs()
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import replace

from ..engine import Request, Stats
from .results import Result
from .textstream import TextStream

FINISH = {"eos": "stop", "stop": "stop", "length": "length", "timeout": "timeout"}  # engine -> OpenAI


def finish_reason(stop_reason: str, stopped_by_string: bool, calls: bool = False) -> str:
    """The engine's stop reason -> OpenAI's finish_reason (stop | length | timeout); a reply that
    ends normally after tool calls says "tool_calls"."""
    reason = "stop" if stopped_by_string else FINISH.get(stop_reason, "stop")
    return "tool_calls" if calls and reason == "stop" else reason


class TextOutput:
    """A submitted request's token chunks -> text pieces. Iterate it once (sync or async, as its
    chunks are); however the iteration ends, its chunk iterator is closed, which cancels a
    request still running and waits until its stats are final."""

    def __init__(self, r: Request, chunks, tokenizer, stop=(), cancel: Callable[[], None] | None = None,
                 text: TextStream | None = None):
        """chunks: the request's token chunks (`Pipeline.submit` / `asubmit`); cancel(): stops the
        request from any thread without waiting (`Pipeline.cancel`); text: a TextStream of the
        caller's that ends the text by more than stop strings (an editor's, runtime/text/fim.py)."""
        self._r, self._chunks, self._cancel = r, chunks, cancel
        self.text = text if text is not None else TextStream(tokenizer, list(stop), r.text_prefix)
        self._token_text = tokenizer.token_text
        self._lp_sent = 0  # tokens whose logprobs `new_logprobs` handed out
        self._ait = None  # the async iteration, once begun
        self.t_first: float | None = None  # perf_counter() when the first token chunk arrived

    @property
    def ids(self) -> list[int]:
        """The new token ids so far (cut at a stop string)."""
        return self.text.ids

    @property
    def stats(self) -> Stats:
        return self._r.stats

    def push(self, chunk: list[int]) -> str:
        """-> the text a chunk releases ("" while held back); a stop string ends the output."""
        if self.t_first is None:
            self.t_first = time.perf_counter()
        return self.text.push(chunk)

    def __iter__(self) -> Iterator[str]:
        return self._pieces()

    def __aiter__(self) -> AsyncIterator[str]:
        self._ait = self._apieces()
        return self._ait

    def _pieces(self) -> Iterator[str]:
        try:
            for chunk in self._chunks:
                yield from self._release(chunk)
                if self.text.stopped:
                    break
        finally:
            self._chunks.close()  # cancels the request if it is unfinished; then its stats are final
        yield from self._end()  # not in `finally`: a closed generator must not yield

    async def _apieces(self) -> AsyncIterator[str]:
        try:
            while not self.text.stopped and (chunk := await anext(self._chunks, None)) is not None:
                for piece in self._release(chunk):
                    yield piece
        finally:
            await self._chunks.aclose()
        for piece in self._end():
            yield piece

    def _release(self, chunk: list[int]) -> tuple[str, ...]:
        piece = self.push(chunk)
        return (piece,) if piece else ()

    def _end(self) -> Iterator[str]:
        """The tokens ran out (decode what the detokenizer held back) or a stop string ended
        them: the text not handed out yet."""
        if not self.text.stopped:
            self.text.flush()
        tail = self.text.tail()
        if tail:
            yield tail

    def cancel(self) -> None:
        """Stop the request now, from any thread (a request that already finished ignores it)."""
        if self._cancel is not None:
            self._cancel()

    def close(self) -> None:
        """End a sync output early, iterated or not: cancels the request and waits the step
        that takes."""
        self.cancel()
        self._chunks.close()

    async def aclose(self) -> None:
        """End an async output early: cancels a request whose chunks were being read and waits
        the step that takes (one never read: `cancel` it)."""
        if self._ait is not None:
            await self._ait.aclose()
        await self._chunks.aclose()

    @property
    def stop_reason(self) -> str:
        """The output's stop reason: "stop" where a stop string ended it (the request is then
        cancelled, or it had ended in the same chunk), else the engine's (`Stats.stop_reason`)."""
        return "stop" if self.text.stopped else self._r.stats.stop_reason

    def finish_reason(self, calls: bool = False) -> str:
        """OpenAI's finish_reason; calls: the reply held tool calls."""
        return finish_reason(self._r.stats.stop_reason, self.text.stopped, calls)

    @property
    def stop_sequence(self) -> str | None:
        """The stop string that ended the output (None: EOS, length, timeout, or not ended yet)."""
        return self.text.stop

    def new_logprobs(self) -> list | None:
        """(token text, logprob, [(text, logprob)] alternatives) of the tokens pushed since the
        last call (None when the request did not ask for logprobs)."""
        if self._r.logprobs is None:
            return None
        n = len(self.text.ids)
        lp, self._lp_sent = self._r.token_logprobs[self._lp_sent : n], n
        text = self._token_text
        return [(text(e.token), e.logprob, [(text(t), v) for t, v in e.top]) for e in lp]

    def result(self) -> Result:
        """The Result so far (final once iterated: logprobs cut where its ids end)."""
        r = self._r
        lp = None if r.logprobs is None else r.token_logprobs[: len(self.text.ids)]
        # the request's stats are the engine's: the output's own stop reason goes on a copy
        stats = r.stats if r.stats.stop_reason == self.stop_reason else replace(r.stats, stop_reason=self.stop_reason)
        return Result(self.text.full, self.text.ids, stats, lp)
