"""Choosing how much to draft: adaptive k and confidence early stop (pure bookkeeping).

Costs: c = draft step / target step, v(T) = target call of T tokens / target step; probed at
load (`measure_costs`) and then followed online from each round's own call times (EMA), since
the machine's load changes. Acceptance is tracked per draft position j as
P(accept j | j reached), decayed so the estimate follows the text being written.

  expected tokens of a round with k proposals   E(k) = 1 + sum_{j<k} prod_{i<=j} a_i
  rate of a round                                R(k) = E(k) / (k*c + v(k+1))
k = argmax R(k) (computed in tokens per ms); k = 0 (a plain target step) when no k beats it,
with a probe round every `probe_every` plain rounds so a workload that turns predictable is
noticed.

Catching up: a separate draft reads the committed tokens it lacks before its first proposal (a
long prompt's window at the request's first round; every token of a run of plain rounds). That
reading is paid once and then serves every later round, so it is priced against what drafting
saves over the request's remaining tokens, not against one round: a round drafts after a lag of
L tokens only if  remaining x (1/R(0) - 1/R(k)) >= read_ms(L)  (ms saved per token times the
tokens left to save them on), and a probe round only if its read costs at most PROBE_READ of the
remaining tokens' plain time.

Confidence early stop: after drafting token j (draft confidence s_j: greedy, the draft's
top-1/top-2 margin 1 - p2/p1; sampling, its probability of the token), drafting goes on if
some continuation to m in (j, k] pays for itself at the current rate R: its expected gain sum_{j<i<=m} P(reach j+1) * prod_{j<l<=i} a_l, with
P(reach j+1) = prod_{i<=j} P(accept | s_i), against its cost (m - j) draft steps plus the wider
verification, v(m+2) - v(j+2). Looking ahead (not only at token j+1) matters for a draft whose
acceptance is high and correlated: one more token rarely pays alone, the run of tokens it
opens does. P(accept | s) is a per-bin calibration table learned online from verification
outcomes, shrunk toward the position's acceptance rate while a bin has little data, so the
threshold follows the draft and the machine instead of being hard-coded.

The acceptance model and the calibration table live as long as the Pipeline (per drafter
kind, greedy and sampling apart): what earlier requests taught about this draft is the prior
of the next one. A routing drafter (`auto`: an n-gram copy when the context has one, else the
model) gets one policy per route (a request's `policies` {route: policy}, runtime/policy/store.py):
the two differ in cost and in how acceptance falls with position, and a shared state chose k
for neither. Under load the scheduler caps these per-request choices with the batch plan
(runtime/policy/plan.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np


def expected_tokens(rates) -> np.ndarray:
    """E(k) for k = 0..len(rates): tokens a round with k proposals yields, the target's own token
    included, when proposal j is accepted with probability rates[j] once j - 1 was."""
    return np.concatenate(([1.0], 1.0 + np.cumsum(np.cumprod(rates))))


def round_rate(expected, k, draft_cost, verify_cost):
    """R(k) = E(k) / (k * draft + verify(k + 1)): tokens per unit of cost (ms, or target steps);
    NumPy-broadcasting over arrays of k."""
    return expected / (k * draft_cost + verify_cost)


ROUND_LAG = 2  # committed tokens a normal round's first draft call reads at most (two after a
#               round that kept every proposal); catching up beyond them is priced as reading


@dataclass
class Costs:
    target_ms: dict[int, float]  # T -> ms of one target call of T tokens, as probed at `context`
    draft_ms: float  # one draft step (T = 1) at `context`
    scale: float = 1.0  # online correction of the probed target times (EMA of observed / probed)
    rows_ms: dict[int, float] = field(default_factory=dict)  # b -> one target call of b rows x 1 token
    draft_rows_ms: dict[int, float] = field(default_factory=dict)  # b -> one draft call of b rows x 1 token
    context: int = 128  # positions the curves above were probed at
    slope: dict[int, float] = field(default_factory=dict)  # T -> ms a target call of T tokens adds per
    #                                                        position of context past `context` (attention)
    draft_slope: float = 0.0  # the same for one draft step, per position of the draft's own context
    draft_window: int | None = None  # the draft reads at most this many positions (a windowed
    #                                  separate draft, runtime/drafters/model.py); None: all
    packed: bool = False  # the target runs every row of a step in one call (runtime/backends/packed.py):
    #                     a step costs call_ms(total tokens), not a call per drafting row
    draft_read_ms: float = 0.0  # each committed token a draft call reads past its first (catching up)

    def read_ms(self, lag: int) -> float:
        """What a separate draft's catching up on `lag` committed tokens costs beyond a normal
        round's (which reads one or two within its draft step)."""
        return max(0, lag - ROUND_LAG) * self.draft_read_ms

    def call_ms(self, tokens: np.ndarray | int) -> np.ndarray | float:
        """One packed call of `tokens` tokens in all (any rows) at the probe's context: the
        one-sequence curve target_ms, linear beyond its widest probe (the weights are streamed
        once; each token adds its share of the compute)."""
        t = np.asarray(tokens, dtype=float)
        out = self.scale * np.where(t > 0, _interp(self.target_ms, t), 0.0)
        return float(out) if out.ndim == 0 else out

    def extra_ms(self, T: int, context: int | None) -> float:
        """What attending to `context` positions adds to a target call of T tokens (0 at or
        below the probe's context; linear in the positions beyond, as attention is)."""
        if not self.slope or context is None or context <= self.context:
            return 0.0
        return (context - self.context) * _interp(self.slope, T)

    def draft_extra_ms(self, context: int | None) -> float:
        if not self.draft_slope or context is None:
            return 0.0
        seen = context if self.draft_window is None else min(context, self.draft_window)
        return self.draft_slope * max(0, seen - self.context)

    def target_rows_ms(self, b: int, contexts=None) -> float:
        """One batched target call of b rows (one token each); b = 1 is a plain step.
        contexts: the rows' lengths (their attention's share), None: the probe's."""
        base = self.scale * _interp(self.rows_ms or {1: self.target_ms[1]}, b)
        if contexts is None:
            return base
        return base + self.scale * sum(self.extra_ms(1, c) for c in contexts)

    def draft_step_ms(self, b: int, contexts=None) -> float:
        """One batched draft call of b rows; without a batched probe, b single steps."""
        base = _interp(self.draft_rows_ms, b) if self.draft_rows_ms else b * self.draft_ms
        return base + (sum(self.draft_extra_ms(c) for c in contexts) if contexts is not None else 0.0)

    @property
    def c(self) -> float:
        return self.draft_ms / self.verify_ms(1)

    def v(self, T: int) -> float:
        return self.verify_ms(T) / self.verify_ms(1)

    def verify_curve(self, n: int, context: int | None = None) -> np.ndarray:
        """verify_ms(T) for T = 1..n as an array (the probed curve is interpolated once)."""
        base = getattr(self, "_curve", None)
        if base is None or len(base) < n:
            known = sorted(self.target_ms)
            base = self._curve = np.interp(np.arange(1, n + 1), known, [self.target_ms[t] for t in known])
        out = self.scale * base[:n]
        if self.slope and context is not None and context > self.context:
            slopes = getattr(self, "_slopes", None)  # slope(T) for T = 1..n, interpolated once
            if slopes is None or len(slopes) < n:
                slopes = self._slopes = np.array([_interp(self.slope, T) for T in range(1, n + 1)])
            out = out + self.scale * (context - self.context) * slopes[:n]
        return out

    def verify_ms(self, T: int, context: int | None = None) -> float:
        if T in self.target_ms:
            base = self.target_ms[T]
        else:
            known = sorted(self.target_ms)
            base = float(np.interp(T, known, [self.target_ms[t] for t in known]))
        return self.scale * (base + self.extra_ms(T, context))

    def observe(self, proposed: int, draft_ms: float, verify_ms: float, weight: float = 0.1,
                context: int | None = None):
        """Fold one round's measured call times in (EMA): the probe at load is only a start;
        the machine's load changes while a request runs. A round observes one call width; the
        observation rescales the whole probed curve, so widths the policy is not using follow
        the machine too (a per-width correction left them at a stale probe, and a probe that
        happened to catch a burst of load kept k from ever moving there). context: the row's
        length, whose attention share the probe's slope already prices, so a long request
        does not read as a loaded machine."""
        probed = self.verify_ms(proposed + 1, context) / self.scale
        self.scale = (1 - weight) * self.scale + weight * verify_ms / probed
        if proposed > 0 and draft_ms > 0:
            step = max(draft_ms / proposed - self.draft_extra_ms(context), 0.05 * self.draft_ms)
            self.draft_ms = (1 - weight) * self.draft_ms + weight * step


