"""One speculation round over a step's decoding rows: choose k -> propose -> verify -> commit.

    ks        = choose_ks(rows)       per row 0 (no draft) .. its k, capped by the batch plan
                                      (runtime/policy/plan.py `Planner`)
    proposals = propose(rows, ks)     drafters run; their one-token calls batched across rows
    rows that do not draft:           one batched target call; next = the target's own pick
    rows that draft d[0..k):          one target call of [last, d0 .. dk-1] each -> k+1 rows;
                                      verify -> (n_ok, next)
    commit                            keep d[:n_ok] + [next]; the target's track rewinds to
                                      n' - 1 (a pointer move: the rows past it are stale and the
                                      next call overwrites them); the drafter follows

Exactness: each target row is processed (penalties, grammar: runtime/sampling/processing.py) as a
target-only step at that position would be, and verification keeps exactly what target-only
decoding produces (greedy and seeded sampling: the same tokens). The draft only decides how
many tokens one target call yields.

The round returns one `Outcome` per row — the tokens it committed (and the target rows they came
from), or the error that ended it — and the scheduler emits and retires; nothing here calls back
into the scheduler. A request's own failure (a call of its own, its grammar, its drafter,
non-finite logits) ends that request alone (`alone`); a failed batched call ends the requests it
served.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from ..backends.protocol import check_finite
from ..drafters import Proposal
from ..policy.plan import Planner
from ..sampling.draws import probs
from ..sampling.processing import process
from ..sampling.verify import verify_greedy, verify_sampling
from .calls import ModelCalls
from .counters import Counters
from .request import Request

NO_DRAFT = Proposal(np.empty(0, np.int64))


@contextmanager
def alone(fail, r: Request):
    """Run a request's own work; its failure ends that request (fail(r, e)), never the step.
    Callers check whether `r` failed after the block."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 - the request's own failure
        fail(r, e)


@dataclass
class Outcome:
    """One row's result of a round: the tokens it committed (d[:n_ok] + [next]) with the target's
    raw rows they were chosen from (row i: new token i; for logprobs), or the error that ended
    the request (then no tokens)."""

    r: Request
    tokens: list[int]
    raw: np.ndarray | None = None
    error: Exception | None = None


def pick(r: Request, row: np.ndarray) -> int:
    """The target's own next token from one processed logits row [V] (the position after
    r.seq): greedy, or sampled with the request's draws."""
    return int(row.argmax()) if r.cfg.greedy else r.rng.pick(probs(row, r.cfg), len(r.seq))


def verify(r: Request, prop: Proposal, rows: np.ndarray) -> tuple[int, int]:
    """rows [k+1, V]: the target's processed rows for [last, d0 .. dk-1]. -> (n_ok, next).
    Greedy: keep proposals while they are the row's argmax. Coupled sampling: the same over
    p / E (runtime/sampling/draws.py `Draws`): each row's token is the one target-only sampling with
    this seed picks there, so the output is target-only's, token for token. Otherwise exact
    rejection sampling against the draft's q."""
    if r.cfg.greedy:
        return verify_greedy(prop.tokens, rows)
    p = probs(rows, r.cfg)
    if r.rng.coupled:
        return verify_greedy(prop.tokens, r.rng.scores(p, len(r.seq)))
    k = len(prop.tokens)
    return verify_sampling(prop.tokens, prop.q, p, r.rng.random(k), r.rng.random())


