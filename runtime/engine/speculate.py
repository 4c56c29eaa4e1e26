"""One speculation round over a step's decoding rows: choose k -> propose -> verify -> commit.

    ks        = choose_ks(rows)       per row 0 (no draft) .. its k, capped by the batch plan
                                      (runtime/policy/plan.py `Planner`)
    proposals = propose(rows, ks)     drafters run; each draft step's calls in one batch
    the step's batch                  (built by the scheduler) holds per row [last] (a plain row)
                                      or [last, d0 .. dk-1] (a drafting one) -> 1 or k+1 rows
    settle                            plain: next = the target's own pick; drafting: verify ->
                                      (n_ok, next); commit keeps d[:n_ok] + [next]; the target's
                                      track rewinds to n' - 1 (a pointer move: the rows past it
                                      are stale and the next call overwrites them); the drafter
                                      follows

Exactness: each target row is processed (penalties, grammar: runtime/sampling/processing.py) as a
target-only step at that position would be, and verification keeps exactly what target-only
decoding produces (greedy and seeded sampling: the same tokens). The draft only decides how
many tokens one target call yields.

The round returns one `Outcome` per row — the tokens it committed (and the target rows they came
from), or the error that ended it — and the scheduler emits and retires; nothing here calls back
into the scheduler. A request's own failure (its call, its grammar, its drafter, non-finite
logits) ends that request alone (`alone`).
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
        self.draft_ms = 0.0  # this round's draft time (0 when no row drafted)
        self.learn = False  # a request running alone: its plain rows teach its policy their cost

    def fail(self, r: Request, e: Exception) -> None:
        self.outcomes.append(Outcome(r, [], error=e))
        self.failed.add(r.id)

    def start(self, rows: list[Request], costs, running: int, reading: int = 0) -> list[tuple[Request, Proposal]]:
        """Choose k and propose for every decoding row -> each row still running with its
        proposal (NO_DRAFT: a plain row), whose target tokens are `tokens(r, p)`.
        costs: adaptive.Costs (None: no batch plan); running: requests in the engine (costs are
        learned only from a request running alone: batched times are the plan's). reading:
        prompt tokens that ride in the step's batch (the batch plan prices the call with them)."""
        self.outcomes, self.failed = [], set()
        ks, routes = self.planner.choose_ks(rows, costs, running, reading)
        for r, route in zip(rows, routes, strict=True):
            r.route = route  # the engine's record of the step's sub-drafter (its policy learns from it)
        t0 = time.perf_counter()
        proposals = self.propose([r for r, k in zip(rows, ks, strict=True) if k > 0],
                                 {r.id: k for r, k in zip(rows, ks, strict=True)})
        planned = [(r, proposals.get(r.id, NO_DRAFT)) for r in rows if r.id not in self.failed]
        drafting = any(len(p.tokens) for _, p in planned)
        self.draft_ms = 1000 * (time.perf_counter() - t0) if drafting else 0.0
        self.learn = running == 1
        c = self.counters
        c.steps += 1
        c.rows += len(planned)
        c.drafting_steps += drafting
        return planned

    @staticmethod
    def tokens(r: Request, p: Proposal) -> np.ndarray:
        """A row's target tokens: [last] + its proposal, int64 [k+1]."""
        return np.concatenate(([r.seq[-1]], p.tokens)).astype(np.int64)

    def settle(self, planned: list[tuple[Request, Proposal]], results: list) -> list[Outcome]:
        """Each row's part of the step's batch (calls.Rows [k+1 or 1 rows], or the error of its
        call) -> its verification (drafting) or its next token (plain), committed. -> one
        Outcome per row, in order of events."""
        for (r, p), res in zip(planned, results, strict=True):
            if isinstance(res, Exception):
                self.fail(r, res)
            elif len(p.tokens):
                self.finish_drafted(r, p, res.logits, self.draft_ms, res.ms, len(planned) == 1)
            else:
                self.finish_plain(r, res.logits, self.draft_ms, res.ms, self.learn)
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
