"""Speculation under load: which requests draft this step, and how far.

A step runs one batched target call for the rows that do not draft (b rows x 1 token), one
verification call per drafting row (1 row x k+1 tokens: GroupQueryAttention takes several
tokens per row only at batch 1), and the drafting rows' draft calls batched across rows (draft
step j serves every row with k >= j). With measured call costs (`Costs`: target_ms per width,
rows_ms per batch, draft_rows_ms per batch) and each row's expected tokens E(k) from its
acceptance model, the plan maximizes committed tokens per ms of the step:

    time   = rows_ms(n - m) + sum_{r drafts} verify_ms(k_r + 1) + sum_j draft_rows_ms(#{r: k_r >= j})
    tokens = (n - m) + sum_{r drafts} E_r(k_r)

over a common ceiling on k and the number m of drafting rows (those that gain most first).

Catching up: a separate draft reads the committed tokens it lacks before a row's first proposal
(its prompt, up to its window) and after plain rounds. That reading is paid once and serves the
row's remaining tokens, so each step charges a drafting row its share: read_ms(lag) / remaining
per token the step expects to commit. Alone, a row's policy prices the same reading against its
own savings (runtime/policy/adaptive.py); under load the savings per token are a few percent of a
step, and charging nothing made 8 coder requests read every prompt into the draft for a 2% gain
and lose 14% (docs/benchmarks.md §24). A round's own catching up (the one or two tokens
committed since its draft's last call: two after a round that kept every proposal) rides in
its first draft call, which is priced at that width in tokens (`Row.first`): at four coder
requests 4-8 tokens, 23-34 ms, the same for any k, so leaving it out favoured small k.
Alone (n = 1) this is the single-request rule, E(k) / (k c + v(k+1)). Under load a plain
batched row costs a fraction of a step while a verification call costs a whole one, so
drafting stops by itself (docs/design.md, "Speculation under load").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np

from ..drafters import Drafter
from .adaptive import ROUND_LAG, AdaptivePolicy, Costs


class Decoding(Protocol):
    """What the planner reads of a decoding request (runtime/engine/request.py `Request`); it
    writes nothing into it: the engine records the step's routes from the `Choice`."""

    drafter: Drafter | None
    seq: list[int]  # prompt + committed new tokens
    policies: dict[str, AdaptivePolicy]  # route -> its adaptive policy (none: fixed k)
    k: int  # fixed k, or the ceiling of an adaptive one

    @property
    def remaining(self) -> int: ...  # new tokens it may still produce


class Choice(NamedTuple):
    """One step's plan, per decoding row in order: k (0: a plain row) and the route, the
    sub-drafter chosen before k ("model" | "ngram"; None: the row does not draft this step)."""

    ks: list[int]
    routes: list[str | None]


@dataclass
class Row:
    k: int  # the most this row would draft (its own policy's choice)
    expected: np.ndarray  # E(j), j = 0..k: tokens a round with j proposals commits
    lookup: bool = False  # an n-gram proposal: no draft-model calls
    context: int | None = None  # the row's length: its calls attend over it (None: the probe's)
    read_per_token: float = 0.0  # a separate draft's catching up (ms) over the tokens the row has left
    first: int = 1  # tokens its first draft call reads: the committed tokens the draft lacks, 1 or 2


def step_ms(rows: list[Row], ks: list[int], costs: Costs, reading: int = 0) -> float:
    """The time model of one step (the docstring's formula), for one choice of k per row.
    reading: prompt tokens that ride in a packed step's call."""
    if costs.packed:
        ms = float(costs.call_ms(reading + sum(k + 1 for k in ks)))
        ms += sum(costs.scale * costs.extra_ms(k + 1, r.context) for r, k in zip(rows, ks, strict=True))
    else:
        plain = [r.context for r, k in zip(rows, ks, strict=True) if k == 0]
        ms = costs.target_rows_ms(len(plain), plain) if plain else 0.0
        ms += sum(costs.verify_ms(k + 1, r.context) for r, k in zip(rows, ks, strict=True) if k > 0)
    for j in range(1, max(ks, default=0) + 1):
        at = [r for r, k in zip(rows, ks, strict=True) if k >= j and not r.lookup]
        if at:
            width = sum(r.first for r in at) if j == 1 else len(at)
            ms += costs.draft_step_ms(width, [r.context for r in at])
    return ms


