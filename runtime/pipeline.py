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
import functools
import queue
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path

from .backends.kvpool import ContextOverflow
from .bundle.loader import LoadedModels, load_models
from .bundle.manifest import BundleError
from .bundle.pieces import pieces
from .drafters.factory import DrafterFactory
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
from .sampling.infill import InfillSampler
from .sampling.text_prefix import TextPrefix, prefix_index
from .text.output import TextOutput
from .text.results import END, Events, Result

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
        man = p.manifest
        # k: the caller's, else what the exporter recommends for this draft, else 4
        self.default_k = o.k if o.k is not None else (man.draft.default_k if man.draft and man.draft.default_k else 4)
        self.default_adaptive = o.adaptive if o.adaptive is not None else p.target.pool.slots > 1
        window = None if p.shared_kv or p.eagle else o.draft_window  # only a separate draft reads a prompt
        self.store = PolicyStore(p, self.max_k, threads=o.threads, device=o.device, global_pool=o.global_pool,
                                 hugepages=o.hugepages, cost_cache=o.cost_cache, draft_window=window)
        # what the engine needs is handed down here; it never calls back into this object
        self.scheduler = Scheduler(p.target, p.draft, features=p.features,
                                   make_drafter=DrafterFactory(p, self.max_k, window), policies=self.store.policies,
                                   probe_costs=self.store.costs, plan_batches=o.plan_batches,
                                   prefix_cache=o.prefix_cache)
        if parts is None and draft != "none" and self.default_adaptive:
            # the probe at load, before any request (a server reports ready after it): inside
            # the first requests it cost a burst half its speed (docs/benchmarks.md §5); a probe
            # that fails is left to the first adaptive request
            self.scheduler.probe_now()
        self.engine = Engine(self.scheduler, max_queue=o.max_queue)
        self._local = threading.local()
        self.grammars = Grammars(p.folder / man.tokenizer.file, man.target.vocab_size, self.tokenizer.eog_ids)

    # --- requests ----------------------------------------------------------------------------
    def costs(self):
        """Call costs on this machine (the cached probe, else measured now). Probing runs model
        calls: do not call it while requests are running (the engine calls it for the first
        adaptive request)."""
        return self.store.costs()

    def use_costs(self, costs=None):
        """Let the engine plan with these call costs (adaptive.Costs; None: this machine's,
        `costs()`) from the next step, as it does once the first adaptive request probed them.
        Call it while no request runs (benchmarks fix their arms' costs before timing). -> the
        costs."""
        costs = self.costs() if costs is None else costs
        self.scheduler.use_costs(costs)
        return costs

    @functools.cached_property
    def infill(self) -> InfillSampler:
        """llama.cpp's infill sampler over this bundle's vocabulary (built on first use, ~0.1 s)."""
        eos = self.manifest.tokenizer.eos_token_ids
        if not eos:
            raise InvalidRequest("the infill sampler ends a row on an end-of-text token; this bundle has none", "infill")
        table = pieces(self.tokenizer).table(self.manifest.target.vocab_size, special=False)
        return InfillSampler(table, frozenset(self.tokenizer.eog_ids), eos[0])

    def room(self, n_prompt: int) -> int:
        """Tokens the loaded context leaves after a prompt of n_prompt tokens (a server's default
        max_new_tokens); a prompt that leaves none raises ContextOverflow (param "prompt")."""
        if n_prompt >= self.max_seq_len:
            raise ContextOverflow(f"the prompt has {n_prompt} tokens and the context holds {self.max_seq_len}: "
                                  "shorten it", "prompt")
        return self.max_seq_len - n_prompt

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
        if o.text_prefix:
            matcher = TextPrefix(prefix_index(self.tokenizer, self.manifest.target.vocab_size), o.text_prefix)
        k = self.default_k if o.k is None else o.k
        self.check_request(len(prompt_ids), o.max_new_tokens, k)
        draft = o.draft or self.default_draft
        self._check_draft(draft)
        adaptive = self.default_adaptive if o.adaptive is None else o.adaptive
        eos = frozenset() if o.ignore_eos else frozenset(self.tokenizer.eog_ids)
        cfg = replace(o.sampling(), infill=self.infill) if o.infill else o.sampling()
        return Request(list(prompt_ids), cfg, o.max_new_tokens, eos, k=k if draft != "none" else 0,
                       draft=draft, adaptive=adaptive and draft != "none", seed=o.stream_seed(sibling), stats=stats,
                       timeout_s=o.timeout_s, penalties=pen if pen.active else None, logprobs=o.logprobs,
                       grammar=matcher, text_prefix=o.text_prefix)

    def stream_ids(self, prompt_ids: list[int], options: RequestOptions | None = None, **kw) -> Iterator[list[int]]:
        """Token-level generation: yields committed chunks of new token ids. Closing the
        iterator early cancels the request (its slot is free at the next step). kw: `request`'s."""
        return self.submit(self.request(prompt_ids, options, **kw))

    def submit(self, r: Request) -> Iterator[list[int]]:
        """Submit a checked request now (EngineBusy is raised here) and return an iterator of its
        token chunks; closing it early cancels the request and waits the step that takes."""
        events: queue.SimpleQueue = queue.SimpleQueue()
        r.sink = lambda kind, value: events.put((kind, value))
        self.engine.submit(r)
        return self._drain(r, events)

    def _drain(self, r: Request, events) -> Iterator[list[int]]:
        ev = Events(r)
        try:
            while (chunk := ev.take(*events.get())) is not END:
                if chunk is not None:
                    yield chunk
        finally:
            if not ev.finished:  # cancel, and wait the step it takes: the slot is free and the stats final
                self.engine.cancel(r)
                while events.get()[0] not in ("done", "error"):  # tokens, logprobs
                    pass

    def start(self, r: Request, stop=()) -> TextOutput:
        """Submit a checked request now and return its output as text (runtime/text/output.py):
        iterate it for pieces; stop strings (`stop`) end it."""
        return TextOutput(r, self.submit(r), self.tokenizer, stop, lambda: self.cancel(r))

    def cancel(self, r: Request) -> None:
        """Stop a submitted request from any thread, without waiting; its slot is free at the
        next step (a request that already finished ignores it)."""
        self.engine.cancel(r)

    def _text_request(self, prompt: str, options, chat: bool, stats: Stats | None, kw: dict):
        """(the checked Request, its stop strings)."""
        o = request_options(options, **kw)
        ids = self.tokenizer.encode(prompt, chat=chat)
        return self.request(ids, o, stats=stats or Stats()), o.stop

    def stream(self, prompt: str, options: RequestOptions | None = None, *, chat: bool = True,
               stats: Stats | None = None, **kw) -> Iterator[str]:
        """Yields text pieces as tokens are committed; the full Result is in `self.last` after
        (per thread). options / kw: as `request`'s. With stop strings, text that could be the
        start of one is held back until resolved."""
        out = self.start(*self._text_request(prompt, options, chat, stats, kw))
        try:
            yield from out
        finally:
            self._local.last = out.result()

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
        outs: list[TextOutput] = []
        try:  # all go in before any is read: the later ones wait for the first one's prefill
            for r in reqs:
                outs.append(self.start(r, o.stop))
            for out in outs:
                for _ in out:
                    pass
            return [out.result() for out in outs]
        finally:
            for out in outs:  # a choice not read to its end (an error) stops now
                out.close()

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
            while (chunk := ev.take(*await events.get())) is not END:
                if chunk is not None:
                    yield chunk
        finally:
            if not ev.finished:
                self.engine.cancel(r)
                while (await events.get())[0] not in ("done", "error"):
                    pass

    def astart(self, r: Request, stop=(), text=None) -> TextOutput:
        """As `start`, for asyncio: iterate it with `async for` (EngineBusy is raised here).
        text: a TextStream of the caller's (TextOutput)."""
        return TextOutput(r, self.asubmit(r), self.tokenizer, stop, lambda: self.cancel(r), text)

    async def astream(self, prompt: str, options: RequestOptions | None = None, *, chat: bool = True,
                      stats: Stats | None = None, result: list | None = None, **kw) -> AsyncIterator[str]:
        """As `stream`, for asyncio; `result` (a list) receives the Result at the end."""
        out = self.astart(*self._text_request(prompt, options, chat, stats, kw))
        try:
            async for piece in out:
                yield piece
        finally:
            await out.aclose()
            if result is not None:
                result.append(out.result())

    async def agenerate(self, prompt: str, options: RequestOptions | None = None, **kw) -> Result:
        out: list = []
        async for _ in self.astream(prompt, options, result=out, **kw):
            pass
        return out[0]

    # --- lifecycle ---------------------------------------------------------------------------
    def counters(self) -> dict:
        return self.engine.counters()

    def alive(self) -> bool:
        """Whether the engine can serve (not closed, its thread not dead with work waiting)."""
        return self.engine.alive()

    def held_prefixes(self) -> list[list[int]]:
        """The token ids each idle slot holds (what the prefix cache can reuse), for routers. Safe
        from any thread: a read that collides with the engine thread is tried again ([] if it
        keeps colliding)."""
        for _ in range(5):
            try:
                return [list(toks) for toks in self.scheduler.pool.idle().values()]
            except RuntimeError:  # dict changed size during iteration
                continue
        return []

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
