"""One step at a time over every running request (called from the engine thread only).

A step:
  1. retire cancelled requests (their slot is free for this step's admissions);
  2. admit waiting requests into free KV slots, in arrival order, each where the longest prefix
     of its prompt is already computed (runtime/engine/prefix.py: idle slots keep what finished
     requests held; running ones share their committed rows);
  3. decode: the speculation round over the decoding rows chooses k and proposes
     (runtime/engine/speculate.py `Round.start`);
  4. the step's batch (runtime/backends/batch.py), one `run_batch` on the target: every
     decoding row's [last, d0 .. dk-1], and the prompt chunks the batch's last call has room
     for (`PoolModel.room`), oldest request first, up to one widest call's worth of tokens: a
     long prompt holds the others up by at most one chunk a step. A packed target runs it as
     one call (as llama.cpp's server batches every slot's tokens); a model without packed
     calls splits it. When nothing decodes the chunks are the batch, and the requests whose
     prompts end there decode in the same step;
  5. settle and emit: the round verifies and commits each row from its rows of the batch
     (`Round.settle`); committed tokens go to each request's client, up to EOS, its length or
     its grammar's end; finished requests retire (their slot parked for prefix reuse).
A request's own failure ends that request alone (`speculate.alone`). A step without drafting
rows is the batched target call and nothing else.

Invariants per decoding request (n = len(seq)): the target track holds seq[:n-1] (seq[-1] is
fed by the next call); draft tracks hold a prefix of seq (plus, mid-round, the proposals).
"""

from __future__ import annotations

import time

import numpy as np

from ..backends.protocol import check_finite
from ..sampling.logits import logprobs
from ..sampling.processing import process
from .calls import Entry, ModelCalls
from .counters import Counters
from .prefix import common_prefix, place
from .request import DECODE, DONE, PREFILL, Request
from .speculate import Round, alone, pick


def send(r: Request, kind: str, value) -> None:
    """Hand an event to the request's client; a client that cannot take it (its event loop is
    gone) is cancelled, never an error of the engine's."""
    try:
        r.sink(kind, value)
    except Exception:  # noqa: BLE001
        r.cancelled = True


def end_unstarted(r: Request, reason: str) -> None:
    """End a request that never got a slot (cancelled, timed out, or the engine closed)."""
    r.stats.stop_reason = reason
    r.state = DONE
    r.stats.finish()
    send(r, "done", r.stats)


DEFER_MIN_TOKENS = 16  # a request waits for another's prefill only when they share at least this many tokens


