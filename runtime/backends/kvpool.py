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

A track's rows may start past the sequence's first token: a windowed draft (runtime/drafters/
model.py) holds tokens [offset, offset + length) in rows [0, length). `set_offset` records
that, and parking, reuse and copies keep rows and offset together, so the next turn of a
conversation finds the draft's window where it left it.

Slots are *empty*, *busy* (a request holds it) or *idle*: a finished request's slot keeps its
rows and the token ids they hold (`park`), so a later prompt that shares a prefix takes the
slot as it is or copies the rows (`copy_rows`) instead of computing them again
(runtime/engine/prefix.py chooses). An idle slot is emptied only when a slot is needed and no
empty one is left, least recently used first (parked, or copied from: `alloc`).
"""

from __future__ import annotations

import numpy as np

from ..bundle.manifest import KVLayout
from ..errors import InvalidRequest


class ContextOverflow(InvalidRequest):
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
        self._offsets: dict[str, np.ndarray] = {}  # track -> sequence position of row 0, per slot
        self._empty = list(range(slots))
        self._idle: dict[int, tuple[list[int], int]] = {}  # slot -> (token ids of its rows, park stamp)
        self._stamp = 0

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
        """Lowest empty slot (keeps the slots in use packed low: batched calls cover fewer
        filler rows); with none empty, the least recently used idle slot, emptied; None when
        every slot is busy."""
        if not self._empty and self._idle:
            self.clear(self.lru_idle())
        if not self._empty:
            return None
        self._empty.sort()
        return self._empty.pop(0)

    def assign(self, slot: int, keep: int = 0, source: int | None = None) -> None:
        """Make an empty or idle `slot` busy with rows [0, keep) of a prompt already in place:
        its own rows (source None: an idle slot holding that prefix) or a copy of `source`'s (idle
        or busy: rows below a busy slot's lengths are committed and never rewritten). Every
        track's length becomes min(its length there, keep); an idle slot's other rows are dropped."""
        if slot in self._idle:
            del self._idle[slot]
        elif slot in self._empty:
            self._empty.remove(slot)
        else:
            raise ValueError(f"slot {slot} is busy")
        origin = slot if source is None else source
        kept = {name: min(int(lengths[origin]), max(0, keep - int(self._offsets[name][origin])))
                for name, lengths in self._tracks.items()}
        if source is not None:
            self.copy_rows(source, slot, max(kept.values(), default=0))
            if source in self._idle:  # a prefix just reused is recently used: evicted last
                self._stamp += 1
                self._idle[source] = (self._idle[source][0], self._stamp)
        for name, n in kept.items():
            self._tracks[name][slot] = n
            self._offsets[name][slot] = self._offsets[name][origin] if n else 0

    def free(self, slot: int) -> None:
        """Give a busy slot back empty: every track's length goes to 0."""
        self._release(slot)
        self._zero(slot)
        self._empty.append(slot)

    def park(self, slot: int, tokens: list[int]) -> None:
        """Give a busy slot back idle, keeping its rows. tokens: the ids its rows hold; every
        track's length is cut to at most len(tokens) (rows past them hold nothing reusable)."""
        self._release(slot)
        for name, lengths in self._tracks.items():
            lengths[slot] = max(0, min(lengths[slot], len(tokens) - self._offsets[name][slot]))
        n = max((int(self._offsets[name][slot] + t[slot]) for name, t in self._tracks.items() if t[slot]), default=0)
        if n == 0:
            self._empty.append(slot)
            return
        self._stamp += 1
        self._idle[slot] = (list(tokens[:n]), self._stamp)

    def clear(self, slot: int) -> None:
        """Empty an idle slot (its rows are forgotten)."""
        if slot not in self._idle:
            raise ValueError(f"slot {slot} is not idle")
        del self._idle[slot]
        self._zero(slot)
        self._empty.append(slot)

    def _release(self, slot: int) -> None:
        if slot in self._empty or slot in self._idle:
            raise ValueError(f"slot {slot} is already free")
        if not 0 <= slot < self.slots:
            raise ValueError(f"no slot {slot} in a pool of {self.slots}")

    def _zero(self, slot: int) -> None:
        for name, lengths in self._tracks.items():
            lengths[slot] = 0
            self._offsets[name][slot] = 0

    @property
    def free_slots(self) -> int:
        """Slots a request can get now: empty or idle."""
        return len(self._empty) + len(self._idle)

    def in_use(self) -> list[int]:
        """Busy slots."""
        return sorted(set(range(self.slots)) - set(self._empty) - set(self._idle))

    def empty_slots(self) -> list[int]:
        return sorted(self._empty)

    def lru_idle(self) -> int | None:
        """The idle slot least recently parked or copied from (the next one `alloc` empties)."""
        return min(self._idle, key=lambda s: self._idle[s][1]) if self._idle else None

    @property
    def can_copy(self) -> bool:
        """Whether `copy_rows` works here: host buffers, or device buffers with cuda-python."""
        if not self.ptrs:
            return False
        if self.device == "cpu":
            return True
        try:
            from ..backends.cudart import cudart

            cudart()
            return True
        except RuntimeError:
            return False

    def idle(self) -> dict[int, list[int]]:
        """Idle slot -> the token ids its rows hold (rows [0, len) of the longest track)."""
        return {s: toks for s, (toks, _) in self._idle.items()}

    def copy_rows(self, src: int, dst: int, n: int) -> None:
        """Copy rows [0, n) of slot `src` into slot `dst`, every layer's K and V. On the host a
        strided memcpy per buffer ([Hkv, n, D] of [Hkv, S_max, D]); on a GPU a device-to-device
        2-D copy (runtime/backends/cudart.py). Lengths are the caller's to set."""
        if n == 0 or src == dst:
            return
        if not 0 <= n <= self.capacity:
            raise ValueError(f"cannot copy {n} rows (capacity {self.capacity})")
        if not self.ptrs:
            raise RuntimeError("this pool holds no buffers (a backend owns them): rows cannot be copied")
        if self.device == "cpu":
            for a in self.host:
                a[dst, :, :n] = a[src, :, :n]
            return
        from ..backends.cudart import copy_device_rows, synchronize

        kv_heads, s_max, head_dim = self.slot_shape
        row = head_dim * self.dtype.itemsize
        for base in self.ptrs:
            copy_device_rows(base + dst * self.slot_bytes, base + src * self.slot_bytes,
                             pitch=s_max * row, width=n * row, height=kv_heads)
        synchronize()  # the next call may run on a stream of its own: the rows must have landed

    # --- lengths per track -------------------------------------------------------------------
    def track(self, name: str) -> str:
        """Register a model writing into this pool (idempotent)."""
        self._tracks.setdefault(name, np.zeros(self.slots, dtype=np.int64))
        self._offsets.setdefault(name, np.zeros(self.slots, dtype=np.int64))
        return name

    @property
    def tracks(self) -> list[str]:
        return list(self._tracks)

    def length(self, track: str, slot: int) -> int:
        return int(self._tracks[track][slot])

    def offset(self, track: str, slot: int) -> int:
        """The sequence position of the track's row 0 in this slot (0 but for a windowed draft)."""
        return int(self._offsets[track][slot])

    def set_offset(self, track: str, slot: int, offset: int) -> None:
        """Start the track's rows at sequence position `offset` (its rows must be empty)."""
        if self.length(track, slot):
            raise ValueError(f"track {track!r} slot {slot} holds {self.length(track, slot)} rows: rewind it first")
        self._offsets[track][slot] = offset

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


def kv_bytes_per_slot(pools) -> int:
    """KV bytes one slot holds over `pools`, each counted once (a self-draft is a track on the
    target's pool; a separate draft's pool follows the target's slots). The one definition:
    `Pipeline.kv_bytes_per_slot` and the engine's counters both use it."""
    return sum(p.bytes_per_slot() for p in {id(p): p for p in pools}.values())
