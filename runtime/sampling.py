"""logits -> probabilities with temperature, top-k, top-p (pure NumPy).

The same `SamplingConfig` is applied to target and draft rows, which exact speculative sampling
requires: verification compares the two *processed* distributions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import InvalidRequest


class InvalidSampling(InvalidRequest):
    """A sampling setting out of range; `param` names it."""


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off

    def __post_init__(self):
        if not np.isfinite(self.temperature) or self.temperature < 0:
            raise InvalidSampling(f"temperature must be >= 0 (0 = greedy), got {self.temperature}", "temperature")
        if self.top_k < 0 or int(self.top_k) != self.top_k:
            raise InvalidSampling(f"top_k must be a non-negative integer (0 = off), got {self.top_k}", "top_k")
        if not 0 < self.top_p <= 1:
            raise InvalidSampling(f"top_p must be in (0, 1], got {self.top_p}", "top_p")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def probs(logits: np.ndarray, cfg: SamplingConfig) -> np.ndarray:
    """logits [..., V] float -> probabilities [..., V] float64 (rows sum to 1).

    top-k keeps the k largest logits (ties at the boundary kept); top-p keeps the smallest set
    of most probable tokens whose mass reaches p (the token that crosses p is kept).
    """
    x = np.asarray(logits, dtype=np.float64) / cfg.temperature
    x = x - x.max(axis=-1, keepdims=True)
    if cfg.top_k and cfg.top_k < x.shape[-1]:
        kth = np.partition(x, -cfg.top_k, axis=-1)[..., -cfg.top_k, None]
        x = np.where(x < kth, -np.inf, x)
    p = np.exp(x)
    p /= p.sum(axis=-1, keepdims=True)
    if cfg.top_p < 1.0:
        p = _top_p(p, cfg.top_p)
    return p


def sample(p: np.ndarray, u: float) -> int:
    """Inverse-CDF draw from p [V] with a uniform u in [0, 1)."""
    c = np.cumsum(p)
    return int(min(np.searchsorted(c, u * c[-1], side="right"), len(p) - 1))


def _top_p(p: np.ndarray, top_p: float, head: int = 256) -> np.ndarray:
    """Nucleus filter on rows of p. Sorting all V entries costs milliseconds per row at V = 49k; the
    nucleus is almost always inside the `head` most probable tokens, so those are sorted first
    and the full sort is only the fallback. Same result either way (stable order: -p, index)."""
    flat = p.reshape(-1, p.shape[-1])
    out = np.empty_like(flat)
    V = flat.shape[-1]
    for r, row in enumerate(flat):
        keep = None
        if head < V:
            cand = np.argpartition(-row, head)[:head]
            cand = cand[np.lexsort((cand, -row[cand]))]  # by -p, ties by index
            before = np.cumsum(row[cand]) - row[cand]
            inside = before < top_p
            last = int(np.flatnonzero(inside)[-1])
            # decided inside the head iff the nucleus ends before the head's last token and no
            # token outside the head ties with the boundary
            if last < head - 1 and row[cand[last]] > row[cand[-1]]:
                keep = cand[: last + 1]
        if keep is None:
            order = np.argsort(-row, kind="stable")
            before = np.cumsum(row[order]) - row[order]
            keep = order[before < top_p]
        out[r] = 0.0
        out[r, keep] = row[keep]
        out[r] /= out[r].sum()
    return out.reshape(p.shape)
