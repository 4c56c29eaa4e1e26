"""Pure statistics of the benchmark: medians with spread, interleaving, the cost model."""

from __future__ import annotations

import numpy as np

from ..policy import adaptive


def median_spread(xs) -> dict:
    """{median, p25, p75, n} of a sample (empty -> NaNs)."""
    a = np.asarray(list(xs), dtype=float)
    if a.size == 0:
        return {"median": float("nan"), "p25": float("nan"), "p75": float("nan"), "n": 0}
    p25, med, p75 = np.percentile(a, [25, 50, 75])
    return {"median": float(med), "p25": float(p25), "p75": float(p75), "n": int(a.size)}


def interleave(arms: list[str], items: list, repeats: int) -> list[tuple[int, object, str]]:
    """(repeat, item, arm) in A B C A B C … order per item, the arm order rotating every repeat so
    no arm always runs first (drift and warm caches cancel)."""
    plan = []
    for r in range(repeats):
        for i, item in enumerate(items):
            shift = (r + i) % len(arms)
            for arm in arms[shift:] + arms[:shift]:
                plan.append((r, item, arm))
    return plan


def expected_tokens(alpha: float, k: int) -> float:
    """E[tokens per round] with i.i.d. acceptance alpha and k proposals (bonus included)."""
    return float(adaptive.expected_tokens(np.full(k, alpha))[k])


def predicted_speedup(alpha: float, k: int, c: float, v: float) -> float:
    """The adaptive policy's round rate in target steps: c = draft step / target step, v = verify
    call of k+1 tokens / target step (runtime/policy/adaptive.py)."""
    return float(adaptive.round_rate(expected_tokens(alpha, k), k, c, v))


def paired_ratio(base: list[float], other: list[float]) -> float:
    """Median of per-pair ratios base_i / other_i (pairs measured back to back)."""
    r = [b / o for b, o in zip(base, other, strict=True) if o > 0]
    return float(np.median(r)) if r else float("nan")


def alpha_from_expected(e: float, k: int) -> float:
    """The i.i.d. acceptance alpha whose expected_tokens(alpha, k) equals e (bisection)."""
    e = min(max(e, 1.0), k + 1.0)
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if expected_tokens(mid, k) < e:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2