def _interp(curve: dict[int, float], x):
    """Piecewise linear through the probed points; linear growth per row beyond the last.
    x: a number (-> float) or an array (-> array, elementwise)."""
    xs = np.array(sorted(curve), dtype=float)
    ys = np.array([curve[int(k)] for k in xs])
    t = np.asarray(x, dtype=float)
    if len(xs) == 1:
        beyond = ys[0] * t / xs[0]
    else:
        beyond = ys[-1] + (t - xs[-1]) * (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
    out = np.where(t > xs[-1], beyond, np.interp(t, xs, ys))
    return float(out) if out.ndim == 0 else out


def measure_costs(target, draft, slot: int, max_t: int, rows: int = 1, busy=(), context: int = 128,
                  reps: int = 7, far: int | None = None) -> Costs:
    """Median call times at a short context, and the target's widths and the draft step again at
    a far one (`far`, default: as long as the slot holds) for the attention's growth per position;
    every shape interleaved round-robin so a burst of load hits all of them alike. target/draft:
    pool models (runtime/backends/ort.py); slot: a slot nobody is using; busy: slots in use,
    which batched probes cover at their spare row (runtime/backends/kvpool.py). Rows attend to
    whatever the buffers hold: only time is measured, and nothing moves a track's length. rows:
    batched shapes up to this many rows. context: clipped to what the slots hold (a load's
    max_seq_len may be shorter than 128 + max_t)."""
    context = min(context, target.max_seq_len - max_t)
    far = min(target.max_seq_len - max_t if far is None else far, target.max_seq_len - max_t)
    far = far if far >= context + 128 else None  # too close to tell a slope from noise
    widths = sorted({1, 2, 3, 5, 9, max_t} & set(range(1, max_t + 1)))
    # a draft with its own pool catches up by reading committed tokens in wide calls: price a token of them
    own_pool = draft is not None and not draft.takes_hidden and draft.pool is not target.pool
    read = min(64, draft.max_prefill_t, draft.max_seq_len - context) if own_pool else 0
    far_widths = list(widths)
    if target.max_tokens:  # one call holds every row's tokens (a packed target): price wide calls too
        widths += [T for T in (2 * max_t, 4 * max_t) if max_t < T <= min(target.max_prefill_t, target.max_seq_len - context)]
    # the kernels take a call's rows in blocks (AMX: 16 rows a pass over the weights), so the cost
    # jumps after each block's last row: 16 rows cost 121 ms and 17 rows 163 on an AMX host
    # (docs/benchmarks.md §52), and a curve through 9 and 17 alone priced 16 at 155
    widths = sorted(set(widths) | {T for T in (16, 32, 64) if T < widths[-1]})
    # a target with min_t > 1 runs its plain rows one widened call each (runtime/engine/calls.py)
    batch = sorted({1, 2, 4, 8, 16, rows} & set(range(1, rows + 1))) if target.batch_rows and target.min_t == 1 else []
    shapes = [("t", T) for T in widths] + [("tb", b) for b in batch if b > 1]
    shapes += [("tf", T) for T in far_widths] if far else []
    if draft is not None:
        shapes += [("d", 1)] + ([("db", b) for b in batch if b > 1] if draft.batch_rows else [])
        shapes += [("dr", read)] if read > 2 else []
        shapes += [("df", 1)] if far and draft.max_seq_len > far else []
    times = _probe(target, draft, slot, shapes, context, far, set(busy), reps)

    def med(sh):
        return float(np.median(times[sh][1:]))

    # a wider call is never cheaper: noise that says otherwise is flattened out
    m = np.maximum.accumulate([med(("t", T)) for T in widths])
    target_ms = {T: float(v) for T, v in zip(widths, m, strict=True)}
    narrowest = min((T for T in widths if T >= target.min_t), default=widths[-1])
    target_ms.update({T: target_ms[narrowest] for T in widths if T < narrowest})  # widened calls
    rows_ms = {1: target_ms[1], **{b: med(("tb", b)) for b in batch if b > 1}}
    draft_ms = med(("d", 1)) if draft is not None else 0.0
    draft_rows = {1: draft_ms, **{b: med(("db", b)) for b in batch if b > 1}} if draft is not None and draft.batch_rows else {}
    slope, draft_slope = {}, 0.0
    if far:
        fm = np.maximum.accumulate([med(("tf", T)) for T in far_widths])
        slope = {T: max(0.0, float(f) - target_ms[T]) / (far - context) for T, f in zip(far_widths, fm, strict=True)}
        slope.update({T: slope[narrowest] for T in far_widths if T < narrowest})
        if ("df", 1) in times:
            draft_slope = max(0.0, med(("df", 1)) - draft_ms) / (far - context)
    draft_read = max(0.0, med(("dr", read)) - draft_ms) / (read - 1) if ("dr", read) in times else 0.0
    return Costs(target_ms, draft_ms, rows_ms=_monotone(rows_ms), draft_rows_ms=_monotone(draft_rows),
                 context=context, slope=slope, draft_slope=draft_slope, draft_read_ms=draft_read)


def _probe(target, draft, slot: int, shapes: list, context: int, far: int | None, busy: set, reps: int) -> dict:
    """Each shape's call times (ms), reps + 1 passes round-robin (the first warms up)."""

    def pasts(model, b):
        return np.array([model.pool.spare_row(s) if s in busy else context for s in range(b)])

    times: dict = {sh: [] for sh in shapes}
    for _ in range(reps + 1):
        for sh in shapes:
            kind, n = sh
            ids = np.arange(n) % (target.vocab - 10) + 5
            t0 = time.perf_counter()
            if kind in ("t", "tf"):
                target.run(slot, ids, context if kind == "t" else far)
            elif kind in ("d", "df", "dr"):
                draft.run(slot, ids, far if kind == "df" else context, keep=1)
            else:
                model = target if kind == "tb" else draft
                model.run_rows(0, ids, pasts(model, n))
            times[sh].append(1000 * (time.perf_counter() - t0))
    return times


def _monotone(curve: dict[int, float]) -> dict[int, float]:
    ks = sorted(curve)
    return dict(zip(ks, (float(v) for v in np.maximum.accumulate([curve[k] for k in ks])), strict=True))


@dataclass
class AcceptanceModel:
    max_k: int
    prior: float = 0.6  # prior P(accept) per position
    weight: float = 4.0  # prior pseudo-counts: one rejection at a rarely reached position must
    #                      not stop k from ever reaching it again
    decay: float = 0.97  # per round
    ok: np.ndarray = field(init=False)
    tried: np.ndarray = field(init=False)
    plain_rounds: int = field(init=False, default=0)  # plain target steps since the last draft

    def __post_init__(self):
        self.ok = np.zeros(self.max_k)
        self.tried = np.zeros(self.max_k)

    def rates(self) -> np.ndarray:
        """a_j shrunk toward a_{j-1} (a_0 toward the prior): positions that k has not reached
        yet inherit the deepest observed rate instead of the prior, so a drafter whose later
        positions are reliable (n-gram copies) gets explored at larger k."""
        out = np.empty(self.max_k)
        prev = self.prior
        for j in range(self.max_k):
            prev = out[j] = (self.ok[j] + prev * self.weight) / (self.tried[j] + self.weight)
        return out

    def update(self, proposed: int, accepted: int):
        self.ok *= self.decay
        self.tried *= self.decay
        reached = min(proposed, accepted + 1)
        self.tried[:reached] += 1
        self.ok[:accepted] += 1

    def expected(self) -> np.ndarray:
        """E(k) for k = 0..max_k."""
        return expected_tokens(self.rates())


class Calibration:
    """P(accept | draft confidence) in `bins` equal-width bins; a bin with little data is
    shrunk toward `base` (the position's acceptance rate) with `weight` pseudo-counts."""

    def __init__(self, bins: int = 10, weight: float = 2.0):
        self.bins = bins
        self.weight = weight
        self.ok = np.zeros(bins)
        self.n = np.zeros(bins)

    def _bin(self, s: float) -> int:
        return min(int(s * self.bins), self.bins - 1)

    def p(self, s: float, base: float = 0.5) -> float:
        b = self._bin(s)
        return float((self.ok[b] + self.weight * base) / (self.n[b] + self.weight))

    def update(self, confs: list[float], accepted: int):
        for j, s in enumerate(confs[: accepted + 1]):  # positions that were reached
            b = self._bin(s)
            self.n[b] += 1
            self.ok[b] += j < accepted


PROBE_READ = 0.05  # a probe round's catching up may cost at most this share of the remaining
#                   tokens' plain time (module docstring, "Catching up")


class AdaptivePolicy:
    """Per request: picks k each round and decides when drafting should stop early."""

    def __init__(self, costs: Costs, max_k: int, probe_every: int = 8,
                 acceptance: AcceptanceModel | None = None, calibration: Calibration | None = None):
        self.costs = costs
        self.max_k = max_k
        self.acc = acceptance or AcceptanceModel(max_k)
        self.cal = calibration or Calibration()
        self.probe_every = probe_every
        self.rate = 0.0  # predicted tokens per ms of the chosen k
        self.k = max_k  # the chosen k: early stop looks ahead up to it
        self.context: int | None = None  # the request's length at the last choose_k

    def choose_k(self, context: int | None = None, lag: int = 0, remaining: int | None = None) -> int:
        """context: the request's length now (its calls' attention grows with it; None: the
        probe's context). lag: committed tokens the draft must read before proposing (a
        separate draft's catching up); remaining: tokens the request may still produce (None:
        unknown, the reading is not priced). Module docstring, "Catching up"."""
        c = self.costs
        self.context = context
        ks = np.arange(self.max_k + 1)
        draft = c.draft_ms + c.draft_extra_ms(context)
        rates = round_rate(self.acc.expected(), ks, draft, c.verify_curve(self.max_k + 1, context))  # tokens per ms; k = 0 is a plain target step
        k = int(np.argmax(rates))
        read = c.read_ms(lag) if remaining is not None else 0.0
        if k > 0 and read > 0 and remaining * (1 / rates[0] - 1 / rates[k]) < read:
            k = 0  # what drafting would save on the tokens left does not pay the draft's reading
        acc = self.acc  # the plain-round count lives with the learned state: short requests add up
        if k == 0:
            acc.plain_rounds += 1
            cheap = read == 0 or read <= PROBE_READ * remaining / rates[0]
            if acc.plain_rounds >= self.probe_every and cheap:  # re-probe: the text may have become predictable
                acc.plain_rounds = 0
                k = min(2, self.max_k)
        else:
            acc.plain_rounds = 0
        self.rate = rates[k]
        self.k = k
        return k

    def continue_after(self, j: int, confs: list[float]) -> bool:
        """Token j (0-based) was just drafted with confidences confs[:j+1]; draft token j+1?
        Yes if drafting on through some m <= k pays at the current rate (module docstring).
        (Token j itself is kept: its draft step is paid.)"""
        horizon = self.k  # choose_k keeps k <= max_k
        if j + 1 >= horizon:
            return False
        a = self.acc.rates()
        p = float(np.prod([self.cal.p(s, a[i]) for i, s in enumerate(confs[: j + 1])]))  # P(reach j+1)
        c, at = self.costs, self.context
        gain, v0 = 0.0, c.verify_ms(j + 2, at)
        draft = c.draft_ms + c.draft_extra_ms(at)
        for m in range(j + 1, horizon):  # continue through token m
            p *= a[m]
            gain += p
            if gain >= self.rate * ((m - j) * draft + c.verify_ms(m + 2, at) - v0):
                return True
        return False

    def update(self, proposed: int, accepted: int, confs: list[float],
               draft_ms: float | None = None, verify_ms: float | None = None):
        self.acc.update(proposed, accepted)
        if confs:
            self.cal.update(confs, accepted)
        if verify_ms is not None:
            self.costs.observe(proposed, draft_ms or 0.0, verify_ms, context=self.context)
