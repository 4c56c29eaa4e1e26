"""Draft with an EAGLE head: a one-layer model over the target's own features.

The head's cache row p holds the pair (f_p, x_{p+1}) — f_p the target's final-norm hidden state
at position p (the target decoder records them: `Decoder(keep_hidden=True)`), x_{p+1} the token
it chose. From the pair at p the head predicts f̂_{p+1}, hence logits for x_{p+2}; further draft
steps feed it its own f̂. Rows built from predicted features are dropped at commit, and the next
round rebuilds them from the target's real features of the accepted tokens: the first draft call
of a round feeds accepted + 1 pairs at once (<= k + 1 rows, one call).
"""

from __future__ import annotations

import numpy as np

from ..decoder import Decoder
from .model import ModelDrafter


class EagleDrafter(ModelDrafter):
    name = "model"  # a model draft for stats and policies; the recipe is in the bundle manifest

    def __init__(self, decoder: Decoder, target: Decoder):
        be = decoder.backend
        if not decoder.takes_hidden or not be.has_hidden_out or target.features is None:
            raise ValueError("EagleDrafter needs an EAGLE draft graph (feature input and output) and a target "
                             "decoder with keep_hidden=True")
        if be.hidden_size != target.features.shape[1]:
            raise ValueError(f"EAGLE draft width {be.hidden_size} != target hidden size {target.features.shape[1]}")
        super().__init__(decoder)
        self.target = target
        self._real = 0  # cache rows [0, _real) were built from the target's real features

    def begin(self, prompt) -> None:
        """Build the prompt's pairs now (the target has prefilled it; `Speculator.run` calls this
        once the first token is out), so the first round costs what every round costs."""
        self.dec.reset()
        self._real = 0
        if len(prompt) > 1:
            self._feed(prompt, 0, len(prompt) - 1)

    def _feed(self, seq, start: int, stop: int) -> np.ndarray:
        """Pairs (f_p, seq[p+1]) for p in [start, stop) from the target's real features."""
        dec, feats = self.dec, self.target.features
        dec.rewind(start)
        logits = None
        for s in range(start, stop, dec.max_t):
            e = min(s + dec.max_t, stop)
            logits = dec.forward(seq[s + 1 : e + 1], feats[s:e])
        self._real = stop
        return logits

    def _catch_up(self, seq) -> np.ndarray:
        # committed len(seq) = n; the target has features for positions [0, n - 1). Re-feed at
        # least the last pair (its logits start this proposal), and never keep a row that was
        # built from predicted features.
        n = len(seq)
        return self._feed(seq, min(self.dec.length, self._real, n - 2), n - 1)[-1]

    def _step(self, tok) -> np.ndarray:
        return self.dec.forward(tok, self.dec.hidden[-1:])[0]

    def commit(self, seq_len: int) -> None:
        self.dec.rewind(min(self.dec.length, self._real))
