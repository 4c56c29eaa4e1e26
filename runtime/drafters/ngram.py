"""Prompt-lookup drafting: continue the most recent earlier match of the last n tokens.

No model, no KV: the proposal is deterministic, so verification treats it as a one-hot draft
distribution (q = None), which keeps sampling exact.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from .proposal import Proposal
from .protocol import Drafter


class NgramDrafter(Drafter):
    name = "ngram"

    def __init__(self, n_min: int = 1, n_max: int = 4, max_proposal: int = 16):
        if not 1 <= n_min <= n_max:
            raise ValueError(f"need 1 <= n_min <= n_max, got {n_min}, {n_max}")
        self.n_min, self.n_max, self.max_proposal = n_min, n_max, max_proposal

    def lookup(self, seq, k: int) -> np.ndarray:
        """Longest n (n_max..n_min) whose last-n pattern occurred earlier; its continuation."""
        arr = np.asarray(seq, dtype=np.int64)
        k = min(k, self.max_proposal)
        for n in range(min(self.n_max, len(arr) - 1), self.n_min - 1, -1):
            pattern = arr[-n:]
            windows = sliding_window_view(arr[:-1], n)  # starts 0 .. len-1-n
            hits = np.flatnonzero((windows == pattern).all(axis=1))
            if len(hits):
                start = int(hits[-1]) + n  # most recent match
                return arr[start : start + k].copy()
        return arr[:0].copy()

    def route(self, seq) -> str:
        return self.name

    def start(self, seq, k: int, cfg=None, rng=None, policy=None) -> Proposal:
        return Proposal(self.lookup(seq, k), None, [], self.name)

    def take(self, logits, hidden=None) -> Proposal:
        raise RuntimeError("n-gram lookup makes no model calls: start() always returns the proposal")

    def commit(self, seq_len: int) -> None:
        pass

    def release(self) -> None:
        pass
