"""Draft with an EAGLE head: a one-layer model over the target's own features.

The head's cache row p holds the pair (f_p, x_{p+1}) — f_p the target's final-norm hidden state
at position p (the engine records them per slot: `features [S_max, H]`), x_{p+1} the token it
chose. From the pair at p the head predicts f̂_{p+1}, hence logits for x_{p+2}; further draft
steps feed it its own f̂. Rows built from predicted features are dropped at commit, and the next
round rebuilds them from the target's real features of the accepted tokens: the first draft call
of a round feeds accepted + 1 pairs at once (<= k + 1 rows, one call).
"""

from __future__ import annotations

import numpy as np

from .model import ModelDrafter
from .proposal import DraftCall


def pair_calls(seq, features: np.ndarray, start: int, end: int, max_t: int) -> list[DraftCall]:
    """The calls that feed the head the pairs (f_p, x_{p+1}) for p in [start, end), at most
    max_t rows each; the last call's last logits row predicts x_{end+1}. seq: token ids
    (len > end); features [>= end, H]: the target's features by position."""
    toks = np.asarray(seq[start + 1 : end + 1], dtype=np.int64)
    return [DraftCall(toks[i : i + max_t], features[start + i : start + i + len(toks[i : i + max_t])])
            for i in range(0, len(toks), max_t)]


class EagleDrafter(ModelDrafter):
    name = "model"  # a model draft for stats and policies; the recipe is in the bundle manifest

    def __init__(self, model, slot: int, features: np.ndarray, process=None):
        """features [S_max, H]: the target's final-norm hidden states of this slot (row p =
        position p; rows past the target's length are stale)."""
        if not model.takes_hidden or not model.has_hidden_out:
            raise ValueError("EagleDrafter needs an EAGLE draft graph (feature input and output)")
        if model.hidden_size != features.shape[1]:
            raise ValueError(f"EAGLE draft width {model.hidden_size} != target hidden size {features.shape[1]}")
        super().__init__(model, slot, process=process)
        self.features = features
        self._real = 0  # cache rows [0, _real) were built from the target's real features

    def start(self, seq, k, cfg, rng, policy=None) -> DraftCall:
        # committed len(seq) = n; the target has features for positions [0, n - 1). Re-feed at
        # least the last pair (its logits start this proposal), and never keep a row that was
        # built from predicted features.
        n = len(seq)
        s = max(0, min(self.length, self._real, n - 2))
        self.pool.rewind(self.track, self.slot, s)
        self._k, self._cfg, self._rng, self._policy = k, cfg, rng, policy
        self._n0 = n
        self._want_conf = policy is not None
        self._toks, self._q, self._confs = [], [], []
        self._pending = pair_calls(seq, self.features, s, n - 1, self.model.max_t)
        self._real = n - 1
        return self._pending.pop(0)

    def take(self, logits, hidden=None):
        self._hidden = hidden
        if self._pending:
            return self._pending.pop(0)
        return super().take(logits)

    def _next_call(self, tok: int) -> DraftCall:
        return DraftCall(np.array([tok], dtype=np.int64), self._hidden[None, :])

    def commit(self, seq_len: int) -> None:
        self.pool.rewind(self.track, self.slot, min(self.length, self._real))
