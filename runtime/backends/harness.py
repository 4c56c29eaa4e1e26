"""The single-sequence harness: one sequence through one `Backend` (runtime/backends/protocol.py),
outside the engine — export validation, graph tests and single-sequence tools. A backend
session + the KV length pointer of a one-slot pool; `forward` is the only way tokens go in.

The backend binds each layer's buffer as both past input and present output, so a call of T
tokens writes rows [length, length + T) in place; a rewind only moves `length` back (the next
call's shorter attention_mask hides the stale rows).
"""

from __future__ import annotations

import numpy as np

from ..bundle.manifest import KVLayout
from .kvpool import KVPool


class SequenceHarness:
    def __init__(self, backend, name: str = "model", keep_hidden: bool = False):
        """keep_hidden: record the final-norm hidden state of every position in `features`
        (row p = position p; rows past `length` are stale), for an EAGLE draft to read."""
        self.backend = backend
        self.name = name
        self.kv = KVPool(KVLayout(max_seq_len=backend.max_seq_len), 1, allocate=False)  # bookkeeping only
        self._track = self.kv.track(name)
        self.max_t = backend.max_t  # widest verification call (the manifest's contract)
        self.max_prefill_t = backend.max_prefill_t  # widest call at all (prompt chunks)
        self.vocab = backend.vocab
        self.takes_hidden = backend.takes_hidden
        self.features = None
        if keep_hidden:
            if not backend.has_hidden_out:
                raise ValueError(f"{name}: graph has no hidden-state output (export it with an EAGLE draft)")
            self.features = np.zeros((backend.max_seq_len, backend.hidden_size), dtype=np.float32)

    @property
    def length(self) -> int:
        return self.kv.length(self._track, 0)

    def forward(self, tokens, hidden=None, keep: int | None = None) -> np.ndarray:
        """tokens [T] (T <= max_prefill_t) -> logits [T, V] for each of them; the cache advances by T.
        hidden [T, H]: the feature input of an EAGLE draft graph. keep: only the last `keep` rows
        are needed; graphs with a `logits_to_keep` input then skip the LM head for the others and
        return [keep, V] (others return all T rows: use the last ones).

        The returned array (and `hidden`) are views into the backend's output buffers: read them
        before the next call to this decoder.
        """
        tokens = np.asarray(tokens, dtype=np.int64)
        T = len(tokens)
        if not 0 < T <= self.max_prefill_t:
            raise ValueError(f"{self.name}: a call takes 1..{self.max_prefill_t} tokens, got {T}")
        pos = self.kv.reserve(self._track, 0, T)
        if hidden is not None and np.shape(hidden) != (T, self.backend.hidden_size):
            raise ValueError(f"{self.name}: hidden must be [{T}, {self.backend.hidden_size}], got {np.shape(hidden)}")
        # hidden=None on a feature-taking graph reuses the backend's buffer (cost probes only)
        logits = self.backend.run(tokens, pos, hidden, keep)
        if self.features is not None:
            self.features[pos : pos + T] = self.backend.hidden
        self.kv.advance(self._track, 0, T)
        return logits

    @property
    def hidden(self) -> np.ndarray | None:
        """[T, H] final-norm hidden states of the last call (graphs that output them)."""
        return self.backend.hidden

    def prefill(self, tokens, chunk: int | None = None) -> np.ndarray:
        """Feed any number of tokens in chunks of at most max_prefill_t; returns the last row's
        logits [V]. Only that row goes through the LM head (a fifth of a token's FLOPs for the default target)."""
        tokens = np.asarray(tokens, dtype=np.int64)
        chunk = min(chunk or self.max_prefill_t, self.max_prefill_t)
        self.kv.reserve(self._track, 0, len(tokens))
        logits = None
        for s in range(0, len(tokens), chunk):
            logits = self.forward(tokens[s : s + chunk], keep=1)
        return logits[-1]

    def rewind(self, pos: int) -> None:
        self.kv.rewind(self._track, 0, pos)

    def reset(self) -> None:
        self.rewind(0)
