"""One step at a time over every running request (called from the engine thread only).

A step:
  1. retire cancelled requests (their slot is free for this step's admissions);
  2. admit waiting requests into free KV slots, in arrival order, each where the longest prefix
     of its prompt is already computed (runtime/engine/prefix.py: idle slots keep what finished
     requests held; running ones share their committed rows);
  3. prefill: the rest of each prompt, in chunks, oldest request first, up to one widest call's
     worth of tokens per step: a long prompt holds the others up by at most one chunk;
  4. decode: choose k per row (fixed, or the request's adaptive policy capped by the batch
     plan, runtime/engine/plan.py); run the draft calls, one-token calls of all drafting rows
     batched into one per draft step; one batched target call for the rows that do not draft
     and one verification call per drafting row; verify, commit and rewind per row; emit.
A row's failure (non-finite logits) ends that request alone. A step without drafting rows
is the batched target call and nothing else.

Invariants per decoding request (n = len(seq)): the target track holds seq[:n-1] (seq[-1] is
fed by the next call); draft tracks hold a prefix of seq (plus, mid-round, the proposals).
"""

from __future__ import annotations

import time

import numpy as np

from ..decoder import NonFiniteLogits
from ..drafters import DraftCall, Proposal
from ..logits import logprobs
from ..sampling import probs, sample
from ..verify import verify_greedy, verify_sampling
from .counters import Counters
from .plan import Row, plan
from .prefix import common_prefix, place
from .request import DECODE, DONE, PREFILL, Request
from .shaping import cut_to_grammar, shape


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


def _pick(r: Request, logits: np.ndarray) -> int:
    """The target's own next token from one row of its (processed) logits (greedy, or sampled
    with the request's random stream)."""
    return int(logits.argmax()) if r.cfg.greedy else sample(probs(logits, r.cfg), r.rng.random())


REPLAN_STEPS = 8  # steps a "no drafting" plan is kept while the row count stays the same
DEFER_MIN_TOKENS = 16  # a request waits for another's prefill only when they share at least this many tokens


def _check_finite(logits: np.ndarray, what: str):
    if not np.isfinite(logits.max()):  # max propagates NaN, so one reduction covers NaN and inf
        raise NonFiniteLogits(f"{what} produced non-finite logits (NaN/inf): the model or its export is broken")