def plan(rows: list[Row], costs: Costs, reading: int = 0) -> list[int]:
    """k per row (0 = a plain row of the batched call) maximizing tokens per ms. Every (ceiling
    c, drafting rows m) pair at once, in arrays of [c, m, j] (<= 16^3 for 16 rows): a step's plan
    costs tens of microseconds, not a Python search that grew with rows^2 * k^2. reading: prompt
    tokens that ride in a packed step's call (runtime/engine/scheduler.py): the call is wider
    whatever the rows do, so a choice is worth its tokens less the time it takes at the rate a
    step without the chunk reaches (draft tokens priced where the wider call's cost curve is)."""
    n = len(rows)
    K = max((r.k for r in rows), default=0)
    if n == 0 or K == 0:
        return [0] * n
    caps = np.arange(1, K + 1)  # [C]
    k_row = np.array([r.k for r in rows])  # [n]
    E = np.ones((n, K + 1))
    for i, r in enumerate(rows):
        e = np.asarray(r.expected, dtype=float)[: r.k + 1]
        E[i, : len(e)] = e
        E[i, len(e):] = e[-1]
    ks = np.minimum(k_row[None, :], caps[:, None])  # [C, n]
    exp = E[np.arange(n)[None, :], ks]  # [C, n]
    gain = np.where(ks > 0, exp - 1.0, -np.inf)
    order = np.argsort(-gain, axis=1, kind="stable")  # rows that gain most first
    ks_s = np.take_along_axis(ks, order, 1)
    exp_s = np.take_along_axis(exp, order, 1)
    valid = np.take_along_axis(gain, order, 1) > -np.inf  # [C, m]
    model = np.array([not r.lookup for r in rows])[order]  # [C, m]
    # each row's verification curve at its own length; what attention adds to a plain row and to
    # each draft step of a drafting row, at their lengths
    v = np.array([costs.verify_curve(K + 1, r.context) for r in rows])[order]  # [C, m, K + 1]: verify_ms(k + 1) at k
    plain_extra = np.array([costs.scale * costs.extra_ms(1, r.context) for r in rows])
    draft_extra = np.array([0.0 if r.lookup else costs.draft_extra_ms(r.context) for r in rows])
    first = np.array([r.first for r in rows])[order]  # [C, m]
    d_ms = np.array([0.0] + [costs.draft_step_ms(b) for b in range(1, int(first.sum(axis=1).max()) + 1)])
    m = np.arange(1, n + 1)  # drafting rows
    js = np.arange(1, K + 1)
    reads = np.where(js == 1, first[:, :, None], 1)  # tokens a row adds to step j's call: step 1 its catching up
    depth = np.cumsum(((ks_s[:, :, None] >= js) & model[:, :, None]) * reads, axis=1)  # [C, m, j] step j's width
    verify = np.take_along_axis(v, ks_s[:, :, None], 2)[:, :, 0]  # [C, m]
    attention = plain_extra.sum() - np.cumsum(plain_extra[order], axis=1) + np.cumsum(ks_s * draft_extra[order], axis=1)
    read = np.cumsum(exp_s * np.array([r.read_per_token for r in rows])[order], axis=1)
    tokens = (n - m)[None, :] + np.cumsum(exp_s, axis=1)
    if costs.packed:  # one call of n + sum(k) tokens; a drafting row's own attention share on top
        v_extra = np.cumsum(verify - costs.verify_curve(K + 1)[ks_s], axis=1)
        drafts = d_ms[depth].sum(axis=2) + attention + v_extra + read

        def times(chunk: int):  # (every row plain, each choice) with `chunk` prompt tokens riding
            return (float(costs.call_ms(n + chunk)) + plain_extra.sum(),
                    costs.call_ms(n + chunk + np.cumsum(ks_s, axis=1)) + drafts)

        plain_t, t = times(0)
    else:
        r_ms = np.array([0.0] + [costs.target_rows_ms(b) for b in range(1, n + 1)])
        plain_t = r_ms[n] + plain_extra.sum()  # every row plain: target_rows_ms(n, contexts)
        t = r_ms[n - m][None, :] + np.cumsum(verify, axis=1) + d_ms[depth].sum(axis=2) + attention + read
    rate = np.where(valid, tokens / t, -np.inf)
    if costs.packed and reading:
        # a prompt chunk rides in the call: what each choice adds to the step must earn what a
        # step without it earns at its best (the chunk's cost is the same for every choice)
        best = max(n / plain_t, float(rate.max()))
        plain_t, t = times(reading)
        rate = np.where(valid, tokens - best * t, -np.inf)
        plain_all = n - best * plain_t
    else:
        plain_all = n / plain_t
    c, mm = np.unravel_index(int(np.argmax(rate)), rate.shape)
    if rate[c, mm] <= plain_all:
        return [0] * n
    out = [0] * n
    for i in order[c, : mm + 1]:
        out[int(i)] = int(ks[c, i])
    return out