class Scheduler:
    def __init__(self, target, draft=None, *, features=None, make_drafter=None, policies=None,
                 probe_costs=None, plan_batches: bool = True, prefix_cache: bool = True):
        """target/draft: pool models (runtime/backends/ort.py). features: [slots, S_max, H] target
        hidden states per slot (EAGLE drafts) or None. make_drafter(request) -> drafter | None;
        policies(request) -> {route: AdaptivePolicy}; probe_costs() -> adaptive.Costs, called once,
        before the first adaptive request that drafts is admitted (None: no batch plan until
        `costs` is set); plan_batches: cap adaptive rows' k with
        the batch plan (off: each request drafts as it would alone). prefix_cache: finished
        requests' slots keep their rows and new prompts reuse the longest prefix held anywhere
        (off: every prompt is computed from its first token)."""
        self.target, self.draft = target, draft
        self.pool = target.pool
        self.prefix_cache = prefix_cache
        # a separate draft's pool follows the target's slot for slot (same slot numbers)
        self.pools = [self.pool] + ([draft.pool] if draft is not None and draft.pool is not self.pool else [])
        self.features = features
        self.make_drafter = make_drafter or (lambda r: None)
        self.policies = policies or (lambda r: {})
        self.probe_costs = probe_costs
        self.costs = None  # adaptive.Costs: probed before the first adaptive request (`_costs_for`)
        self.running: list[Request] = []
        self.deferred: list[Request] = []  # waiting for a running prefill to share (`_await_prefill`)
        self.counters = Counters(target.max_t - 1)
        self.calls = ModelCalls(target, draft, features, self.counters)
        self.round = Round(self.calls, self.pool, target, self.counters, plan_batches)

    def forget_prefixes(self) -> None:
        """Empty every idle slot (what finished requests left for reuse). Call it while no
        request runs (benchmarks starting cold; an operator dropping the cache)."""
        for pool in self.pools:
            for slot in list(pool.idle()):
                pool.clear(slot)

    def forget_plan(self) -> None:
        """Drop the remembered "no drafting" plan (the next step plans afresh)."""
        self.round.planner.forget()

    # --- 1-2: retire, admit ------------------------------------------------------------------

    def _retire(self, r: Request, reason: str | None = None, error: Exception | None = None) -> None:
        if reason and not r.stats.stop_reason:
            r.stats.stop_reason = reason
        r.state = DONE
        if r.slot >= 0:
            # an error may have left rows half written or non-finite: nothing of it is kept
            keep = self.prefix_cache and error is None
            if keep and r.drafter is not None:
                r.drafter.release()  # what the draft's rows hold must be a prefix of r.seq
            for pool in self.pools:
                if keep:
                    pool.park(r.slot, r.seq)
                else:
                    pool.free(r.slot)
            r.slot = -1
        if r in self.running:
            self.running.remove(r)
        r.stats.decode_ms = 1000 * (time.perf_counter() - r.t_first) if r.t_first else 0.0
        r.stats.finish()
        self.counters.finished += 1
        if error is not None:
            send(r, "error", error)
        else:
            send(r, "done", r.stats)

    def _fail(self, r: Request, error: Exception) -> None:
        """End a request by its own failure (`speculate.alone`)."""
        self._retire(r, "error", error)

    def fail_running(self, error: Exception) -> None:
        """End every running request with `error` (a step raised: an engine bug, which must not
        hang its clients); a request that cannot even be retired leaves the running list."""
        for r in list(self.running):
            try:
                self._retire(r, "error", error)
            except Exception:  # noqa: BLE001
                self.running.remove(r)

    def admit(self, take_waiting) -> None:
        """take_waiting() -> the next waiting request or None (the engine's locked queue).
        Requests deferred at an earlier step (`_await_prefill`) are looked at first."""
        now = time.perf_counter()
        for r in [r for r in self.running if r.cancelled or r.expired(now)]:
            self._retire(r, "stop" if r.cancelled else "timeout")
        earlier = [r for r in self.deferred if self._still_wanted(r, now)]  # checked every step, slot or not
        self.deferred = []
        try:
            while (r := self._next_to_admit(earlier, take_waiting, now)) is not None:
                if self._await_prefill(r):
                    self.deferred.append(r)
                else:
                    self._admit(r)
        finally:  # whatever happened, no deferred request is lost
            self.deferred = sorted(self.deferred + earlier, key=lambda r: r.t_submit)

    @staticmethod
    def _still_wanted(r: Request, now: float) -> bool:
        """A request not yet in a slot: False (and ended) once cancelled or timed out."""
        if r.cancelled or r.expired(now):
            end_unstarted(r, "stop" if r.cancelled else "timeout")
            return False
        return True

    def _next_to_admit(self, earlier: list[Request], take_waiting, now: float) -> Request | None:
        """The next request to place while slots are free: earlier-deferred ones first; a
        deferred request keeps its place, so newer ones get only the slots beyond one each."""
        if earlier:
            return earlier.pop(0) if self.pool.free_slots else None
        while self.pool.free_slots > len(self.deferred):
            r = take_waiting()
            if r is not None and not r.cancelled:
                self._costs_for(r)
            if r is None or self._still_wanted(r, now):
                return r
        return None

    def _costs_for(self, r: Request) -> None:
        """Probe the call costs once, for the first adaptive request that drafts (unless the
        load probed them: `probe_now`); a failed probe means fixed k for that request, never a
        failed request."""
        if r.adaptive and r.draft != "none" and self.costs is None and self.probe_costs is not None \
                and not self.probe_now():
            r.adaptive = False

    def use_costs(self, costs) -> None:
        """Plan with these call costs (adaptive.Costs) from the next step; call it while no
        request runs."""
        self.costs = costs

    def probe_now(self) -> bool:
        """Take the call costs now (the cached probe, or measured) unless they are known; call it
        while no request runs (a pipeline does at load). -> whether costs are known."""
        if self.costs is None and self.probe_costs is not None:
            try:
                self.costs = self.probe_costs()
            except Exception:  # noqa: BLE001 - a cost estimate never fails a load or a request
                return False
        return self.costs is not None

    def _await_prefill(self, r: Request) -> bool:
        """Whether `r` should wait for a request still reading a prompt that shares a longer prefix
        with `r`'s than any slot holds now: once that prefill is done `r` copies its rows instead
        of computing them again (sibling choices of one prompt, a burst of requests with one
        system prompt). Waiting costs little: prompt chunks share one token budget per step,
        oldest first, so `r`'s own chunks would mostly have queued behind that prefill anyway."""
        if not self.prefix_cache or not self.pool.can_copy:
            return False
        limit = len(r.prompt) - 1
        ahead = max((min(common_prefix(r.prompt, q.prompt), limit) for q in self.running if q.state == PREFILL),
                    default=0)
        if ahead < DEFER_MIN_TOKENS:
            return False
        now = place(r.prompt, self.pool, self._held_by_running())
        return now is not None and ahead > now.reuse

    def _held_by_running(self) -> dict[int, list[int]]:
        """Running requests' slot -> the token ids of their committed target rows."""
        tt = self.target.track
        return {q.slot: q.seq[: self.pool.length(tt, q.slot)] for q in self.running}

    def _admit(self, r: Request) -> None:
        """Place `r` and make its drafter; a request that cannot start (a copy that failed, a
        drafter that cannot be made) fails alone, its slot given back empty."""
        r.state = PREFILL
        r.stats.queue_ms = 1000 * (time.perf_counter() - r.t_submit)
        with alone(self._fail, r):  # frees its slot, empty: nothing half copied is kept
            self._place(r)
            r.drafter = self.make_drafter(r)
            r.policies = self.policies(r) if r.adaptive and r.drafter is not None else {}
            self.running.append(r)

    def _place(self, r: Request) -> None:
        """Give `r` a slot holding the longest computed prefix of its prompt (runtime/engine/prefix.py)."""
        pl = place(r.prompt, self.pool, self._held_by_running(), self.prefix_cache)
        try:
            for pool in self.pools:
                # an EAGLE head re-feeds the target's features of every committed token from its
                # first round (its rows pair each position with the next token): only features move
                own = self.features is not None and pool is not self.pool
                pool.assign(pl.slot, 0 if own else pl.reuse, pl.source)
            if self.features is not None and pl.source is not None:
                self.features[pl.slot, : pl.reuse] = self.features[pl.source, : pl.reuse]
        except BaseException:  # a failed copy: every pool gives the slot back, empty
            for pool in self.pools:
                if pl.slot in pool.in_use():
                    pool.free(pl.slot)
            raise
        r.slot = pl.slot
        r.prefilled = r.stats.cached_tokens = self.pool.length(self.target.track, pl.slot)
        if self.prefix_cache:
            self.counters.prefix_cache_queries += len(r.prompt)
            self.counters.prefix_cache_hits += r.prefilled

    # --- 4: the step's batch ----------------------------------------------------------------
    def _chunks(self, lanes: int, tokens: int) -> list[tuple[Request, list[int]]]:
        """This step's prompt chunks: oldest request first, at most `lanes` of them and one
        widest call's worth of tokens (and at most `tokens`): a long prompt holds the others up
        by at most one chunk a step."""
        budget, out = min(self.target.max_prefill_t, tokens), []
        for r in self.running:
            if budget <= 0 or len(out) == lanes:
                break
            if r.state == PREFILL:
                out.append((r, r.prompt[r.prefilled : r.prefilled + budget]))
                budget -= len(out[-1][1])
        return out

    def _to_read(self) -> int:
        """Prompt tokens this step reads: one widest call's worth at most."""
        left = sum(len(r.prompt) - r.prefilled for r in self.running if r.state == PREFILL)
        return min(left, self.target.max_prefill_t)

    def _run_batch(self, rows: list[Entry]) -> list:
        """One batch on the target: the decoding rows' entries, then the prompt chunks its last
        call has room for (each read: `_read`). -> the rows' results (calls.Rows or error)."""
        lanes, tokens = self.target.room([len(x.tokens) for x in rows])
        chunks = self._chunks(lanes, tokens)
        results = self.calls.batch(self.target, rows + [Entry(r, c, 1) for r, c in chunks]) if rows or chunks else []
        for (r, c), res in zip(chunks, results[len(rows) :], strict=True):
            if isinstance(res, Exception):
                self._fail(r, res)
            else:
                self._read(r, len(c), res.logits[-1])
        return results[: len(rows)]

    def _read(self, r: Request, n: int, row: np.ndarray) -> None:
        """`r` read n more prompt tokens; row: the logits of the last. After the prompt's last
        chunk the request picks its first token (sent) and decodes from the next step."""
        first = None
        with alone(self._fail, r):
            r.prefilled += n
            if r.prefilled == len(r.prompt):
                check_finite(row)
                first = pick(r, process(r, row[None])[0])
        if first is None:  # more chunks to come, or the request failed
            return
        now = time.perf_counter()
        r.t_first = now
        r.stats.ttft_ms = 1000 * (now - r.t_submit)
        r.stats.prefill_ms = r.stats.ttft_ms - r.stats.queue_ms
        r.state = DECODE
        self.counters.prefill_tokens += len(r.prompt) - r.stats.cached_tokens
        self._emit(r, [first], row[None])

    def _emit(self, r: Request, new: list[int], raw: np.ndarray) -> int:
        """Send committed tokens up to EOS / max_new_tokens (with their logprobs, from the raw
        rows they were chosen from, when asked: sent just before the tokens); retire the request
        when it is done."""
        for i, t in enumerate(new):
            if t in r.eos_ids:
                new, r.stats.stop_reason = new[:i], "eos"
                break
        new = new[: r.remaining]
        if r.grammar is not None:
            with alone(self._fail, r):
                new = self._grammar_commit(r, new)
            if r.state == DONE:
                return 0
        r.seq.extend(new)
        r.produced += len(new)
        r.stats.new_tokens = r.produced
        if new and r.logprobs is not None:
            send(r, "logprobs", logprobs(raw[: len(new)], new, r.logprobs))
        if new:
            send(r, "tokens", new)
        if r.stats.stop_reason == "eos":
            self._retire(r)
        elif r.remaining <= 0:
            self._retire(r, "length")
        return len(new)

    @staticmethod
    def _grammar_commit(r: Request, new: list[int]) -> list[int]:
        """Advance the request's grammar over `new`, token by token; a grammar that completes
        ends the output there (stop_reason eos: only EOS could follow), as target-only decoding
        would. -> the tokens kept."""
        for i, t in enumerate(new):
            r.grammar.commit([t])
            if r.grammar.done:
                r.stats.stop_reason = "eos"
                return new[: i + 1]
        if r.grammar.spent:  # e.g. a text prefix written: nothing left to constrain
            r.grammar = None
        return new

    # --- the step ----------------------------------------------------------------------------
    def step(self, take_waiting=lambda: None) -> None:
        self.admit(take_waiting)
        if not self._decoding():  # only prompt chunks: the batch is theirs
            self._run_batch([])
        rows = self._decoding()
        if not rows:
            return
        planned = self.round.start(rows, self.costs, len(self.running), self._to_read())
        results = self._run_batch([Entry(r, self.round.tokens(r, p)) for r, p in planned])
        for o in self.round.settle(planned, results):
            if o.error is not None:
                self._fail(o.r, o.error)
            else:
                self.counters.tokens += self._emit(o.r, o.tokens, o.raw)

    def _decoding(self) -> list[Request]:
        return [r for r in self.running if r.state == DECODE and not r.cancelled]
