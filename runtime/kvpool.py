"""KV pool: every sequence slot's K/V buffers, allocated once at load, and who wrote how far.

Per layer, one K and one V buffer [slots, Hkv, S, D] (host NumPy or device memory), S the
pool's `capacity`: the bundle's S_max, or less when the load asks for shorter slots (the graphs
take the buffer's length as given: GQA attends over the mask, the standard lowering reads S
from the buffer's shape). Slot s
is row s of every buffer: a call over slots [lo, lo + b) binds the contiguous rows
[lo, lo + b) as both past input and present output, so the model writes in place.

Each model that writes into the pool is a *track* with one length per slot (rows [0, length)
hold that model's valid K/V). A self-draft is a second track on the target's pool: its rows of
committed tokens are the target's (it adopts them), and it writes only at or past the target's
length, which the next verification call overwrites before reading (GQA writes, then
attends). This object is the one place that knows which model may write where:

  * `reserve` / `advance(track, slot, n)`: check that n more rows fit, then commit them;
  * `adopt(track, slot, n, source)`: take `source`'s rows [0, n) (a pointer move, no copy);
  * `rewind(track, slot, pos)`: keep rows [0, pos); moving forward is refused (stale rows);
  * `spare_row(slot)`: a row no track needs, where a call that covers the slot without serving
    it (a batched call over a range of slots) may write its filler token.
"""

from __future__ import annotations

import numpy as np

from .manifest import KVLayout


class ContextOverflow(ValueError):
    """A call would write past the KV buffers' capacity (S_max, or the load's max_seq_len)."""


class KVPool:
    def __init__(self, kv: KVLayout, slots: int, device: str = "cpu", allocate: bool = True,
                 max_seq_len: int | None = None):
        """allocate=False: no buffers yet (`allocate()` later), or bookkeeping only (a backend
        that owns its buffers, one slot). max_seq_len: rows per slot, at most the bundle's S_max
        (None: S_max); `layout` stays the bundle's, so models check it against their entry."""
        if slots < 1:
            raise ValueError(f"a KV pool needs at least one slot, got {slots}")
        capacity = kv.max_seq_len if max_seq_len is None else max_seq_len
        if not 0 < capacity <= kv.max_seq_len:
            raise ValueError(f"max_seq_len must be between 1 and the bundle's S_max {kv.max_seq_len}, got {capacity}")
        self.layout, self.slots, self.device = kv, slots, device
        self.capacity = capacity
        self.dtype = np.dtype(kv.dtype)
        self.slot_shape = (kv.kv_heads, capacity, kv.head_dim)
        self.slot_bytes = int(np.prod(self.slot_shape)) * self.dtype.itemsize  # per layer and K/V
        self.host: list[np.ndarray] = []  # [slots, Hkv, S, D] per layer and K/V (CPU)
        self._device_values: list = []  # OrtValues keeping device buffers alive
        self.ptrs: list[int] = []  # base address of each buffer, layer-major (K, V)
        if allocate:
            self.allocate()
        self._tracks: dict[str, np.ndarray] = {}
        self._free = list(range(slots))

    def allocate(self) -> None:
        """Allocate (and touch) the buffers, once. The loader calls it after the sessions are
        built, so their transient load memory and the KV do not add up in peak RSS."""
        if self.ptrs:
            return
        shape = (self.slots, *self.slot_shape)
        for _ in range(2 * self.layout.layers):
            if self.device == "cpu":
                a = np.empty(shape, dtype=self.dtype)
                a.fill(0)  # commit every page now: RSS is flat from load on
                self.host.append(a)
                self.ptrs.append(a.ctypes.data)
            else:
                import onnxruntime as ort

                v = ort.OrtValue.ortvalue_from_shape_and_type(list(shape), self.dtype, self.device, 0)
                self._device_values.append(v)
                self.ptrs.append(v.data_ptr())

    def bytes_per_slot(self) -> int:
        return self.slot_bytes * 2 * self.layout.layers

    # --- slots -------------------------------------------------------------------------------
    def alloc(self) -> int | None:
        """Lowest free slot (keeps the slots in use packed low: batched calls cover fewer
        filler rows), or None when all are taken."""
        if not self._free:
            return None
        self._free.sort()
        return self._free.pop(0)

    def free(self, slot: int) -> None:
        if slot in self._free:
            raise ValueError(f"slot {slot} is already free")
        for lengths in self._tracks.values():
            lengths[slot] = 0
        self._free.append(slot)

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def in_use(self) -> list[int]:
        return sorted(set(range(self.slots)) - set(self._free))

    # --- lengths per track -------------------------------------------------------------------
    def track(self, name: str) -> str:
        """Register a model writing into this pool (idempotent)."""
        self._tracks.setdefault(name, np.zeros(self.slots, dtype=np.int64))
        return name

    @property
    def tracks(self) -> list[str]:
        return list(self._tracks)

    def length(self, track: str, slot: int) -> int:
        return int(self._tracks[track][slot])

    def reserve(self, track: str, slot: int, n: int) -> int:
        """Check that n more rows fit; returns the write position."""
        pos = self.length(track, slot)
        if pos + n > self.capacity:
            raise ContextOverflow(f"KV cache full: {pos} + {n} tokens exceed max_seq_len {self.capacity}")
        return pos

    def advance(self, track: str, slot: int, n: int) -> None:
        self.reserve(track, slot, n)
        self._tracks[track][slot] += n

    def rewind(self, track: str, slot: int, pos: int) -> None:
        """Keep rows [0, pos). Moving forward is refused: those rows may hold stale data."""
        cur = self.length(track, slot)
        if not 0 <= pos <= cur:
            raise ValueError(f"cannot rewind KV track {track!r} slot {slot} of length {cur} to {pos}")
        self._tracks[track][slot] = pos

    def adopt(self, track: str, slot: int, n: int, source: str) -> None:
        """`track` takes `source`'s rows [0, n) of this slot: they are the same buffers, so
        this only moves the length (either way)."""
        if not 0 <= n <= self.length(source, slot):
            raise ValueError(f"cannot adopt {n} rows of track {source!r} (length {self.length(source, slot)})")
        self._tracks[track][slot] = n

    def spare_row(self, slot: int) -> int:
        """A row of `slot` that no track needs: a call covering the slot without serving it
        writes its filler token there (every track's next call rewrites its rows from its own
        length on before reading them)."""
        pos = max(int(t[slot]) for t in self._tracks.values()) if self._tracks else 0
        if pos >= self.capacity:  # the context checks keep every track below S_max
            raise ContextOverflow(f"slot {slot} has no spare row (all {self.capacity} in use)")
        return pos
