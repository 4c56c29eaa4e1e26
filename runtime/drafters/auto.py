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

    def begin(self, prompt) -> None:
        self.model.begin(prompt)

    def propose(self, seq, k: int, cfg, rng, policy=None):
        toks = self.ngram.lookup(seq, k)
        if len(toks) >= min(self.min_match, k):
            self.name, self.confs = "ngram", []
            return toks, None
        self.name = "model"
        out = self.model.propose(seq, k, cfg, rng, policy)
        self.confs = self.model.confs
        return out

    def commit(self, seq_len: int) -> None:
        self.model.commit(seq_len)
