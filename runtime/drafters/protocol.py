"""The drafter contract as code (checked against every drafter by tests/runtime/drafters).

One drafter object per request holds its state: which rows of the draft model's cache are
valid, what the current round has proposed. The scheduler runs the draft-model calls a drafter
asks for (batching the one-token calls of many requests into one: runtime/engine/calls.py) and
advances the draft track's length in the KV pool by each call's width.

What only drafters with a cache of their own have (`offset`, `lag`) carries its default here; a
drafter takes the defaults by naming the protocol as its base.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from ..sampling.draws import Draws, SamplingConfig
from .proposal import DraftCall, Proposal


@runtime_checkable
class Drafter(Protocol):
    offset: int = 0  # the committed token the draft cache's first row holds (a windowed draft's
    #                  first row is a later token); 0 for drafters without a cache of their own

    def route(self, seq: list[int]) -> str:
        """Which sub-drafter would propose now ("model" | "ngram"), decided before k: the
        request's adaptive policy for that route picks k."""
        ...

    def start(self, seq: list[int], k: int, cfg: SamplingConfig, rng: Draws,
              policy=None) -> Proposal | DraftCall:
        """Begin a proposal of at most k tokens continuing `seq` (the committed tokens): the
        finished proposal (no model call needed), or the first draft-model call. A policy
        (runtime/policy/adaptive.py) may end a model draft early (confidence early stop)."""
        ...

    def take(self, logits: np.ndarray, hidden: np.ndarray | None = None) -> Proposal | DraftCall:
        """The last call's logits row float32 [V] (and its hidden row [H], EAGLE), copies the
        drafter may keep. -> the next call, or the finished proposal."""
        ...

    def commit(self, seq_len: int) -> None:
        """The committed sequence now has seq_len tokens (the round's verified prefix + the
        target's token): drop what the draft cache holds beyond what it can keep."""
        ...

    def release(self) -> None:
        """The request ends (its slot is parked or freed next): leave the draft cache holding
        only rows that are a prefix of the committed sequence, which a later prompt may reuse."""
        ...

    def lag(self, seq: list[int]) -> int:
        """Committed tokens of `seq` the next round reads before its first proposal (a separate
        draft catching up; the batch plan prices the reading). 0 for drafters that read none."""
        return 0
