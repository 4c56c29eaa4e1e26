"""What the engine asks of a model, and what a single-sequence backend offers (as code:
`typing.Protocol`s, checked against every backend and the test fake by tests/runtime/backends).

Everything the engine reads of a model is declared here; what only some models have (packed
calls) is declared with its default, which a model takes by subclassing the protocol (PEP 544's
explicit subclassing: the class stays a plain class of its own, the defaults are inherited).

Buffers: every array a model returns is a view into its own output buffers, allocated once and
owned by the model; it stays valid until the next call on the same model (read or copy it
before). The KV buffers belong to the `KVPool` the model was built over; the model writes the
rows of a call in place and never moves a track's length: the caller reserves rows in the pool
before a call and advances the track after (runtime/engine/calls.py does both).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

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
    # optional: packed calls (runtime/backends/packed.py `PackedModel`)
    packs: bool = False  # run_packed takes several sequences' tokens in one call
    lanes: int = 1  # sequences one packed call holds
    max_tokens: int = 0  # tokens one packed call holds, every sequence's together (0: no packed calls)
    exact: bool = False  # a lone token runs with a filler token after it, so that its rows are what any
    #                     wider call computes (a packed target; a packed draft needs no invariance)
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

    def run_packed(self, seqs: list[tuple[int, np.ndarray, int, int | None]]) -> list[np.ndarray]:
        """Only where `packs`: seqs (slot, tokens int64 [T], past_len, keep) per sequence, distinct
        slots, at most `lanes` of them and `max_tokens` tokens in all, each written at positions
        [past_len, past_len + T) of its slot. -> per sequence float32 [min(keep, T) or T, V],
        views of one output buffer."""
        raise NotImplementedError(f"{type(self).__name__} does not pack sequences into one call (packs=False)")


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
