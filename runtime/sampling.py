"""logits -> probabilities with temperature, top-k, top-p (pure NumPy).

The same `SamplingConfig` is applied to target and draft rows, which exact speculative sampling
requires: verification compares the two *processed* distributions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class InvalidSampling(ValueError):
    pass


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off

    def __post_init__(self):
        if not np.isfinite(self.temperature) or self.temperature < 0:
            raise InvalidSampling(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if self.top_k < 0 or int(self.top_k) != self.top_k:
            raise InvalidSampling(f"top_k must be a non-negative integer (0 = off), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise InvalidSampling(f"top_p must be in (0, 1], got {self.top_p}")

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
        order = np.argsort(-p, axis=-1, kind="stable")
        sorted_p = np.take_along_axis(p, order, axis=-1)
        before = np.cumsum(sorted_p, axis=-1) - sorted_p  # mass strictly before each token
        keep_sorted = before < cfg.top_p
        keep = np.zeros_like(keep_sorted)
        np.put_along_axis(keep, order, keep_sorted, axis=-1)
        p = np.where(keep, p, 0.0)
        p /= p.sum(axis=-1, keepdims=True)
    return p


def sample(p: np.ndarray, u: float) -> int:
    """Inverse-CDF draw from p [V] with a uniform u in [0, 1)."""
    c = np.cumsum(p)
    return int(min(np.searchsorted(c, u * c[-1], side="right"), len(p) - 1))
