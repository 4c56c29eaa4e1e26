"""onnxruntime backend over a bundle's packed target graph (export/packed.py, docs/bundle.md
"Packed calls"): one call carries the tokens of up to `lanes` sequences.

`PackedModel` is a `PoolModel` (runtime/backends/protocol.py) whose `run_batch` puts up to
`lanes` sequences and `max_tokens` tokens into one call (`run_packed`, one call per such group,
in the batch's order):

  run_packed([(slot, tokens[T], past, keep), ...])   every sequence's tokens in one call; the
      projections, MLP and LM head stream the weights once for all of them, and each sequence's
      attention runs in a lane of its own over its slot's rows. -> per sequence its logits
      [min(keep, T), V] (views of one output buffer, valid until the next call).

A sequence's rows are the same bits in any such call (alone, beside others, at any width), so
`min_t` is 1. On onnxruntime's operators (the portable packed graph) that needs a lone token to
get a filler after it inside its lane (its K/V row lands past the sequence's length, where the
next call writes first): a packed axis of one token would take MatMulNBits' and the GEMVs' M = 1
paths. A lone token at the pool's last row has no row after it: the caller sends the token before
it with it (runtime/engine/calls.py `_last_row`), which rewrites that row with the same bits. A
kernel graph whose every node computes a lone row as a wide call does (specrt's operators, the
same bits at any M, one included; the rest per row or elementwise: `entry.packed.one_row`) runs
a lone token as one row: no filler (`filler` False; docs/design.md "One-token calls of
int8-activation graphs"). Lanes are bound to slots by pointer and stay bound while the same slots keep
coming (a call rebinds only lanes whose slot changed); a lane the call does not use runs two
filler tokens over a two-row scratch buffer.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from ..bundle.manifest import ModelEntry
from .batch import Batch, BatchOut
from .kvpool import KVPool
from .ort import PACKED_PRECISIONS, PREFILL_TOKENS, pick_providers, prefill_width, session_options
from .protocol import PoolModel


class PackedModel(PoolModel):
    takes_hidden = False
    has_hidden_out = False
    hidden = None
    hidden_size = 0
    batch_rows = True
    min_t = 1

    def __init__(self, graph: str | Path, entry: ModelEntry, pool: KVPool, *, lanes: int, track: str = "model",
                 threads: int | None = None, global_pool: bool = False, prefill_tokens: int = PREFILL_TOKENS,
                 prepack: bool = True, exact: bool = True, kernels: bool = False):
        """graph: the entry's packed graph of `lanes` lanes (`entry.packed.file(lanes)`).
        exact=False (a draft model, whose numbers only decide how much is accepted): no filler
        tokens, so a lone token is a one-token lane and a call of one token is one token.
        kernels: the graph is the entry's kernel form (export/kernel_graph.py), on specrt's own
        operators: its session registers their library; where every node of it computes a lone
        row as a wide call does (`entry.packed.one_row`), an exact model needs no filler."""
        self.filler = exact and not (kernels and entry.packed.one_row)
        if pool.layout != entry.kv:
            raise ValueError(f"{graph}: KV layout {entry.kv} does not match the pool's {pool.layout}")
        providers, self.device_type = pick_providers(pool.device)
        if self.device_type != "cpu":
            raise ValueError("packed calls run on the CPU execution provider only")
        so = session_options(threads, global_pool=global_pool, prepack=prepack or entry.precision in PACKED_PRECISIONS,
                             kernels=kernels)
        self.session = ort.InferenceSession(str(graph), so, providers=providers)
        self.graph, self.kernels = Path(graph), kernels
        self.entry, self.pool, self.track = entry, pool, pool.track(track)
        self.name = track
        self.vocab = entry.vocab_size
        self.lanes = lanes
        self.max_seq_len = pool.capacity
        self.max_t = entry.max_tokens_per_call
        self.max_prefill_t = prefill_width(entry, prefill_tokens)
        # a call holds at most every lane at its widest verification, or one prompt chunk
        # beside one-token lanes; logits: every lane's widest verification, or a whole chunk's
        # (runtime/bundle/memory.py counts them)
        self.max_tokens = max(self.lanes * self.max_t, self.max_prefill_t + self.lanes)
        cap = self.max_tokens + 2 * self.lanes
        self._ids = np.zeros(cap, dtype=np.int64)
        self._lane_idx = np.zeros((self.lanes, cap), dtype=np.int64)
        self._seqlens = np.ones(self.lanes, dtype=np.int32)
        self._unpack = np.zeros(cap, dtype=np.int64)
        self._keep = np.zeros(cap, dtype=np.int64)
        self.max_logits = max(self.lanes * self.max_t, self.max_prefill_t)
        self._logits = np.empty((self.max_logits + 2) * self.vocab, dtype=np.float32)
        self._logits.fill(0)  # commit the pages now: RSS stays flat during generation
        kv = entry.kv
        self._scratch = [np.zeros((1, kv.kv_heads, 2, kv.head_dim), dtype=pool.dtype) for _ in range(2 * kv.layers)]
        self._io = self.session.io_binding()
        self._lane_slot = [-2] * self.lanes  # -1: scratch; -2: not bound yet
        for r in range(self.lanes):
            self._bind_lane(r, -1)

    # --- binding -----------------------------------------------------------------------------
    def _bind_lane(self, lane: int, slot: int) -> None:
        if self._lane_slot[lane] == slot:
            return
        pool, names, io = self.pool, self.entry.packed.io, self._io
        for i in range(pool.layout.layers):
            for j, (past, present) in enumerate(((names.past_key, names.present_key),
                                                 (names.past_value, names.present_value))):
                if slot < 0:
                    buf = self._scratch[2 * i + j]
                    ptr, shape = buf.ctypes.data, list(buf.shape)
                else:
                    ptr, shape = pool.ptrs[2 * i + j] + slot * pool.slot_bytes, [1, *pool.slot_shape]
                io.bind_input(past.format(i=i, r=lane), "cpu", 0, pool.dtype, shape, ptr)
                io.bind_output(present.format(i=i, r=lane), "cpu", 0, pool.dtype, shape, ptr)
        self._lane_slot[lane] = slot

    def _assign_lanes(self, slots: list[int]) -> list[int]:
        """A lane per slot: the lane already bound to it where there is one, else a lane no slot
        of this call holds (scratch lanes first)."""
        have = {s: r for r, s in enumerate(self._lane_slot) if s >= 0}
        lanes = [have.get(s, -1) for s in slots]
        taken = {r for r in lanes if r >= 0}
        free = sorted((r for r in range(self.lanes) if r not in taken), key=lambda r: self._lane_slot[r] >= 0)
        for i, s in enumerate(slots):
            if lanes[i] < 0:
                lanes[i] = free.pop(0)
                self._bind_lane(lanes[i], s)
        return lanes

    # --- calls -------------------------------------------------------------------------------
    def groups(self, counts: list[int]) -> list[list[int]]:
        """Sequences of `counts` tokens, in order, into calls of at most `lanes` sequences and
        `max_tokens` tokens: -> the indices of each call's sequences."""
        out: list[list[int]] = []
        tokens = 0
        for i, n in enumerate(counts):
            if not out or len(out[-1]) == self.lanes or tokens + n > self.max_tokens:
                out.append([])
                tokens = 0
            out[-1].append(i)
            tokens += n
        return out

    def run_batch(self, batch: Batch) -> BatchOut:
        """The batch in packed calls (`groups`): one call where it fits. -> views of the output
        buffer for one call, copies for more (each call reuses the buffer)."""
        groups = self.groups([batch.count(i) for i in range(len(batch))])
        logits, ms = [None] * len(batch), [0.0] * len(batch)
        for g in groups:
            t0 = time.perf_counter()
            out = self.run_packed(batch.seqs(g))
            took = 1000 * (time.perf_counter() - t0)
            for i, rows in zip(g, out, strict=True):
                logits[i], ms[i] = rows if len(groups) == 1 else rows.copy(), took
        return BatchOut(logits, ms, None, len(groups))

    def room(self, counts: list[int]) -> tuple[int, int]:
        """What the batch's last call holds beside sequences of `counts` tokens (a fresh call's
        worth when it is full, or when there are none)."""
        last = self.groups(counts)[-1] if counts else []
        if len(last) == self.lanes or not last:
            return self.lanes, self.max_tokens
        return self.lanes - len(last), self.max_tokens - sum(counts[i] for i in last)

    def run_packed(self, seqs: list[tuple[int, np.ndarray, int, int | None]]) -> list[np.ndarray]:
        """seqs: (slot, tokens int64 [T], past_len, keep) per sequence, distinct slots, at most
        `lanes` of them; tokens go to positions [past_len, past_len + T) of the slot, written in
        place. -> per sequence logits [min(keep, T) or T, V] (views of one buffer)."""
        if not 0 < len(seqs) <= self.lanes:
            raise ValueError(f"{self.name}: a packed call takes 1..{self.lanes} sequences, got {len(seqs)}")
        total = sum(len(t) for _, t, _, _ in seqs)
        if total > self.max_tokens:
            raise ValueError(f"{self.name}: {total} tokens in one call, at most {self.max_tokens}")
        by_lane, keeps, o, n = self._layout(seqs, self._assign_lanes([s for s, _, _, _ in seqs]))
        self._unpack_rows(by_lane)
        rows = n
        if self.filler and o == 1:  # a packed axis of one token would send the projections to M = 1 kernels
            self._ids[1], self._unpack[1] = self._ids[0], self._unpack[0]
            o = 2
        if self.filler:  # the same for the LM head: one kept row is asked for twice
            rows = max(n, 2)
            self._keep[n:rows] = self._keep[0]
        self._bind_call(o, rows, {lane: got[2] for lane, got in by_lane.items()})
        self.session.run_with_iobinding(self._io)
        logits = self._logits[: n * self.vocab].reshape(n, self.vocab)
        return [logits[a : a + k] for a, k in keeps]

    def _layout(self, seqs, lanes):
        """Tokens onto the packed axis, each sequence's indices into its lane (a filler after a
        lone token when `filler`), its lane's write position and its kept logits rows.
        -> ({lane: (first packed index, tokens, lane width)}, [(first logits row, rows)],
        tokens, logits rows)."""
        by_lane: dict[int, tuple[int, int, int]] = {}
        keeps, o, n = [], 0, 0
        for (slot, tokens, past, keep), lane in zip(seqs, lanes, strict=True):
            T = len(tokens)
            width = max(T, 2) if self.filler else T
            if T < 1 or past + width > self.pool.capacity:
                raise ValueError(f"{self.name}: {T} tokens at {past} do not fit slot {slot} (max_seq_len "
                                 f"{self.max_seq_len}; a lone token needs the row after it)")
            k = T if keep is None else max(1, min(keep, T))
            if n + k > self.max_logits:
                raise ValueError(f"{self.name}: a call returns at most {self.max_logits} rows of logits")
            self._ids[o : o + T] = tokens
            idx = self._lane_idx[lane, :width]
            idx[:T] = np.arange(o, o + T)
            idx[T:] = o + T - 1  # filler: the lone token again, one row further
            self._seqlens[lane] = past + width - 1
            by_lane[lane] = (o, T, width)
            self._keep[n : n + k] = np.arange(o + T - k, o + T)
            keeps.append((n, k))
            o, n = o + T, n + k
        return by_lane, keeps, o, n

    def _unpack_rows(self, by_lane: dict[int, tuple[int, int, int]]) -> None:
        """Where each token's attention output sits in the lanes' outputs (lane order); unused
        lanes run two fillers over their scratch buffer."""
        row = 0
        for lane in range(self.lanes):
            got = by_lane.get(lane)
            if got is None:
                self._lane_idx[lane, :2] = 0
                if self._lane_slot[lane] >= 0:  # its two rows would land in a slot's rows 0 and 1
                    self._bind_lane(lane, -1)
                self._seqlens[lane] = 1
                row += 2
                continue
            first, T, width = got
            self._unpack[first : first + T] = np.arange(row, row + T)
            row += width

    def _bind_call(self, tokens: int, n: int, widths: dict[int, int]) -> None:
        io, names, src = self._io, self.entry.packed.io, self.entry.io
        io.bind_input(src.input_ids, "cpu", 0, np.int64, [1, tokens], self._ids.ctypes.data)
        for lane in range(self.lanes):
            io.bind_input(names.lane_index.format(r=lane), "cpu", 0, np.int64, [widths.get(lane, 2)],
                          self._lane_idx[lane].ctypes.data)
        io.bind_input(names.lane_seqlens, "cpu", 0, np.int32, [self.lanes], self._seqlens.ctypes.data)
        io.bind_input(names.unpack_index, "cpu", 0, np.int64, [tokens], self._unpack.ctypes.data)
        io.bind_input(names.logits_index, "cpu", 0, np.int64, [n], self._keep.ctypes.data)
        io.bind_output(src.logits, "cpu", 0, np.float32, [1, n, self.vocab], self._logits.ctypes.data)

    def run(self, slot: int, tokens: np.ndarray, past_len: int, hidden: np.ndarray | None = None,
            keep: int | None = None) -> np.ndarray:
        """One sequence (`PoolModel.run`): a packed call of one lane."""
        if not 0 < len(tokens) <= self.max_prefill_t:
            raise ValueError(f"{self.name}: {len(tokens)} tokens at {past_len} do not fit a call "
                             f"(1..{self.max_prefill_t} tokens, max_seq_len {self.max_seq_len})")
        return self.run_packed([(slot, np.asarray(tokens, dtype=np.int64), past_len, keep)])[0]

    def run_rows(self, lo: int, tokens: np.ndarray, pasts: np.ndarray, hidden: np.ndarray | None = None) -> np.ndarray:
        """One token for each of slots [lo, lo + b) (`PoolModel.run_rows`), in packed calls of
        up to `lanes` sequences. -> logits [b, V] (a copy when it took more than one call)."""
        seqs = [(lo + j, np.asarray(tokens[j : j + 1], dtype=np.int64), int(pasts[j]), None) for j in range(len(tokens))]
        if len(seqs) <= self.lanes:
            return np.concatenate(self.run_packed(seqs)) if len(seqs) > 1 else self.run_packed(seqs)[0]
        out = []
        for a in range(0, len(seqs), self.lanes):
            out.extend(x.copy() for x in self.run_packed(seqs[a : a + self.lanes]))
        return np.concatenate(out)
