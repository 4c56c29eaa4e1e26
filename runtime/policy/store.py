"""What adaptive k knows across requests: this machine's call costs (probed once, cached on disk
per bundle and machine) and, per drafter kind and greedy vs sampling, the acceptance per
position and P(accept | confidence) learned from earlier requests (their best prior)."""

from __future__ import annotations

import dataclasses

from . import cost_cache as probe_cache
from .adaptive import AcceptanceModel, AdaptivePolicy, Calibration, Costs, measure_costs

PRIOR_RANGE = (0.05, 0.95)  # a measured agreement is a few dozen tokens of one prompt: never certain


def _graph_stamp(model) -> str:
    """The graph file a packed model runs (its kernel form or not) as it is on disk, the kernel
    library's, and the instruction set its operators run with (SPECRT_KERNELS_ISA lowers it:
    an avx2 server must not plan with the vnni form's costs), which set its costs as much as
    the bundle does."""
    graph = model.graph
    if graph is None:
        return ""
    stamp = f"{graph.name}:{graph.stat().st_mtime_ns}"
    if model.kernels:
        from ..kernels import isa, library_path

        stamp += f":{library_path().stat().st_mtime_ns}:{isa()}"
    return stamp


class PolicyStore:
    def __init__(self, parts, max_k: int, *, threads, device, global_pool, hugepages, cost_cache: bool = True,
                 draft_window: int | None = None):
        """draft_window: the draft reads at most this many positions (a windowed separate draft):
        its step's cost stops growing there."""
        self.parts, self.max_k = parts, max_k
        self.draft_window = draft_window
        self._key_extra = (f"draft={parts.draft is not None} pool={global_pool} hugepages={hugepages} "
                           f"slots={parts.target.pool.slots} packed={parts.target.max_tokens > 0} "
                           f"graph={_graph_stamp(parts.target)}")
        self.threads, self.device, self.cost_cache = threads, device, cost_cache
        self._costs: Costs | None = None
        self._learned: dict[tuple[str, bool], tuple[AcceptanceModel, Calibration]] = {}

    def forget(self) -> None:
        """Drop the learned acceptance and calibration (the next request starts from priors)."""
        self._learned.clear()

    def costs(self) -> Costs:
        """The cached probe, else measured now on a free slot (engine thread, or before any
        request runs) and cached."""
        if self._costs is None:
            key = None
            if self.cost_cache:
                try:  # a cache problem of any kind means a fresh probe, never a failed request
                    # the slots' length sets the probe's context (and the standard lowering's cost)
                    extra = f"{self._key_extra} seq={self.parts.target.pool.capacity}"
                    key = probe_cache.key(self.parts.folder, self.parts.manifest, threads=self.threads,
                                          device=self.parts.device, extra=extra)
                    self._costs = probe_cache.load(key)
                except Exception:  # noqa: BLE001
                    key = None
            if self._costs is None:
                pool = self.parts.target.pool
                slot = pool.alloc()  # an empty slot (an idle one emptied if need be)
                if slot is None:
                    raise RuntimeError("no free KV slot to probe call costs on")
                d = self.parts.draft
                if d is not None and d.pool is not pool and slot in d.pool.idle():
                    d.pool.clear(slot)  # a separate draft's pool follows the target's slots
                try:  # busy and idle slots' rows are kept: batched probes write at their spare row
                    keep = [s for s in range(pool.slots) if s != slot and s not in pool.empty_slots()]
                    self._costs = measure_costs(self.parts.target, self.parts.draft, slot, self.max_k + 1,
                                                rows=pool.slots, busy=keep)
                finally:
                    pool.free(slot)
                if key:
                    probe_cache.save(key, self._costs)  # never raises: no cache then
        self._costs.draft_window = self.draft_window
        self._costs.packed = self.parts.target.max_tokens > 0
        return self._costs

    def draft_prior(self) -> float:
        """P(accept) per position before a draft model's first round: the draft's agreement with
        the target measured at export (`parity.greedy_agreement_with_target`, teacher-forced over
        the target's greedy continuation of a probe prompt), else AcceptanceModel's default. A
        fixed 0.6 sent the coder's 0.5B draft (agreement 0.75) to plain rounds after its first
        rejection (docs/design.md "Drafting policy", docs/benchmarks.md §23)."""
        draft = self.parts.manifest.draft
        a = ((draft.parity or {}) if draft is not None else {}).get("greedy_agreement_with_target")
        if not isinstance(a, (int, float)) or not 0.0 <= a <= 1.0:
            return AcceptanceModel.prior
        return float(min(max(a, PRIOR_RANGE[0]), PRIOR_RANGE[1]))

    def policies(self, r) -> dict[str, AdaptivePolicy]:
        """Fresh policies for one request over the learned state of its drafter kind; `auto`
        gets one per route (its n-gram rounds learn apart, its model rounds share the model's)."""
        greedy = r.cfg.greedy
        if r.draft == "auto":
            return {"ngram": self._policy("auto:ngram", True, greedy), "model": self._policy("model", False, greedy)}
        return {r.draft: self._policy(r.draft, r.draft == "ngram", greedy)}

    def _policy(self, key: str, lookup: bool, greedy: bool) -> AdaptivePolicy:
        base = self.costs()
        # a copy per request (it is updated online); a lookup costs next to nothing
        draft_ms = 0.01 * base.target_ms[1] if lookup else base.draft_ms
        costs = dataclasses.replace(base, target_ms=dict(base.target_ms), draft_ms=draft_ms, rows_ms=dict(base.rows_ms),
                                    draft_rows_ms={} if lookup else dict(base.draft_rows_ms), slope=dict(base.slope),
                                    draft_slope=0.0 if lookup else base.draft_slope, draft_window=self.draft_window,
                                    draft_read_ms=0.0 if lookup else base.draft_read_ms)
        if (key, greedy) not in self._learned:
            prior = AcceptanceModel.prior if lookup else self.draft_prior()
            self._learned[(key, greedy)] = (AcceptanceModel(self.max_k, prior=prior), Calibration())
        acc, cal = self._learned[(key, greedy)]
        return AdaptivePolicy(costs, self.max_k, acceptance=acc, calibration=cal)
