"""Draft with a small model that has its own persistent KV cache."""

from __future__ import annotations

import numpy as np

from ..decoder import Decoder
from ..sampling import SamplingConfig, probs, sample


class ModelDrafter:
    name = "model"

    def __init__(self, decoder: Decoder):
        self.dec = decoder

    def begin(self, prompt) -> None:
        self.dec.reset()
        if len(prompt) > 1:
            self.dec.prefill(prompt[:-1])  # the last prompt token is fed by the first propose

    def propose(self, seq, k: int, cfg: SamplingConfig, rng: np.random.Generator, policy=None):
        """policy (optional): `continue_after(j, confs)` may end drafting early; the
        confidences (draft probability of each proposed token) are left in `self.confs`."""
        # Rows [dec.length, len(seq)) are committed but not yet in the draft cache: 1 token
        # normally, 2 after a round where every proposal was accepted (draft catch-up).
        # After n-gram rounds (auto) the lag can exceed one call: prefill chunks it.
        logits = self._catch_up(seq)
        toks = np.empty(k, dtype=np.int64)
        q = None if cfg.greedy else np.empty((k, self.dec.vocab))
        self.confs = confs = []
        want_conf = policy is not None and policy.early_stop
        n = k
        for j in range(k):
            if cfg.greedy:
                toks[j] = t = int(logits.argmax())
                if want_conf:
                    confs.append(_margin(logits, t))
            else:
                q[j] = probs(logits, cfg)
                toks[j] = sample(q[j], rng.random())
                confs.append(float(q[j, toks[j]]))
            if want_conf and not policy.continue_after(j, confs):
                n = j + 1
                break
            if j + 1 < k:
                logits = self._step(toks[j : j + 1])
        return toks[:n], (None if q is None else q[:n])

    def _catch_up(self, seq) -> np.ndarray:
        """Feed the committed tokens the cache lacks; -> logits row for the next token."""
        return self.dec.prefill(seq[self.dec.length :])

    def _step(self, tok) -> np.ndarray:
        return self.dec.forward(tok)[0]

    def commit(self, seq_len: int) -> None:
        # Cache rows hold seq[:n] + proposals[:k-1]; the valid prefix is the committed part.
        self.dec.rewind(min(self.dec.length, seq_len - 1))


def _margin(logits: np.ndarray, top: int) -> float:
    """Greedy confidence: 1 - p2/p1 of the draft's two best tokens (0 = a tie, 1 = decisive).
    A greedy draft token is rejected where the target's best token differs; a draft close to
    the target (int8 self-draft) differs almost only where its own top two are close, whatever
    the top token's probability. (Top-1 probability as the signal left the calibration table
    flat for such a draft, and rounds of k = 14 ran to the end on tokens it then lost.)"""
    best = logits[top]
    logits[top] = -np.inf
    second = logits.max()
    logits[top] = best
    return float(1.0 - np.exp(second - best))
