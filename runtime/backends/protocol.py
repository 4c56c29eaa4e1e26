"""What the engine asks of a model, and what a single-sequence backend offers (as code:
`typing.Protocol`s, checked against every backend and the test fake by tests/runtime/backends).

Everything the engine reads of a model is declared here; what only some models have is declared
with its default, which a model takes by subclassing the protocol (PEP 544's explicit
subclassing: the class stays a plain class of its own, the defaults are inherited).

The engine drives every model through one call, `run_batch` (runtime/backends/batch.py: flat
tokens, and per sequence its slot, start, count and kept rows). A model that packs sequences
into one call overrides it (runtime/backends/packed.py); the default splits the batch into the
calls every model has: one `run_rows` call for its one-token sequences where the graph takes
rows, then a `run` call per other sequence.

Buffers: every array a model returns is a view into its own output buffers, allocated once and
owned by the model; it stays valid until the next call on the same model (read or copy it
before). The KV buffers belong to the `KVPool` the model was built over; the model writes the
rows of a call in place and never moves a track's length: the caller reserves rows in the pool
before a call and advances the track after (runtime/engine/calls.py does both).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from .batch import Batch, BatchOut
from .kvpool import KVPool


class NonFiniteLogits(RuntimeError):
    """A model produced NaN or inf logits: the model or its export is broken."""


def check_finite(logits: np.ndarray, what: str = "target") -> None:
    if not np.isfinite(logits.max()):  # max propagates NaN, so one reduction covers NaN and inf
        raise NonFiniteLogits(f"{what} produced non-finite logits (NaN/inf): the model or its export is broken")


@runtime_checkable
class PoolModel(Protocol):
    """One graph over the slots of a KV pool: what the scheduler drives (runtime/backends/ort.py
    `OrtModel`; `SingleSequenceModel` over a backend with its own buffers; tests/fakes.py)."""

    pool: KVPool  # the KV buffers this model reads and writes (a self-draft shares its target's)
    track: str  # this model's name in the pool's per-slot length bookkeeping
    name: str
    vocab: int  # V, logits columns
    max_seq_len: int  # rows per slot (the pool's capacity)
    max_t: int  # widest verification call (the manifest's max_tokens_per_call)
    max_prefill_t: int  # widest call at all (prompt chunks), >= max_t
    min_t: int  # narrowest call whose rows are what any wider call computes for them (1, or 2 for
    #           int8-activation graphs, whose one-token calls take other kernels: numerics_min_t)
    batch_rows: bool  # run_rows takes b > 1 rows (the `ort` lowering's GroupQueryAttention)
    kernels: bool  # the graph runs on specrt's own operators (runtime/kernels; a packed kernel graph)
    hidden_size: int  # H of the EAGLE feature tensors (0 without them)
    takes_hidden: bool  # the graph takes a feature input (an EAGLE draft head)
    has_hidden_out: bool  # the graph outputs final-norm hidden states (a target with an EAGLE draft)
    hidden: np.ndarray | None  # float32 [rows, H] view: the last call's hidden states (has_hidden_out)
    # optional: calls of several sequences (runtime/backends/packed.py `PackedModel`)
    lanes: int = 1  # sequences of any width one call holds
    max_tokens: int = 0  # tokens one call holds, every sequence's together (0: a call holds one
    #                     sequence's; the cost model then prices a call per verifying row)
    filler: bool = False  # a lone token runs with a filler token after it, so that its rows are what any
    #                      wider call computes (a packed target on onnxruntime's operators; specrt's
    #                      kernel graphs compute a row the same at any width; a draft needs no invariance)
    graph: Path | None = None  # the graph file it runs where that is not the bundle's own (a packed
    #                            graph: the cost probe's cache key names it); None: the manifest's graph

    def run(self, slot: int, tokens: np.ndarray, past_len: int, hidden: np.ndarray | None = None,
            keep: int | None = None) -> np.ndarray:
        """One sequence: tokens int64 [T] (1 <= T <= max_prefill_t) at positions
        [past_len, past_len + T) of `slot`, KV rows written in place. hidden float32 [T, H]: the
        feature input (takes_hidden graphs; None reuses the buffer). -> float32 [n, V] view, the
        last n = min(keep, T) positions (all T where the graph has no logits_to_keep input)."""
        ...

    def run_rows(self, lo: int, tokens: np.ndarray, pasts: np.ndarray,
                 hidden: np.ndarray | None = None) -> np.ndarray:
        """One token for each of slots [lo, lo + b): tokens int64 [b] at positions pasts int64 [b].
        hidden float32 [b, H]. -> float32 [b, V] view. b > 1 only where batch_rows."""
        ...

    def run_batch(self, batch: Batch) -> BatchOut:
        """Every sequence of `batch`, each written at its rows [start, start + T) of its slot.
        -> BatchOut: per sequence its last `keep` rows of logits. This default splits the batch:
        one `run_rows` call over the slot range of its one-token sequences (where `batch_rows`
        and there are two or more; a slot of the range that is not one of them gets a filler
        at its spare row, which its own call, made after, rewrites), then one `run` call per
        other sequence, in order. Results are copies (each call reuses the output buffer)."""
        n = len(batch)
        logits, ms, hidden = [None] * n, [0.0] * n, [None] * n if self.has_hidden_out else None
        ones = [i for i in range(n) if batch.count(i) == 1]
        calls = 0
        if self.batch_rows and len(ones) > 1:
            calls += self._rows_of(batch, ones, logits, ms, hidden)
        for i in range(n):
            if logits[i] is None:
                slot, tokens, start, keep = batch.seqs([i])[0]
                t0 = time.perf_counter()
                out = self.run(slot, tokens, start, batch.feature(i), keep)
                ms[i] = 1000 * (time.perf_counter() - t0)
                logits[i] = out.copy()
                if hidden is not None:
                    hidden[i] = self.hidden[: len(tokens)].copy()
                calls += 1
        return BatchOut(logits, ms, hidden, calls)

    def _rows_of(self, batch: Batch, ones: list[int], logits: list, ms: list, hidden: list | None) -> int:
        """The one-token sequences `ones` of `batch` in one `run_rows` call over their slot range."""
        by_slot = {int(batch.slots[i]): i for i in ones}
        lo, hi = min(by_slot), max(by_slot) + 1
        toks = np.zeros(hi - lo, dtype=np.int64)
        pasts = np.empty(hi - lo, dtype=np.int64)
        feats = np.zeros((hi - lo, self.hidden_size), dtype=np.float32) if self.takes_hidden else None
        for s in range(lo, hi):
            i = by_slot.get(s)
            if i is None:
                pasts[s - lo] = self.pool.spare_row(s)
                continue
            toks[s - lo], pasts[s - lo] = batch.seq(i)[0], batch.starts[i]
            if feats is not None and batch.feature(i) is not None:
                feats[s - lo] = np.reshape(batch.feature(i), -1)
        t0 = time.perf_counter()
        out = self.run_rows(lo, toks, pasts, feats)
        took = 1000 * (time.perf_counter() - t0)
        for s, i in by_slot.items():
            logits[i], ms[i] = out[s - lo : s - lo + 1].copy(), took
            if hidden is not None:
                hidden[i] = self.hidden[s - lo : s - lo + 1].copy()
        return 1

    def room(self, counts: list[int]) -> tuple[int, int]:
        """How many more sequences, of how many tokens in all, a batch of sequences of `counts`
        tokens takes beside them in its last call (the scheduler fills it with prompt chunks).
        This default (a call per sequence: each added one is a call of its own whatever the
        batch) answers a chunk per slot and one widest call's worth of tokens."""
        return self.pool.slots, self.max_prefill_t


@runtime_checkable
class Backend(Protocol):
    """One graph running one sequence whose KV buffers it owns or binds itself (`OrtBackend`,
    `TrtBackend`): what `SingleSequenceModel` and the export-validation harness
    (runtime/backends/harness.py) drive."""

    vocab: int
    max_seq_len: int
    max_t: int
    max_prefill_t: int
    hidden_size: int
    takes_hidden: bool
    has_hidden_out: bool
    hidden: np.ndarray | None

    def run(self, tokens: np.ndarray, past_len: int, hidden: np.ndarray | None = None,
            keep: int | None = None) -> np.ndarray:
        """tokens int64 [T] at positions [past_len, past_len + T) -> float32 [n, V] view (as
        `PoolModel.run`, for its one sequence)."""
        ...