class Round:
    def __init__(self, calls: ModelCalls, pool, target, counters: Counters, plan_batches: bool = True):
        """plan_batches: cap adaptive rows' k with the batch plan (off: each drafts as alone)."""
        self.calls, self.pool, self.target, self.counters = calls, pool, target, counters
        self.planner = Planner(plan_batches)
        self.outcomes: list[Outcome] = []  # this round's, in the order they happened
        self.failed: set[int] = set()  # ids of this round's requests that failed
        self.read: list[tuple[Request, int, np.ndarray]] = []  # prompt chunks that rode in its call

    def fail(self, r: Request, e: Exception) -> None:
        self.outcomes.append(Outcome(r, [], error=e))
        self.failed.add(r.id)

    def run(self, rows: list[Request], costs, running: int, ride=None, reading: int = 0) -> list[Outcome]:
        """One round for every decoding row -> one Outcome per row, in order of events.
        costs: adaptive.Costs (None: no batch plan); running: requests in the engine (costs are
        learned only from a request running alone: batched times are the plan's).
        ride(free lanes, free tokens) -> [(request, prompt chunk)]: on a packed target, chunks
        of prompts being read that go into the round's last call, as llama.cpp's server puts
        them into its one batch; each read chunk lands in `self.read` as (request, tokens,
        its last logits row), a failed one as its request's Outcome. reading: how many prompt
        tokens will ride (the batch plan prices the call with them)."""
        self.outcomes, self.failed, self.read = [], set(), []
        ks = self.planner.choose_ks(rows, costs, running, reading if ride is not None else 0)
        t0 = time.perf_counter()
        proposals = self.propose([r for r, k in zip(rows, ks, strict=True) if k > 0],
                                 {r.id: k for r, k in zip(rows, ks, strict=True)})
        draft_ms = 1000 * (time.perf_counter() - t0)
        rows = [r for r in rows if r.id not in self.failed]  # a draft failure ended its request
        drafting = [r for r in rows if len(proposals.get(r.id, NO_DRAFT).tokens)]
        plain = [r for r in rows if r not in drafting]
        c = self.counters
        c.steps += 1
        c.rows += len(rows)
        c.drafting_steps += bool(drafting)
        if self.target.packs:
            self.packed(rows, proposals, draft_ms if drafting else 0.0, running == 1, ride)
            return self.outcomes
        if plain:
            self.decode_plain(plain, draft_ms if drafting else 0.0, running == 1)
        for r in drafting:
            self.verify_drafted(r, proposals[r.id], draft_ms, alone_in_step=len(rows) == 1)
        return self.outcomes

    # --- propose -----------------------------------------------------------------------------
    def propose(self, rows: list[Request], ks: dict[int, int]) -> dict[int, Proposal]:
        """Run every drafting row's proposal to the end (cut to its grammar); the one-token draft
        calls of all rows go into one batched call per draft step."""
        done: dict[int, Proposal] = {}
        pending: dict[int, tuple] = {}
        for r in rows:
            with alone(self.fail, r):
                self._advance(r, r.drafter.start(r.seq, ks[r.id], r.cfg, r.rng, r.policies.get(r.route)),
                              done, pending)
        while pending:
            batch = list(pending.values())
            pending.clear()
            for (r, _), res in zip(batch, self.calls.drafts(batch), strict=True):
                with alone(self.fail, r):
                    if isinstance(res, Exception):
                        raise res
                    self._advance(r, r.drafter.take(*res), done, pending)
        return done

    @staticmethod
    def _advance(r: Request, out, done: dict, pending: dict) -> None:
        if isinstance(out, Proposal):
            # cut at its first token the grammar forbids (n-gram copies, or a draft that did not see the mask)
            free = r.grammar is None or not len(out.tokens)
            done[r.id] = out if free else out.cut(r.grammar.valid_prefix(out.tokens))
        else:
            pending[r.id] = (r, out)

    # --- verify + commit ---------------------------------------------------------------------
    def decode_plain(self, rows: list[Request], draft_ms: float, learn: bool) -> None:
        """Rows that do not draft: one batched target call, each row's last token -> its next."""
        t0 = time.perf_counter()
        try:
            if len(rows) == 1 or not self.target.batch_rows or self.target.min_t > 1:
                # copies: each call reuses the model's logits buffer
                results = [(self.calls.one(self.target, r, r.seq[-1:])[-1].copy(), None) for r in rows]
            else:
                results = self.calls.rows(self.target, rows, [r.seq[-1] for r in rows])
        except Exception as e:  # noqa: BLE001 - the call failed for all its rows
            for r in rows:
                self.fail(r, e)
            return
        verify_ms = 1000 * (time.perf_counter() - t0)
        for r, (logits, _) in zip(rows, results, strict=True):
            self.finish_plain(r, logits[None], draft_ms, verify_ms, learn)

    def finish_plain(self, r: Request, raw: np.ndarray, draft_ms: float, verify_ms: float, learn: bool) -> None:
        """A plain row's target row [1, V] -> its next token, committed."""
        with alone(self.fail, r):
            check_finite(raw)
            nxt = pick(r, process(r, raw)[0])
        if r.id in self.failed:
            return
        pol = r.policies.get(r.route)
        if pol is not None and learn:
            pol.costs.observe(0, 0.0, verify_ms, context=len(r.seq))
        self.commit(r, NO_DRAFT, 0, nxt, draft_ms, verify_ms, raw)

    def packed(self, rows: list[Request], proposals: dict[int, Proposal], draft_ms: float, learn: bool,
               ride=None) -> None:
        """Every row's tokens in one packed target call (runtime/backends/packed.py; calls of
        `lanes` rows at most): [last] for a plain row, [last, d0 .. dk-1] for a drafting one;
        each row then verifies and commits from its own rows of the call. The last call also
        carries the prompt chunks `ride` hands it (`run`)."""
        lanes = self.target.lanes
        for a in range(0, len(rows), lanes):
            group = rows[a : a + lanes]
            props = [proposals.get(r.id, NO_DRAFT) for r in group]
            entries = [(r, np.concatenate(([r.seq[-1]], p.tokens))) for r, p in zip(group, props, strict=True)]
            last = a + lanes >= len(rows)  # the call with free lanes, if any
            extra = ride(lanes - len(group), self.target.max_tokens - sum(len(t) for _, t in entries)) \
                if last and ride is not None else []
            t0 = time.perf_counter()
            try:
                raws = self.calls.packed(self.target, entries + [(r, c, 1) for r, c in extra])
            except Exception as e:  # noqa: BLE001 - the call failed: whose row was it?
                self._each_alone(entries, props, extra, e, draft_ms, len(rows) == 1, learn)
                continue
            verify_ms = 1000 * (time.perf_counter() - t0)
            for (r, c), raw in zip(extra, raws[len(group) :], strict=True):
                self.read.append((r, len(c), raw[-1].copy()))  # the buffer is the next call's
            for r, p, raw in zip(group, props, raws, strict=False):
                self._finish(r, p, raw, draft_ms, verify_ms, len(rows) == 1, learn)

    def _each_alone(self, entries: list[tuple[Request, np.ndarray]], props: list[Proposal], extra: list,
                    error: Exception, draft_ms: float, alone_in_step: bool, learn: bool) -> None:
        """After a failed packed call of rows `entries` (request, tokens) and prompt chunks `extra`:
        each again in a call of its own (the same bits: rows do not depend on the call), so a
        failure ends only the request whose call fails alone."""
        if len(entries) + len(extra) == 1:
            self.fail((entries or extra)[0][0], error)
            return
        for (r, tokens), p in zip(entries, props, strict=True):
            t0 = time.perf_counter()
            with alone(self.fail, r):
                raw = self.calls.packed(self.target, [(r, tokens)])[0]
            if r.id not in self.failed:
                self._finish(r, p, raw, draft_ms, 1000 * (time.perf_counter() - t0), alone_in_step, learn)
        for r, c in extra:
            with alone(self.fail, r):
                self.read.append((r, len(c), self.calls.packed(self.target, [(r, c, 1)])[0][-1].copy()))

    def _finish(self, r: Request, p: Proposal, raw: np.ndarray, draft_ms: float, verify_ms: float,
                alone_in_step: bool, learn: bool) -> None:
        """A row's own rows of a packed call -> its verification (drafting) or its next token
        (plain), committed. draft_ms: the step's draft time (0 when no row drafted)."""
        if len(p.tokens):
            self.finish_drafted(r, p, raw, draft_ms, verify_ms, alone_in_step)
        else:
            self.finish_plain(r, raw, draft_ms, verify_ms, learn)

    def verify_drafted(self, r: Request, prop: Proposal, draft_ms: float, alone_in_step: bool) -> None:
        """One target call over [last, d0 .. dk-1], verification, commit."""
        t0 = time.perf_counter()
        with alone(self.fail, r):
            raw = self.calls.one(self.target, r, np.concatenate(([r.seq[-1]], prop.tokens)))  # [k+1, V]
        if r.id in self.failed:
            return
        self.finish_drafted(r, prop, raw, draft_ms, 1000 * (time.perf_counter() - t0), alone_in_step)

    def finish_drafted(self, r: Request, prop: Proposal, raw: np.ndarray, draft_ms: float, verify_ms: float,
                       alone_in_step: bool) -> None:
        """A drafting row's target rows [k+1, V] -> verification, its policy's update, commit."""
        with alone(self.fail, r):
            check_finite(raw)
            n_ok, nxt = verify(r, prop, process(r, raw, prop.tokens))  # row i as if after d[:i]
        if r.id in self.failed:
            return
        pol = r.policies.get(prop.drafter if prop.drafter in r.policies else r.route)
        if pol is not None:
            pol.update(len(prop.tokens), n_ok, prop.confs, draft_ms if alone_in_step else None,
                       verify_ms if alone_in_step else None)
        self.counters.record_draft(len(prop.tokens), n_ok)
        self.commit(r, prop, n_ok, nxt, draft_ms, verify_ms, raw)

    def commit(self, r: Request, prop: Proposal, n_ok: int, nxt: int, draft_ms: float, verify_ms: float,
               raw: np.ndarray) -> None:
        """Keep d[:n_ok] + [next]; the target track goes back to n' - 1 (seq[-1] is fed by the
        next call); the tokens go out as the row's Outcome (the scheduler emits them). raw: the
        target's rows of this round (row i: the position of new token i), for logprobs."""
        new = [int(t) for t in prop.tokens[:n_ok]] + [nxt]
        n_after = len(r.seq) + len(new)
        self.pool.rewind(self.target.track, r.slot, n_after - 1)
        if r.drafter is not None:
            r.drafter.commit(n_after)
        r.rng.forget(n_after)
        r.stats.draft_ms += draft_ms
        r.stats.verify_ms += verify_ms
        r.stats.record_round(len(prop.tokens), n_ok, prop.drafter if len(prop.tokens) else None)
        # raw is a view of the target's output buffer, which the round's next call overwrites:
        # the rows logprobs read are copied (only when asked for)
        self.outcomes.append(Outcome(r, new, raw[: len(new)].copy() if r.logprobs is not None else None))
