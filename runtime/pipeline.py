"""`specrt.load(bundle)` -> Pipeline: the bundle's models loaded once over a KV pool of
`max_batch` slots, an engine thread that serves every request, and the client calls
(`generate`, `stream`, `agenerate`, `astream`) that any number of threads or an asyncio loop
may use at once. Each request gets the output it would get alone. `runtime/bundle/loader.py` builds
the models and pools; `runtime/engine/` runs the requests; `runtime/policy/store.py` keeps what
adaptive k learns across requests; this file checks requests (what they ask for:
`runtime/options.py`) and turns token streams into text (`runtime/text/textstream.py`).
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from .backends.kvpool import ContextOverflow
from .bundle.loader import LoadedModels, load_models
from .bundle.manifest import BundleError
from .drafters import AutoDrafter, EagleDrafter, ModelDrafter, NgramDrafter
from .engine import Engine, Request, Scheduler, Stats
from .errors import InvalidRequest
from .options import (
    DRAFTS,
    LoadOptions,
    RequestOptions,
    default_draft,
    load_options,
    request_options,
)
from .policy.store import PolicyStore
from .sampling.grammar import Grammars
from .sampling.processing import draft_processor
from .text.results import DONE, Events, Result, feed, pieces, result_of
from .text.textstream import TextStream

__all__ = ["Pipeline", "Result", "load"]


class Pipeline:
    def __init__(self, folder: str | Path, options: LoadOptions | None = None, *, parts: LoadedModels | None = None,
                 **kw):
        """options: how to load and run the bundle (runtime/options.py `LoadOptions`: each
        field's default and meaning); keyword arguments (its field names) build them, or replace
        fields of `options`: `Pipeline(folder, max_batch=8)`. In short: draft "model" | "none" |
        "ngram" | "auto" (None follows the bundle); max_batch KV slots, allocated now (see
        `kv_bytes_per_slot`), or "auto" (as many as fit in `memory_fraction` of the available
        memory; a count that cannot fit raises InsufficientMemory before anything is
        allocated); max_seq_len tokens per slot (<= the bundle's S_max); adaptive k on by
        default whenever more than one request can run (a fixed k loses throughput under load,
        docs/benchmarks.md §5); max_queue requests waiting beyond which calls raise EngineBusy.
        parts: models already built (runtime/bundle/loader.py `LoadedModels`: tests drive fake
        backends this way); then nothing is loaded from `folder` and the loading fields do not
        apply."""
        self.options = o = load_options(options, **kw)
        # None loads the bundle's draft model if it has one, and then drafts with it
        self.parts = p = parts if parts is not None else load_models(folder, o)
        draft = default_draft(o.draft, p.draft is not None)
        self._check_draft(draft)
        self.folder, self.manifest, self.tokenizer = p.folder, p.manifest, p.tokenizer
        self.hugepages = o.hugepages
        self.max_seq_len = p.target.max_seq_len  # the load's context: the bundle's S_max or less
        self.max_k = p.manifest.target.max_tokens_per_call - 1
        self.default_draft = draft
        self.draft_window = o.draft_window
        man = p.manifest
        # k: the caller's, else what the exporter recommends for this draft, else 4
        self.default_k = o.k if o.k is not None else (man.draft.default_k if man.draft and man.draft.default_k else 4)
        self.default_adaptive = o.adaptive if o.adaptive is not None else p.target.pool.slots > 1
        self.store = PolicyStore(p, self.max_k, threads=o.threads, device=o.device, global_pool=o.global_pool,
                                 hugepages=o.hugepages, cost_cache=o.cost_cache,
                                 draft_window=None if p.shared_kv or p.eagle else o.draft_window)
        self.scheduler = Scheduler(p.target, p.draft, features=p.features, make_drafter=self._drafter,
                                   policies=self.store.policies, plan_batches=o.plan_batches,
                                   prefix_cache=o.prefix_cache)
        self.engine = Engine(self.scheduler, max_queue=o.max_queue, before_admit=self._before_admit)
        self._local = threading.local()
        self.grammars = Grammars(p.folder / man.tokenizer.file, man.target.vocab_size, self.tokenizer.eos_ids)

    # --- engine hooks (engine thread) --------------------------------------------------------
    def _drafter(self, r: Request):
        p = self.parts
        if r.draft == "none":
            return None
        if r.draft == "ngram":
            return NgramDrafter(max_proposal=self.max_k)
        if p.eagle:  # `request` checked that a draft model is loaded
            model = EagleDrafter(p.draft, r.slot, p.features[r.slot], process=draft_processor(r))
        else:
            model = ModelDrafter(p.draft, r.slot, "target" if p.shared_kv else None, process=draft_processor(r),
                                 window=self.draft_window)
        return model if r.draft == "model" else AutoDrafter(model, NgramDrafter(max_proposal=self.max_k))

    def _before_admit(self, r: Request) -> None:
        if r.adaptive and r.draft != "none" and self.scheduler.costs is None:
            self.scheduler.costs = self.store.costs()

    # --- requests ----------------------------------------------------------------------------
    def costs(self):
        """Call costs on this machine (the cached probe, else measured now). Probing runs model
        calls: do not call it while requests are running (the engine calls it for the first
        adaptive request)."""
        return self.store.costs()

    def check_request(self, n_prompt: int, max_new_tokens: int, k: int):
        if n_prompt == 0:  # max_new_tokens >= 1: RequestOptions checked it
            raise InvalidRequest("empty prompt")
        if not 0 <= k <= self.max_k:
            raise InvalidRequest(f"k must be between 0 and {self.max_k} (the bundle's max_tokens_per_call - 1), "
                                 f"got {k}", "k")
        if n_prompt + max_new_tokens > self.max_seq_len:
            s_max = self.manifest.target.kv.max_seq_len
            where, bigger = (("the bundle's context", "re-export with a larger --max-seq-len") if self.max_seq_len == s_max
                             else ("the context loaded (max_seq_len)", f"load with a larger max_seq_len (up to {s_max})"))
            raise ContextOverflow(
                f"prompt ({n_prompt} tokens) + max_new_tokens ({max_new_tokens}) exceeds {where} of "
                f"{self.max_seq_len} tokens; shorten the prompt, lower max_new_tokens to at most "
                f"{max(0, self.max_seq_len - n_prompt)}, or {bigger}", "max_new_tokens")

    def _check_draft(self, draft: str) -> None:
        if draft not in DRAFTS:
            raise InvalidRequest(f"draft must be one of {DRAFTS}, got {draft!r}", "draft")
        if draft in ("model", "auto") and self.parts.draft is None:
            raise BundleError(f"bundle {self.parts.folder} has no draft model (or it was not loaded); "
                              "use draft='none' or 'ngram'")

    def request(self, prompt_ids: list[int], options: RequestOptions | None = None, *,
                stats: Stats | None = None, sibling: int = 0, **kw) -> Request:
        """A checked request (not yet submitted). options: what it asks for (runtime/options.py);
        keyword arguments (RequestOptions' field names) build them, or replace fields of
        `options`. This checks what needs the bundle: logit_bias against the vocabulary, k
        against the bundle's widest call, the prompt and max_new_tokens against the context, that
        a draft model is loaded; a grammar that cannot compile raises GrammarError (a ValueError).
        Each is an InvalidRequest naming the option (ContextOverflow: max_new_tokens).
        sibling: this is choice i of several of one prompt (`RequestOptions.stream_seed`)."""
        o = request_options(options, **kw)
        pen = o.penalties()
        o.check_vocab(self.manifest.target.vocab_size)
        matcher = None if o.grammar is None else self.grammars.matcher(self.grammars.compile(o.grammar))
        k = self.default_k if o.k is None else o.k
        self.check_request(len(prompt_ids), o.max_new_tokens, k)
        draft = o.draft or self.default_draft
        self._check_draft(draft)
        adaptive = self.default_adaptive if o.adaptive is None else o.adaptive
        eos = frozenset() if o.ignore_eos else frozenset(self.tokenizer.eos_ids)
        return Request(list(prompt_ids), o.sampling(), o.max_new_tokens, eos, k=k if draft != "none" else 0,
                       draft=draft, adaptive=adaptive and draft != "none", seed=o.stream_seed(sibling), stats=stats,
                       timeout_s=o.timeout_s, penalties=pen if pen.active else None, logprobs=o.logprobs,
                       grammar=matcher)

    def stream_ids(self, prompt_ids: list[int], options: RequestOptions | None = None, **kw) -> Iterator[list[int]]:
        """Token-level generation: yields committed chunks of new token ids. Closing the
        iterator early cancels the request (its slot is free at the next step). kw: `request`'s."""
        return self.submit(self.request(prompt_ids, options, **kw))

    def submit(self, r: Request) -> Iterator[list[int]]:
        """Submit a checked request now (EngineBusy is raised here) and return an iterator of its
        token chunks; its logprobs, when asked, collect in `r.token_logprobs`."""
        events: queue.SimpleQueue = queue.SimpleQueue()
        r.sink = lambda kind, value: events.put((kind, value))
        self.engine.submit(r)
        return self._drain(r, events)

    def _drain(self, r: Request, events) -> Iterator[list[int]]:
        ev = Events(r)
        try:
            while (chunk := ev.take(*events.get())) is not DONE:
                if chunk is not None:
                    yield chunk
        finally:
            if not ev.finished:  # cancel, and wait the step it takes: the slot is free and the stats final
                self.engine.cancel(r)
                while events.get()[0] not in ("done", "error"):  # tokens, logprobs
                    pass

    def _text_request(self, prompt: str, options, chat: bool, stats: Stats | None, kw: dict):
        """(the checked Request, the TextStream that turns its tokens into text)."""
        o = request_options(options, **kw)
        ids = self.tokenizer.encode(prompt, chat=chat)
        return self.request(ids, o, stats=stats or Stats()), TextStream(self.tokenizer, list(o.stop))

    def stream(self, prompt: str, options: RequestOptions | None = None, *, chat: bool = True,
               stats: Stats | None = None, **kw) -> Iterator[str]:
        """Yields text pieces as tokens are committed; the full Result is in `self.last` after
        (per thread). options / kw: as `request`'s. With stop strings, text that could be the
        start of one is held back until resolved."""
        r, text = self._text_request(prompt, options, chat, stats, kw)
        chunks = feed(self.submit(r), text)
        try:
            for chunk in chunks:
                yield from pieces(r, text, chunk)
        finally:
            chunks.close()  # cancels the request if it is unfinished, then its stats are final
            self._local.last = result_of(r, text)
        tail = text.tail()
        if tail:  # not in `finally`: a closed generator must not yield
            yield tail

    def generate(self, prompt: str, options: RequestOptions | None = None, **kw) -> Result:
        for _ in self.stream(prompt, options, **kw):
            pass
        return self.last

    def choices(self, prompt: str, n: int, options: RequestOptions | None = None, *, chat: bool = True,
                **kw) -> list[Result]:
        """n choices of one prompt (OpenAI's `n`), decoded together: each samples from its own
        stream derived from `seed` (`RequestOptions.stream_seed`), and the later ones copy the
        first one's prompt rows instead of computing them (runtime/engine/scheduler.py)."""
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        o = request_options(options, **kw)
        ids = self.tokenizer.encode(prompt, chat=chat)
        reqs = [self.request(ids, o, stats=Stats(), sibling=i) for i in range(n)]
        gens: list = []
        try:
            for r in reqs:
                gens.append(self.submit(r))
            results = []
            for r, gen in zip(reqs, gens, strict=True):
                text = TextStream(self.tokenizer, list(o.stop))
                for chunk in gen:
                    text.push(chunk)
                    if text.stopped:
                        r.stats.stop_reason = "stop"
                        break
                else:
                    text.flush()
                gen.close()
                results.append(result_of(r, text))
            return results
        finally:
            for gen in gens:
                gen.close()

    # --- chat with tools (runtime/text/chat.py) ----------------------------------------------------
    def chat(self, messages: list[dict], **kw):
        """OpenAI-shaped messages (and `tools`, `tool_choice`, `parallel_tool_calls`) -> a
        ChatResult: content, parsed `tool_calls`, finish_reason (runtime/text/chat.py)."""
        from .text.chat import chat

        return chat(self, messages, **kw)

    def stream_chat(self, messages: list[dict], **kw):
        """As `chat`, yielding Deltas (content and tool-call pieces) as tokens are committed."""
        from .text.chat import stream_chat

        return stream_chat(self, messages, **kw)

    @property
    def last(self) -> Result | None:
        """The Result of this thread's last `stream` / `generate`."""
        return getattr(self._local, "last", None)

    # --- asyncio -----------------------------------------------------------------------------
    async def astream_ids(self, prompt_ids: list[int], options: RequestOptions | None = None, **kw) -> AsyncIterator[list[int]]:
        r = self.request(prompt_ids, options, **kw)
        async for chunk in self.asubmit(r):
            yield chunk

    def asubmit(self, r: Request) -> AsyncIterator[list[int]]:
        """Submit a checked request now (EngineBusy is raised here, not at the first chunk) and
        return an async iterator of its token chunks; closing it early cancels the request."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        r.sink = lambda kind, value: loop.call_soon_threadsafe(events.put_nowait, (kind, value))
        self.engine.submit(r)
        return self._adrain(r, events)

    async def _adrain(self, r: Request, events: asyncio.Queue) -> AsyncIterator[list[int]]:
        ev = Events(r)
        try:
            while (chunk := ev.take(*await events.get())) is not DONE:
                if chunk is not None:
                    yield chunk
        finally:
            if not ev.finished:
                self.engine.cancel(r)
                while (await events.get())[0] not in ("done", "error"):
                    pass

    async def astream(self, prompt: str, options: RequestOptions | None = None, *, chat: bool = True,
                      stats: Stats | None = None, result: list | None = None, **kw) -> AsyncIterator[str]:
        """As `stream`, for asyncio; `result` (a list) receives the Result at the end."""
        r, text = self._text_request(prompt, options, chat, stats, kw)
        gen = self.asubmit(r)
        try:
            async for chunk in gen:
                for piece in pieces(r, text, chunk):
                    yield piece
                if text.stopped:
                    break
            else:
                text.flush()
        finally:
            await gen.aclose()
            if result is not None:
                result.append(result_of(r, text))
        tail = text.tail()
        if tail:
            yield tail

    async def agenerate(self, prompt: str, options: RequestOptions | None = None, **kw) -> Result:
        out: list = []
        async for _ in self.astream(prompt, options, result=out, **kw):
            pass
        return out[0]

    # --- lifecycle ---------------------------------------------------------------------------
    def counters(self) -> dict:
        return self.engine.counters()

    def forget_learned(self) -> None:
        """Start adaptive k again from its priors: drop the acceptance and calibration earlier
        requests taught, and the scheduler's kept no-drafting plan (the call-cost probe stays).
        Call it while no request runs (tests, or a service switching to a different workload)."""
        self.store.forget()
        self.scheduler.forget_plan()

    def forget_prefixes(self) -> None:
        """Drop the KV rows finished requests left in their slots (the prefix cache): the next
        prompts are computed from their first token. Call it while no request runs."""
        self.scheduler.forget_prefixes()

    @property
    def kv_bytes_per_slot(self) -> int:
        """KV bytes one slot holds, every pool (the engine's counters report the same)."""
        return self.parts.kv_bytes_per_slot

    @property
    def kv_bytes(self) -> int:
        """KV bytes allocated at load, every pool and slot."""
        return self.kv_bytes_per_slot * self.parts.target.pool.slots

    def close(self) -> None:
        self.engine.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def load(folder: str | Path = "engines/default", options: LoadOptions | None = None, **kw) -> Pipeline:
    """A Pipeline over the bundle at `folder`; options / kw: `Pipeline`'s."""
    return Pipeline(folder, options, **kw)
