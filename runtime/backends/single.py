"""A backend that owns the buffers of one sequence (TensorRT), as a pool model of one slot.

The engine drives pool models (`run(slot, ...)`, `run_rows`); a backend with its own KV
buffers serves slot 0 of a bookkeeping-only pool and runs one sequence per call.
"""

from __future__ import annotations

from .kvpool import KVPool
from .protocol import PoolModel


class SingleSequenceModel(PoolModel):
    batch_rows = False
    kernels = False
    min_t = 1  # TensorRT plans: fp32/fp16 activations

    def __init__(self, backend, entry, track: str):
        self.backend, self.entry = backend, entry
        self.pool = KVPool(entry.kv, 1, allocate=False)
        self.track = self.name = self.pool.track(track)
        for attr in ("vocab", "max_seq_len", "max_t", "max_prefill_t", "hidden_size"):
            setattr(self, attr, getattr(backend, attr))
        self.takes_hidden, self.has_hidden_out = backend.takes_hidden, backend.has_hidden_out

    @property
    def hidden(self):
        return self.backend.hidden

    def run(self, slot: int, tokens, past_len: int, hidden=None, keep=None):
        if slot != 0:
            raise ValueError("this backend holds one sequence (max_batch=1)")
        return self.backend.run(tokens, past_len, hidden, keep)

    def run_rows(self, lo, tokens, pasts, hidden=None):
        if len(tokens) != 1 or lo != 0:
            raise ValueError("this backend holds one sequence (max_batch=1)")
        return self.backend.run(tokens, int(pasts[0]), None if hidden is None else hidden[:1], None)
