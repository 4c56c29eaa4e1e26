"""`auto`: n-gram lookup when the context has a match, the draft model otherwise."""

from __future__ import annotations

from .model import ModelDrafter
from .ngram import NgramDrafter
from .proposal import Proposal
from .protocol import Drafter


class AutoDrafter(Drafter):
    def __init__(self, model: ModelDrafter, ngram: NgramDrafter, min_match: int = 2):
        self.model, self.ngram = model, ngram
        self.min_match = min_match  # shortest n-gram continuation worth verifying instead of the model's
        self._routed: tuple[int, object] | None = None  # (len(seq), n-gram continuation or None)

    def route(self, seq) -> str:
        """This round's sub-drafter, decided before k is chosen (adaptive k keeps one policy per
        route): 'ngram' when the context continues an earlier match by >= min_match tokens."""
        toks = self.ngram.lookup(seq, self.ngram.max_proposal)
        self._routed = (len(seq), toks if len(toks) >= self.min_match else None)
        return "ngram" if self._routed[1] is not None else "model"

    def start(self, seq, k: int, cfg, rng, policy=None):
        if self._routed is None or self._routed[0] != len(seq):
            self.route(seq)
        toks = self._routed[1]
        self._routed = None
        if toks is not None and len(toks[:k]) >= min(self.min_match, k):
            return Proposal(toks[:k], None, [], "ngram")
        return self.model.start(seq, k, cfg, rng, policy)

    def lag(self, seq) -> int:
        return self.model.lag(seq)

    def take(self, logits, hidden=None):
        return self.model.take(logits, hidden)

    def commit(self, seq_len: int) -> None:
        self.model.commit(seq_len)

    def release(self) -> None:
        self.model.release()
