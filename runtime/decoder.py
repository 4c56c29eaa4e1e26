"""One model = backend session + KV length pointer. `forward` is the only way tokens go in."""

from __future__ import annotations

import numpy as np

from .kv import KVCache


class NonFiniteLogits(RuntimeError):
    pass


class Decoder:
    def __init__(self, backend, name: str = "model"):
        self.backend = backend
        self.name = name
        self.kv = KVCache(backend.max_seq_len)
        self.max_t = backend.max_t  # widest single call
        self.vocab = backend.vocab

    @property
    def length(self) -> int:
        return self.kv.length

    def forward(self, tokens) -> np.ndarray:
        """tokens [T] (T <= max_t) -> logits [T, V] for each of them; the cache advances by T.

        The returned array is a view into the backend's output buffer: read it before the next
        call to this decoder.
        """
        tokens = np.asarray(tokens, dtype=np.int64)
        if not 0 < len(tokens) <= self.max_t:
            raise ValueError(f"{self.name}: a call takes 1..{self.max_t} tokens, got {len(tokens)}")
        pos = self.kv.reserve(len(tokens))
        logits = self.backend.run(tokens, pos)
        self.kv.advance(len(tokens))
        return logits

    def prefill(self, tokens, chunk: int | None = None) -> np.ndarray:
        """Feed any number of tokens in chunks of at most max_t; returns the last row's logits [V]."""
        tokens = np.asarray(tokens, dtype=np.int64)
        chunk = chunk or self.max_t
        self.kv.reserve(len(tokens))
        logits = None
        for s in range(0, len(tokens), chunk):
            logits = self.forward(tokens[s : s + chunk])
        return logits[-1]

    def rewind(self, pos: int) -> None:
        self.kv.rewind(pos)

    def reset(self) -> None:
        self.kv.rewind(0)
