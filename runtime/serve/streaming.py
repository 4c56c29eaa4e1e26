"""One response's requests as they run: each choice's token events turned into text (`Job`), the
choices fanned in to one SSE stream or collected into one body (`Reply`), and the streamed
response that cancels its requests however it ends (`Stream`).

A choice's text comes from `Pipeline.astart` (runtime/text/output.py `TextOutput`: stop strings,
finish reason, logprobs); its chunks are built by a response shape (shape.py). A client that disconnects
cancels the requests: a stream by closing, a collected body through `watch_disconnect`.
"""

from __future__ import annotations

import asyncio
import logging
import time

from fastapi import Request
from fastapi.responses import StreamingResponse

from .schema import PromptTokensDetails, UsageInfo
from .shape import ResponseShape, sse_event

log = logging.getLogger("specrt.serve")
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class Stream(StreamingResponse):
    """A streamed response that cancels its requests however the response ends: a client that
    disconnects before the first chunk leaves the generator unstarted (no `finally` of its
    own runs), and the requests would otherwise hold their slots to the end."""

    def __init__(self, content, on_close, **kw):
        super().__init__(content, **kw)
        self._on_close = on_close

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()  # requests that already finished ignore it


class Job:
    """One choice: its output as text (runtime/text/output.py `TextOutput`) and its timing."""

    def __init__(self, out, index: int):
        """out: the choice's TextOutput (`Pipeline.astart`)."""
        self.out, self.index = out, index
        self.t0 = time.perf_counter()

    def cancel(self) -> None:
        """Stop the request (a request that already finished ignores it)."""
        self.out.cancel()

    async def close(self) -> None:
        await self.out.aclose()  # cancels a request still running

    def pieces(self):
        """Text pieces as they are safe to show, the last one included; ends at EOS / length / a
        stop string / timeout (then the request is over: a stop string cancels it)."""
        return aiter(self.out)

    def outcome(self, n_prompt: int) -> tuple:
        """`Metrics.finished`'s arguments: (prompt tokens, new tokens, finish reason, TTFT s,
        TPOT s, end-to-end s)."""
        n = len(self.out.ids)
        end = time.perf_counter()
        t_first = self.out.t_first
        ttft = t_first - self.t0 if t_first else None
        tpot = (end - t_first) / (n - 1) if t_first and n > 1 else None
        return n_prompt, n, self.out.finish_reason(), ttft, tpot, end - self.t0


