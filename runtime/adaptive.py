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
model) gets one policy per route (`PolicySet`): the two differ in cost and in how acceptance
falls with position, and a shared state chose k for neither.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Costs:
    target_ms: dict[int, float]  # T -> ms of one target call of T tokens, as probed
    draft_ms: float  # one draft step (T = 1)
    scale: float = 1.0  # online correction of the probed target times (EMA of observed / probed)

    @property
    def c(self) -> float:
        return self.draft_ms / self.verify_ms(1)

    def v(self, T: int) -> float:
        return self.verify_ms(T) / self.verify_ms(1)

    def verify_ms(self, T: int) -> float:
        if T in self.target_ms:
            return self.scale * self.target_ms[T]
        known = sorted(self.target_ms)
        return self.scale * float(np.interp(T, known, [self.target_ms[t] for t in known]))

    def observe(self, proposed: int, draft_ms: float, verify_ms: float, weight: float = 0.1):
        """Fold one round's measured call times in (EMA): the probe at load is only a start;
        the machine's load changes while a request runs. A round observes one call width; the
        observation rescales the whole probed curve, so widths the policy is not using follow
        the machine too (a per-width correction left them at a stale probe, and a probe that
        happened to catch a burst of load kept k from ever moving there)."""
        probed = self.verify_ms(proposed + 1) / self.scale
        self.scale = (1 - weight) * self.scale + weight * verify_ms / probed
        if proposed > 0 and draft_ms > 0:
            self.draft_ms = (1 - weight) * self.draft_ms + weight * draft_ms / proposed


def measure_costs(target, draft, max_t: int, context: int = 128, reps: int = 7) -> Costs:
    """Median call times at a mid context, widths interleaved round-robin so a burst of load
    hits all of them alike. target/draft: runtime Decoders."""
    widths = sorted({1, 2, 3, 5, 9, max_t} & set(range(1, max_t + 1)))
    decs = [(target, T) for T in widths] + ([(draft, 1)] if draft is not None else [])
    times: dict = {d: [] for d in decs}
    # A self-draft sharing the target's KV buffers writes the same rows here: harmless, as only
    # time is measured and every request starts with the target's prefill.
    for dec in {id(d): d for d, _ in decs}.values():
        dec.reset()
        dec.prefill(np.arange(context) % (dec.vocab - 10) + 5)
    for _ in range(reps):
        for dec, T in decs:
            ids = np.arange(T) % (dec.vocab - 10) + 5
            t0 = time.perf_counter()
            dec.forward(ids)
            times[(dec, T)].append(1000 * (time.perf_counter() - t0))
            dec.rewind(context)
    for dec, _ in decs:
        dec.reset()
    # a wider call is never cheaper: noise that says otherwise is flattened out
    med = np.maximum.accumulate([float(np.median(times[(target, T)])) for T in widths])
    target_ms = {T: float(m) for T, m in zip(widths, med, strict=True)}
    return Costs(target_ms, float(np.median(times[(draft, 1)])) if draft is not None else 0.0)


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
        return np.concatenate(([1.0], 1.0 + np.cumsum(np.cumprod(self.rates()))))

    def expected_tokens(self, k: int) -> float:
        return float(self.expected()[k])


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

    def table(self) -> list[float]:
        return [self.p((b + 0.5) / self.bins) for b in range(self.bins)]


class AdaptivePolicy:
    """Per request: picks k each round and decides when drafting should stop early."""

    def __init__(self, costs: Costs, max_k: int, probe_every: int = 8, early_stop: bool = True,
                 acceptance: AcceptanceModel | None = None, calibration: Calibration | None = None):
        self.costs = costs
        self.max_k = max_k
        self.acc = acceptance or AcceptanceModel(max_k)
        self.cal = calibration or Calibration()
        self.probe_every = probe_every
        self.early_stop = early_stop
        self.rate = 0.0  # predicted tokens per ms of the chosen k
        self.k = max_k  # the chosen k: early stop looks ahead up to it

    def choose_k(self) -> int:
        c = self.costs
        ks = np.arange(self.max_k + 1)
        ms = ks * c.draft_ms + np.array([c.verify_ms(k + 1) for k in ks])
        rates = self.acc.expected() / ms  # tokens per ms; k = 0 is a plain target step
        k = int(np.argmax(rates))
        acc = self.acc  # the plain-round count lives with the learned state: short requests add up
        if k == 0:
            acc.plain_rounds += 1
            if acc.plain_rounds >= self.probe_every:  # re-probe: the text may have become predictable
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
        horizon = self.k if self.early_stop else self.max_k  # choose_k keeps k <= max_k
        if not self.early_stop or j + 1 >= horizon:
            return j + 1 < horizon
        a = self.acc.rates()
        p = float(np.prod([self.cal.p(s, a[i]) for i, s in enumerate(confs[: j + 1])]))  # P(reach j+1)
        c = self.costs
        gain, v0 = 0.0, c.verify_ms(j + 2)
        for m in range(j + 1, horizon):  # continue through token m
            p *= a[m]
            gain += p
            if gain >= self.rate * ((m - j) * c.draft_ms + c.verify_ms(m + 2) - v0):
                return True
        return False

    def update(self, proposed: int, accepted: int, confs: list[float],
               draft_ms: float | None = None, verify_ms: float | None = None):
        self.acc.update(proposed, accepted)
        if confs:
            self.cal.update(confs, accepted)
        if verify_ms is not None:
            self.costs.observe(proposed, draft_ms or 0.0, verify_ms)


class PolicySet:
    """One AdaptivePolicy per route of a routing drafter; the Speculator selects the route
    (`drafter.route(seq)`) before asking for k, and everything after goes to that policy."""

    def __init__(self, policies: dict[str, AdaptivePolicy]):
        self.policies = policies
        self.active = next(iter(policies))

    def select(self, route: str) -> None:
        self.active = route

    @property
    def current(self) -> AdaptivePolicy:
        return self.policies[self.active]

    @property
    def costs(self) -> Costs:
        return self.current.costs

    @property
    def early_stop(self) -> bool:
        return self.current.early_stop

    def choose_k(self) -> int:
        return self.current.choose_k()

    def continue_after(self, j: int, confs: list[float]) -> bool:
        return self.current.continue_after(j, confs)

    def update(self, *args, **kw):
        self.current.update(*args, **kw)
