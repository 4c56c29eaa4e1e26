"""One batch of sequences for one step of a pool model (runtime/backends/protocol.py
`PoolModel.run_batch`): llama.cpp's `llama_batch`, vLLM's flattened input with `query_start_loc`.

    tokens  int64 [N]      every sequence's tokens, one after another
    loc     int64 [S + 1]  sequence i holds tokens[loc[i] : loc[i + 1]] (query_start_loc)
    slots   int64 [S]      its KV slot (distinct within a batch)
    starts  int64 [S]      the position of its first token in the slot
    keeps   int64 [S]      how many of its last rows of logits come back (1 .. its tokens)
    hidden  [S] of float32 [T_i, H] | None: the feature input (a `takes_hidden` model; None: none)

A model runs a batch in as few calls as it can: a packed graph puts up to `lanes` sequences
into one call (runtime/backends/packed.py); a graph that runs one sequence per call splits the
batch (`PoolModel.run_batch`'s default). Whatever the split, a sequence's rows are the same bits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Batch:
    tokens: np.ndarray
    loc: np.ndarray
    slots: np.ndarray
    starts: np.ndarray
    keeps: np.ndarray
    hidden: list | None = None

    @classmethod
    def of(cls, seqs: list[tuple[int, np.ndarray, int, int]], hidden: list | None = None) -> Batch:
        """seqs: (slot, tokens int64 [T], start, keep) per sequence. hidden: per sequence
        float32 [T, H] or None (None for all: no feature input)."""
        counts = [len(t) for _, t, _, _ in seqs]
        if not seqs or min(counts) < 1:
            raise ValueError(f"a batch holds one or more sequences of one or more tokens, got {counts}")
        loc = np.zeros(len(seqs) + 1, dtype=np.int64)
        np.cumsum(counts, out=loc[1:])
        tokens = np.concatenate([np.asarray(t, dtype=np.int64) for _, t, _, _ in seqs])
        keeps = np.array([max(1, min(k, n)) for (_, _, _, k), n in zip(seqs, counts, strict=True)], dtype=np.int64)
        slots = np.array([s for s, _, _, _ in seqs], dtype=np.int64)
        if len(set(slots.tolist())) != len(slots):
            raise ValueError(f"a batch holds each slot once, got slots {slots.tolist()}")
        has_hidden = hidden is not None and any(h is not None for h in hidden)
        return cls(tokens, loc, slots, np.array([p for _, _, p, _ in seqs], dtype=np.int64), keeps,
                   list(hidden) if has_hidden else None)

    def __len__(self) -> int:
        return len(self.slots)

    def seq(self, i: int) -> np.ndarray:
        """Sequence i's tokens int64 [T_i] (a view)."""
        return self.tokens[self.loc[i] : self.loc[i + 1]]

    def count(self, i: int) -> int:
        return int(self.loc[i + 1] - self.loc[i])

    def feature(self, i: int) -> np.ndarray | None:
        return None if self.hidden is None else self.hidden[i]

    def seqs(self, idx) -> list[tuple[int, np.ndarray, int, int]]:
        """(slot, tokens, start, keep) of the sequences `idx`, in that order."""
        return [(int(self.slots[i]), self.seq(i), int(self.starts[i]), int(self.keeps[i])) for i in idx]


@dataclass
class BatchOut:
    """What one batch gave back, per sequence in the batch's order."""

    logits: list  # float32 [keep_i, V] (all T_i rows where the graph has no logits_to_keep input);
    #               views of the model's output buffer when the batch took one call, else copies
    ms: list  # the wall time of the call that computed the sequence (ms)
    hidden: list | None = None  # float32 [T_i, H] copies: every row's hidden state (has_hidden_out)
    calls: int = 0  # model calls the batch took