class Reply:
    """One response over n choices: streamed as SSE chunks (choices interleaved as their tokens
    come, each chunk naming its `index`) or collected into one body. The prompt counts once in
    usage; its cached tokens are the first choice's (the others copy its rows)."""

    def __init__(self, jobs: list[Job], out: ResponseShape, n_prompt: int, record=None):
        """record(prompt_tokens, new_tokens, finish_reason, ttft_s, tpot_s, e2e_s): called once
        per choice that ends normally (`Metrics.finished`); None records nothing."""
        self.jobs, self.out, self.n_prompt, self.record = jobs, out, n_prompt, record
        self.finished: list[tuple] = []  # what was recorded, per choice that ended normally
        self._left = 0  # streamed choices not done yet

    def _done(self, job: Job) -> None:
        rec = job.outcome(self.n_prompt if job.index == 0 else 0)  # the prompt counts once
        self.finished.append(rec)
        if self.record is not None:
            self.record(*rec)

    def _stop_sequence(self, job: Job) -> None:
        """Tell the shape which stop string ended this choice (Anthropic's `stop_sequence`,
        messages_api.py; OpenAI's shapes say only "stop")."""
        if job.out.stop_sequence is not None:
            self.out.stopped_by(job.index, job.out.stop_sequence)

    def usage(self) -> UsageInfo:
        n = sum(len(j.out.ids) for j in self.jobs)
        return UsageInfo(prompt_tokens=self.n_prompt, completion_tokens=n, total_tokens=self.n_prompt + n,
                         prompt_tokens_details=PromptTokensDetails(cached_tokens=self.jobs[0].out.stats.cached_tokens))

    def cancel(self) -> None:
        for j in self.jobs:
            j.cancel()

    async def _choice(self, job: Job):
        """One choice's chunks: role, content pieces (with their logprobs), the finish chunk."""
        out, i = self.out, job.index
        for chunk in out.first(i):
            yield chunk
        async for piece in job.pieces():
            chunk = out.piece(i, piece, job.out.new_logprobs())
            if chunk is not None:  # None: nothing to say yet (tool calls: a tag held back, serve/openai/tool_chat.py)
                yield chunk
        lp = job.out.new_logprobs()  # tokens whose text is still empty (held by the detokenizer)
        tail = out.piece(i, "", lp) if lp else None
        if tail is not None:  # None here too: a tool chat's held piece (serve/openai/tool_chat.py)
            yield tail
        self._stop_sequence(job)
        yield out.last(i, job.out.finish_reason())

    def _pumps(self) -> tuple[list[asyncio.Future], asyncio.Queue]:
        """One task per choice moving its chunks to one queue; a choice ends with itself (its
        Job) or the exception it raised."""
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(job):
            try:
                async for chunk in self._choice(job):
                    await queue.put(chunk)
                await queue.put(job)  # this choice is done
            except Exception as e:  # noqa: BLE001 - raised by `_next`, reported in the stream
                await queue.put(e)

        return [asyncio.ensure_future(pump(j)) for j in self.jobs], queue

    async def _next(self, queue: asyncio.Queue):
        """The next chunk of any choice; None once every choice is done (a choice's error is
        raised here)."""
        while self._left:
            item = await queue.get()
            if isinstance(item, Exception):
                raise item
            if not isinstance(item, Job):
                return item
            self._left -= 1
            self._done(item)
        return None

    async def _close(self, tasks: list[asyncio.Future]) -> None:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for j in self.jobs:
            await j.close()

    async def sse(self, include_usage: bool):
        """The response as SSE lines, ending with [DONE]; an error after the status is sent ends
        the stream with an error chunk (`errors.stream_error`)."""
        tasks, queue = self._pumps()
        self._left = len(self.jobs)
        try:
            while (chunk := await self._next(queue)) is not None:
                yield sse_event(chunk)
            if include_usage:
                yield sse_event(self.out.usage(self.usage()))
            yield self.out.done  # other wire formats end with their own event
        except Exception as e:  # noqa: BLE001 - mid-stream: the status is sent; say it in the stream
            log.error("specrt: request %s failed mid-stream: %s", self.out.id, e)
            yield self.out.sse_error(e)
        finally:  # a client that went away cancels its requests; each pump ends with its request
            await self._close(tasks)

    async def collect(self, request: Request | None = None):
        """The whole response: the output's `whole` over (text, finish reason, logprobs, new
        tokens) per choice. With an HTTP `request`, a client that disconnects cancels the
        requests (polled every 0.5 s); without one, cancelling the calling task does."""

        async def whole(job: Job):
            text = "".join([piece async for piece in job.pieces()])
            self._done(job)
            self._stop_sequence(job)
            return text, job.out.finish_reason(), job.out.new_logprobs(), len(job.out.ids)

        watcher = asyncio.ensure_future(watch_disconnect(request, self.cancel)) if request is not None else None
        tasks = [asyncio.ensure_future(whole(j)) for j in self.jobs]
        try:
            choices = await asyncio.gather(*tasks)
        finally:  # one choice failed (or the caller was cancelled): the others stop, then close
            if watcher is not None:
                watcher.cancel()
            self.cancel()
            await self._close(tasks)
        return self.out.whole(list(choices), self.usage())


async def watch_disconnect(request: Request, on_disconnect) -> None:
    """Call on_disconnect() once the HTTP client has gone (polled every 0.5 s); cancel the task
    that runs this when the response is complete."""
    while True:
        await asyncio.sleep(0.5)
        if await request.is_disconnected():
            on_disconnect()
            return
