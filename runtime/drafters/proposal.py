"""What drafters hand the scheduler: a finished proposal, or the next draft-model call."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Proposal:
    tokens: np.ndarray  # int64 [k'] proposed continuation (k' may be 0)
    q: np.ndarray | None = None  # [k', V] distributions they were sampled from; None = one-hot
    confs: list[float] = field(default_factory=list)  # draft confidence per token (policy calibration)
    drafter: str = "model"  # who proposed ("model" | "ngram"), for stats and the route's policy

    def cut(self, n: int) -> Proposal:
        """The first n proposed tokens, with their distributions and confidences (itself when
        that is all of them: a grammar's valid prefix, runtime/engine/speculate.py)."""
        if n == len(self.tokens):
            return self
        return Proposal(self.tokens[:n], None if self.q is None else self.q[:n], self.confs[:n], self.drafter)


@dataclass
class DraftCall:
    tokens: np.ndarray  # int64 [T] fed to the draft model at its track's length in the request's slot
    hidden: np.ndarray | None = None  # [T, H] feature input (EAGLE)
    keep: int | None = None  # rows of logits needed (1 for catch-up chunks)
