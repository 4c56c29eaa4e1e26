"""Persistent KV cache bookkeeping: buffers are allocated once by a backend; this is the pointer.

The backend binds each layer's buffer [B, Hkv, S_max, D] as both past input and present output,
so a forward call of T tokens writes rows [length, length + T) in place. Rolling back after a
rejected draft only moves `length` back: the stale rows are masked by the next call (its
attention_mask is shorter) and overwritten when those positions are used again.
"""

from __future__ import annotations


class ContextOverflow(ValueError):
    """A call would write past the KV buffers' capacity (S_max)."""


class KVCache:
    def __init__(self, capacity: int):
        self.capacity = capacity  # S_max
        self.length = 0  # committed rows; the next call writes from here

    def room(self) -> int:
        return self.capacity - self.length

    def reserve(self, n: int) -> int:
        """Check that n more rows fit; returns the write position."""
        if n > self.room():
            raise ContextOverflow(
                f"KV cache full: {self.length} + {n} tokens exceed max_seq_len {self.capacity}"
            )
        return self.length

    def advance(self, n: int) -> None:
        self.reserve(n)
        self.length += n

    def rewind(self, pos: int) -> None:
        """Keep rows [0, pos). Moving forward is refused: those rows may hold stale data."""
        if not 0 <= pos <= self.length:
            raise ValueError(f"cannot rewind KV cache of length {self.length} to {pos}")
        self.length = pos