REPLAN_STEPS = 8  # steps a "no drafting" plan is kept while the row count stays the same


@dataclass
class IdlePlan:
    rows: int = 0  # the row count the last plan drafted nothing for
    steps_left: int = 0


class Planner:
    """k per decoding row for one step: each row's own choice (fixed k, or its route's adaptive
    policy), adaptive rows capped together by `plan` when several decode at once."""

    def __init__(self, plan_batches: bool = True):
        """plan_batches: cap adaptive rows' k with the batch plan (off: each drafts as alone)."""
        self.plan_batches = plan_batches
        self.idle = IdlePlan()

    def forget(self) -> None:
        """Drop the remembered "no drafting" plan (the next step plans afresh)."""
        self.idle = IdlePlan()

    def choose_ks(self, rows: list[Decoding], costs, running: int | None = None, reading: int = 0) -> Choice:
        """running: requests in the engine, those still reading their prompts included (None:
        only these rows). A row that would start catching up drafts only if drafting still pays
        once those requests decode beside it: its reading serves its remaining tokens, which it
        will mostly spend in the fuller batch. reading: prompt tokens that ride in this step's
        packed call (`plan`)."""
        n = len(rows)
        joining = max(0, (running or n) - n)
        if self.idle.rows == n and self.idle.steps_left > 0 and all(r.policies for r in rows):
            # the plan said "no drafting" for this many rows a few steps ago: a step under load
            # pays nothing for speculation until the row count changes or REPLAN_STEPS pass
            # (no route either: auto's n-gram lookup would scan the sequence for nothing)
            self.idle.steps_left -= 1
            return Choice([0] * n, [None] * n)
        ks, routes, planned = [], [], []
        for r in rows:
            route, k, row = self._own_k(r)
            if row is not None:
                planned.append((len(ks), row))
            ks.append(k)
            routes.append(route)
        if self.plan_batches and planned and costs is not None and n > 1:
            # rows with a fixed k keep it; adaptive rows share the step's cost model
            capped = plan([row for _, row in planned], costs, reading)
            for (i, _), k in zip(planned, capped, strict=True):
                ks[i] = min(ks[i], k)
        if self.plan_batches and planned and costs is not None and joining and any(r.read_per_token for _, r in planned):
            # the batch the reading will be spent in: these rows and the joining requests (each
            # like the first row here, with a prompt of its own to read)
            ahead = plan([row for _, row in planned] + [planned[0][1]] * joining, costs)
            for (i, row), k in zip(planned, ahead, strict=False):
                if row.read_per_token and k == 0:
                    ks[i] = 0
            self.idle = IdlePlan(n, REPLAN_STEPS) if not any(ks) else IdlePlan()
        return Choice(ks, routes)

    @staticmethod
    def _own_k(r: Decoding) -> tuple[str | None, int, Row | None]:
        """The row's route, its k as it would draft alone (fixed, or its route's adaptive
        policy), and its entry in the batch plan (adaptive rows only)."""
        if r.drafter is None:
            return None, 0, None
        route = r.drafter.route(r.seq)
        pol = r.policies.get(route)
        lag = r.drafter.lag(r.seq)  # a separate draft's catching up, priced by the policy
        k = pol.choose_k(len(r.seq), lag, r.remaining) if pol is not None else r.k
        row = None
        if pol is not None:
            read = pol.costs.read_ms(lag) / max(1, r.remaining)
            first = min(max(lag, 1), ROUND_LAG)  # beyond it: read_per_token's
            row = Row(min(k, r.remaining - 1), pol.acc.expected()[: k + 1], route == "ngram", len(r.seq), read, first)
        return route, max(0, min(k, r.remaining - 1)), row
