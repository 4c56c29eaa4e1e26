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
Alone (n = 1) this is the single-request rule, E(k) / (k c + v(k+1)). Under load a plain
batched row costs a fraction of a step while a verification call costs a whole one, so
drafting stops by itself (docs/design.md, "Speculation under load").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..adaptive import Costs


@dataclass
class Row:
    k: int  # the most this row would draft (its own policy's choice)
    expected: np.ndarray  # E(j), j = 0..k: tokens a round with j proposals commits
    lookup: bool = False  # an n-gram proposal: no draft-model calls


def step_ms(rows: list[Row], ks: list[int], costs: Costs) -> float:
    plain = sum(1 for k in ks if k == 0)
    ms = costs.target_rows_ms(plain) if plain else 0.0
    ms += sum(costs.verify_ms(k + 1) for k in ks if k > 0)
    depth = max(ks, default=0)
    for j in range(1, depth + 1):
        b = sum(1 for r, k in zip(rows, ks, strict=True) if k >= j and not r.lookup)
        if b:
            ms += costs.draft_step_ms(b)
    return ms


def plan(rows: list[Row], costs: Costs) -> list[int]:
    """k per row (0 = a plain row of the batched call) maximizing tokens per ms."""
    n = len(rows)
    best_ks, best = [0] * n, n / step_ms(rows, [0] * n, costs)
    for cap in range(1, max((r.k for r in rows), default=0) + 1):
        ks = [min(r.k, cap) for r in rows]
        gain = [float(r.expected[k]) - 1.0 if k else -1.0 for r, k in zip(rows, ks, strict=True)]
        order = sorted((i for i in range(n) if ks[i] > 0), key=lambda i: -gain[i])
        for m in range(1, len(order) + 1):
            chosen = set(order[:m])
            trial = [ks[i] if i in chosen else 0 for i in range(n)]
            tokens = (n - m) + sum(float(rows[i].expected[trial[i]]) for i in chosen)
            rate = tokens / step_ms(rows, trial, costs)
            if rate > best:
                best_ks, best = trial, rate
    return best_ks
