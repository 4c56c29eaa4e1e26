"""`auto`: n-gram lookup when the context has a match, the draft model otherwise."""

from __future__ import annotations

from .model import ModelDrafter
from .ngram import NgramDrafter


class AutoDrafter:
    def __init__(self, model: ModelDrafter, ngram: NgramDrafter, min_match: int = 2):
        self.model, self.ngram = model, ngram
        self.min_match = min_match  # shortest n-gram continuation worth verifying instead of the model's
        self.name = "model"  # drafter of the last proposal (for stats)
        self.confs: list[float] = []
        self._routed: tuple[int, object] | None = None  # (len(seq), n-gram continuation or None)

    def begin(self, prompt) -> None:
        self.model.begin(prompt)
        self._routed = None

    def route(self, seq) -> str:
        """Decide this round's sub-drafter before k is chosen (adaptive k keeps one policy per
        route): 'ngram' when the context continues an earlier match by >= min_match tokens."""
        toks = self.ngram.lookup(seq, self.ngram.max_proposal)
        self._routed = (len(seq), toks if len(toks) >= self.min_match else None)
        return "ngram" if self._routed[1] is not None else "model"

    def propose(self, seq, k: int, cfg, rng, policy=None):
        if self._routed is not None and self._routed[0] == len(seq):  # route() ran this round
            toks = self._routed[1][:k] if self._routed[1] is not None else None
        else:
            toks = self.ngram.lookup(seq, k)
            toks = toks if len(toks) >= min(self.min_match, k) else None
        self._routed = None
        if toks is not None:
            self.name, self.confs = "ngram", []
            return toks, None
        self.name = "model"
        out = self.model.propose(seq, k, cfg, rng, policy)
        self.confs = self.model.confs
        return out

    def commit(self, seq_len: int) -> None:
        self.model.commit(seq_len)