class Scheduler:
    def __init__(self, target, draft=None, *, features=None, make_drafter=None, policies=None,
                 plan_batches: bool = True, prefix_cache: bool = True):
        """target/draft: pool models (runtime/backends/ort.py). features: [slots, S_max, H] target
        hidden states per slot (EAGLE drafts) or None. make_drafter(request) -> drafter | None;
        policies(request) -> {route: AdaptivePolicy}; plan_batches: cap adaptive rows' k with
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
        self.plan_batches = plan_batches
        self.costs = None  # adaptive.Costs, set by the engine before the first adaptive request
        self.running: list[Request] = []
        self.deferred: list[Request] = []  # waiting for a running prefill to share (`_await_prefill`)
        self.counters = Counters(target.max_t - 1)
        self.forget_plan()

    def forget_prefixes(self) -> None:
        """Empty every idle slot (what finished requests left for reuse). Call it while no
        request runs (benchmarks starting cold; an operator dropping the cache)."""
        for pool in self.pools:
            for slot in list(pool.idle()):
                pool.clear(slot)

    def forget_plan(self) -> None:
        self._idle_plan = [0, 0]  # [rows, steps left]: the last plan for this many rows drafted nothing

    # --- 1-2: retire, admit ------------------------------------------------------------------

    def _retire(self, r: Request, reason: str | None = None, error: Exception | None = None) -> None:
        if reason and not r.stats.stop_reason:
            r.stats.stop_reason = reason
        r.state = DONE
        if r.slot >= 0:
            # an error may have left rows half written or non-finite: nothing of it is kept
            keep = self.prefix_cache and error is None
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

    def admit(self, take_waiting) -> None:
        """take_waiting() -> the next waiting request or None (the engine's locked queue).
        Requests deferred at an earlier step (`_await_prefill`) are looked at first."""
        now = time.perf_counter()
        for r in [r for r in self.running if r.cancelled or r.expired(now)]:
            self._retire(r, "stop" if r.cancelled else "timeout")
        earlier = []
        for r in self.deferred:  # cancellation and timeouts are checked every step, slot or not
            if r.cancelled or r.expired(now):
                end_unstarted(r, "stop" if r.cancelled else "timeout")
            else:
                earlier.append(r)
        self.deferred = []
        try:
            while True:
                if earlier:
                    if not self.pool.free_slots:
                        break
                    r = earlier.pop(0)
                else:
                    # a deferred request keeps its place: newer ones get only the slots beyond one each
                    if self.pool.free_slots <= len(self.deferred):
                        break
                    r = take_waiting()
                    if r is None:
                        break
                    if r.cancelled or r.expired(now):
                        end_unstarted(r, "stop" if r.cancelled else "timeout")
                        continue
                if self._await_prefill(r):
                    self.deferred.append(r)
                else:
                    self._admit(r)
        finally:  # whatever happened, no deferred request is lost
            self.deferred = sorted(self.deferred + earlier, key=lambda r: r.t_submit)

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
        try:
            self._place(r)
            r.drafter = self.make_drafter(r)
            r.policies = self.policies(r) if r.adaptive and r.drafter is not None else {}
        except Exception as e:  # noqa: BLE001
            self._retire(r, "error", e)  # frees its slot, empty: nothing half copied is kept
            return
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

    # --- 3: prefill --------------------------------------------------------------------------
    def _prefill(self) -> None:
        """Prompt chunks, oldest request first, up to one widest call's worth of tokens per step
        (several short prompts may share the budget; each is its own call)."""
        budget = self.target.max_prefill_t
        for r in [r for r in self.running if r.state == PREFILL]:
            if budget <= 0:
                return
            budget -= self._prefill_chunk(r, budget)

    def _prefill_chunk(self, r: Request, budget: int) -> int:
        chunk = r.prompt[r.prefilled : r.prefilled + budget]
        try:
            row = self._target_call(r, chunk, keep=1)[-1]
            r.prefilled += len(chunk)
            if r.prefilled < len(r.prompt):
                return len(chunk)
            _check_finite(row, "target")
            first = _pick(r, shape(r, row[None])[0])
        except Exception as e:  # noqa: BLE001 - the request's own failure (a call, its grammar)
            self._retire(r, "error", e)
            return len(chunk)
        now = time.perf_counter()
        r.t_first = now
        r.stats.ttft_ms = 1000 * (now - r.t_submit)
        r.stats.prefill_ms = r.stats.ttft_ms - r.stats.queue_ms
        r.state = DECODE
        self.counters.prefill_tokens += len(r.prompt) - r.stats.cached_tokens
        self._emit(r, [first], row[None])
        return len(chunk)

    def _call(self, model, r: Request, tokens, hidden=None, keep=None) -> np.ndarray:
        """One sequence's call on `model` at its track's length in the request's slot; the
        target's calls record EAGLE features. -> logits view (valid until the next call)."""
        tokens = np.asarray(tokens, dtype=np.int64)
        pos = model.pool.reserve(model.track, r.slot, len(tokens))
        logits = model.run(r.slot, tokens, pos, hidden, keep)
        if model is self.target:
            if self.features is not None:
                self.features[r.slot, pos : pos + len(tokens)] = model.hidden
            self.counters.target_calls += 1
        else:
            self.counters.draft_calls += 1
        model.pool.advance(model.track, r.slot, len(tokens))
        return logits

    def _target_call(self, r: Request, tokens, keep=None) -> np.ndarray:
        return self._call(self.target, r, tokens, keep=keep)

    # --- 4: decode ---------------------------------------------------------------------------
    def _choose_ks(self, rows: list[Request]) -> list[int]:
        n = len(rows)
        if self._idle_plan[0] == n and self._idle_plan[1] > 0 and all(r.policies for r in rows):
            # the plan said "no drafting" for this many rows a few steps ago: a step under load
            # pays nothing for speculation until the row count changes or REPLAN_STEPS pass
            # (no route either: auto's n-gram lookup would scan the sequence for nothing)
            self._idle_plan[1] -= 1
            for r in rows:
                r.route = None
            return [0] * n
        ks, plan_rows = [], []
        for r in rows:
            k = 0
            if r.drafter is not None:
                r.route = route = r.drafter.route(r.seq)
                pol = r.policies.get(route)
                k = pol.choose_k() if pol is not None else r.k
                if pol is not None:
                    exp = pol.acc.expected()[: k + 1]
                    plan_rows.append((len(ks), Row(min(k, r.remaining - 1), exp, route == "ngram")))
            ks.append(max(0, min(k, r.remaining - 1)))
        if self.plan_batches and plan_rows and self.costs is not None and len(rows) > 1:
            # rows with a fixed k keep it; adaptive rows share the step's cost model
            capped = plan([row for _, row in plan_rows], self.costs)
            for (i, _), k in zip(plan_rows, capped, strict=True):
                ks[i] = min(ks[i], k)
            self._idle_plan = [n, REPLAN_STEPS] if not any(ks) else [0, 0]
        return ks

    def _decode(self, rows: list[Request]) -> None:
        ks = self._choose_ks(rows)
        t0 = time.perf_counter()
        proposals = self._draft([r for r, k in zip(rows, ks, strict=True) if k > 0],
                                {r.id: k for r, k in zip(rows, ks, strict=True)})
        t1 = time.perf_counter()
        rows = [r for r in rows if r.state == DECODE]  # a draft failure retired its request
        for r in [r for r in rows if r.id in proposals]:
            try:
                proposals[r.id] = cut_to_grammar(r, proposals[r.id])
            except Exception as e:  # noqa: BLE001 - the request's grammar failed: it ends alone
                self._retire(r, "error", e)
        rows = [r for r in rows if r.state == DECODE]
        plain = [r for r in rows if r.id not in proposals or not len(proposals[r.id].tokens)]
        drafting = [r for r in rows if r not in plain]
        c = self.counters
        c.steps += 1
        c.rows += len(rows)
        c.drafting_steps += bool(drafting)
        tokens = 0
        if plain:
            tokens += self._verify_plain(plain, 1000 * (t1 - t0) if drafting else 0.0)
        for r in drafting:
            tokens += self._verify_one(r, proposals[r.id], 1000 * (t1 - t0), single=len(rows) == 1)
        c.tokens += tokens

    def _draft(self, rows: list[Request], ks: dict[int, int]) -> dict[int, Proposal]:
        """Run every drafting row's proposal to the end; one-token calls of many rows go into
        one batched call per draft step."""
        done: dict[int, Proposal] = {}
        pending: dict[int, tuple[Request, DraftCall]] = {}
        for r in rows:
            pol = r.policies.get(r.route)
            try:
                out = r.drafter.start(r.seq, ks[r.id], r.cfg, r.rng, pol)
            except Exception as e:  # noqa: BLE001
                self._retire(r, "error", e)
                continue
            if isinstance(out, Proposal):
                done[r.id] = out
            else:
                pending[r.id] = (r, out)
        while pending:
            results = self._draft_calls(list(pending.values()))
            for (r, _), res in zip(list(pending.values()), results, strict=True):
                if isinstance(res, Exception):
                    del pending[r.id]
                    self._retire(r, "error", res)
                    continue
                try:
                    out = r.drafter.take(*res)
                except Exception as e:  # noqa: BLE001 - the drafter (or its grammar) failed: its request ends
                    del pending[r.id]
                    self._retire(r, "error", e)
                    continue
                if isinstance(out, Proposal):
                    del pending[r.id]
                    done[r.id] = out
                else:
                    pending[r.id] = (r, out)
        return done

    def _draft_calls(self, calls: list[tuple[Request, DraftCall]]) -> list:
        """-> per call (logits row [V], hidden row [H] | None) or the exception it raised."""
        model = self.draft
        out: list = [None] * len(calls)
        ones = [i for i, (_, c) in enumerate(calls) if len(c.tokens) == 1]
        if model.batch_rows and len(ones) > 1:
            rows = self._rows_call(model, [calls[i][0] for i in ones], [calls[i][1].tokens[0] for i in ones],
                                   [calls[i][1].hidden for i in ones])
            for i, res in zip(ones, rows, strict=True):
                out[i] = res
        for i, (r, c) in enumerate(calls):
            if out[i] is not None:
                continue
            try:
                reads_prompt = model.pool.length(model.track, r.slot) < len(r.prompt)
                t0 = time.perf_counter()
                logits = self._call(model, r, c.tokens, c.hidden, c.keep)
                if reads_prompt:  # the draft reads the prompt (after the first token is out)
                    ms = 1000 * (time.perf_counter() - t0)
                    r.stats.draft_prefill_ms += ms
                    r.stats.prefill_ms += ms
                out[i] = (logits[-1].copy(), model.hidden[-1].copy() if model.has_hidden_out else None)
            except Exception as e:  # noqa: BLE001
                out[i] = e
        return out

    def _rows_call(self, model, reqs: list[Request], tokens, hidden=None) -> list:
        """One call of one token for each of `reqs` on `model`, over the smallest slot range
        that holds them; slots in the range that are not served write a filler token at their
        spare row. The target's calls record EAGLE features, as in `_call`.
        -> per request (logits row, hidden row | None)."""
        pool = model.pool
        by_slot = {r.slot: i for i, r in enumerate(reqs)}
        lo, hi = min(by_slot), max(by_slot) + 1
        toks = np.zeros(hi - lo, dtype=np.int64)
        pasts = np.empty(hi - lo, dtype=np.int64)
        feats = None
        if model.takes_hidden:
            feats = np.zeros((hi - lo, model.hidden_size), dtype=np.float32)
        for s in range(lo, hi):
            i = by_slot.get(s)
            if i is None:
                pasts[s - lo] = pool.spare_row(s)
            else:
                toks[s - lo] = tokens[i]
                pasts[s - lo] = pool.reserve(model.track, s, 1)
                if feats is not None and hidden[i] is not None:
                    feats[s - lo] = np.reshape(hidden[i], -1)
        logits = model.run_rows(lo, toks, pasts, feats)
        record = model is self.target and self.features is not None
        res = []
        for r in reqs:
            row = r.slot - lo
            if record:
                self.features[r.slot, pasts[row]] = model.hidden[row]
            model.pool.advance(model.track, r.slot, 1)
            # copies: the next call on this model reuses its logits buffer
            res.append((logits[row].copy(), model.hidden[row].copy() if model.has_hidden_out else None))
        if model is self.target:
            self.counters.target_calls += 1
        else:
            self.counters.draft_calls += 1
        return res

    def _verify_plain(self, rows: list[Request], draft_ms: float) -> int:
        """One batched target call: each row's last token -> its next token."""
        t0 = time.perf_counter()
        try:
            if len(rows) == 1 or not self.target.batch_rows:
                # copies: each call reuses the model's logits buffer
                results = [(self._target_call(r, r.seq[-1:])[-1].copy(), None) for r in rows]
            else:
                results = self._rows_call(self.target, rows, [r.seq[-1] for r in rows])
        except Exception as e:  # noqa: BLE001 - the call failed for all its rows
            for r in rows:
                self._retire(r, "error", e)
            return 0
        verify_ms = 1000 * (time.perf_counter() - t0)
        tokens = 0
        for r, (logits, _) in zip(rows, results, strict=True):
            try:
                _check_finite(logits, "target")
                nxt = _pick(r, shape(r, logits[None])[0])
            except Exception as e:  # noqa: BLE001 - non-finite logits, the request's grammar
                self._retire(r, "error", e)
                continue
            pol = r.policies.get(r.route)
            if pol is not None and len(self.running) == 1:
                pol.costs.observe(0, 0.0, verify_ms)
            tokens += self._commit(r, Proposal(np.empty(0, np.int64)), 0, nxt, draft_ms, verify_ms, logits[None])
        return tokens

    def _verify_one(self, r: Request, prop: Proposal, draft_ms: float, single: bool) -> int:
        draft = prop.tokens
        t0 = time.perf_counter()
        try:
            logits = self._target_call(r, np.concatenate(([r.seq[-1]], draft)))  # [k+1, V], one call
            _check_finite(logits, "target")
            target = shape(r, logits, draft)  # row i as a target-only step after draft[:i] would see it
        except Exception as e:  # noqa: BLE001
            self._retire(r, "error", e)
            return 0
        verify_ms = 1000 * (time.perf_counter() - t0)
        if r.cfg.greedy:
            n_ok, nxt = verify_greedy(draft, target)
        else:
            n_ok, nxt = verify_sampling(draft, prop.q, probs(target, r.cfg), r.rng.random(len(draft)), r.rng.random())
        pol = r.policies.get(prop.drafter if prop.drafter in r.policies else r.route)
        if pol is not None:  # costs only from a request running alone: batched times are the plan's
            pol.update(len(draft), n_ok, prop.confs, draft_ms if single else None, verify_ms if single else None)
        self.counters.record_draft(len(draft), n_ok)
        return self._commit(r, prop, n_ok, nxt, draft_ms, verify_ms, logits)

    def _commit(self, r: Request, prop: Proposal, n_ok: int, nxt: int, draft_ms: float, verify_ms: float,
                raw: np.ndarray) -> int:
        """Keep draft[:n_ok] + [nxt]; the target track goes back to n' - 1. raw: the target's
        rows of this round (row i: the position of new token i), for logprobs."""
        new = [int(t) for t in prop.tokens[:n_ok]] + [nxt]
        n_after = len(r.seq) + len(new)
        self.pool.rewind(self.target.track, r.slot, n_after - 1)
        if r.drafter is not None:
            r.drafter.commit(n_after)
        r.stats.draft_ms += draft_ms
        r.stats.verify_ms += verify_ms
        r.stats.record_round(len(prop.tokens), n_ok, prop.drafter if len(prop.tokens) else None)
        return self._emit(r, new, raw)

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
            try:
                new = self._grammar_commit(r, new)
            except Exception as e:  # noqa: BLE001 - the request's own grammar failed: it ends alone
                self._retire(r, "error", e)
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
        return new

    # --- the step ----------------------------------------------------------------------------
    def step(self, take_waiting=lambda: None) -> None:
        self.admit(take_waiting)
        self._prefill()
        rows = [r for r in self.running if r.state == DECODE and not r.cancelled]
        if rows:
            self._decode(rows)
