"""The model calls a step makes, on the pool models (runtime/backends/protocol.py `PoolModel`):
one batch per call site (runtime/backends/batch.py), whatever the model does with it.

`batch` reserves every entry's rows in the model's track before the call and advances the
tracks after, so the KV pool's bookkeeping and the buffers never disagree; the target's calls
record the EAGLE features of the rows they wrote. A target narrower than its `min_t` (and an
exact packed model's lone token at the pool's last row) gets its entry widened here, so the
model sees only calls whose rows are what any call computes. A batch that fails is run again
entry by entry, so a failure ends only the request whose own call fails.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..backends.batch import Batch
from ..drafters import DraftCall
from .counters import Counters
from .request import Request


@dataclass
class Entry:
    """One request's sequence in a batch: `tokens` at its track's length; its last `keep` rows
    of logits come back (None: all); hidden float32 [T, H]: the feature input (EAGLE)."""

    r: Request
    tokens: np.ndarray
    keep: int | None = None
    hidden: np.ndarray | None = None


@dataclass
class Rows:
    """An entry's part of a batch: logits [T or keep, V] (a view of the model's output buffer
    where the batch took one call: read it before the next call on that model), the hidden
    states of its rows [T, H] (has_hidden_out models) and the time of the call (ms)."""

    logits: np.ndarray
    hidden: np.ndarray | None
    ms: float


class ModelCalls:
    def __init__(self, target, draft, features: np.ndarray | None, counters: Counters):
        """features: [slots, S_max, H] the target's hidden state per slot and position (EAGLE
        drafts), or None."""
        self.target, self.draft = target, draft
        self.features = features
        self.counters = counters

    def batch(self, model, entries: list[Entry]) -> list[Rows | Exception]:
        """One batch of `entries` (distinct requests) on `model`. -> per entry its Rows, or
        the exception its own call raised (after a failed batch each entry runs alone)."""
        try:
            return list(self._batch(model, entries))
        except Exception as e:  # noqa: BLE001 - whose entry was it? each alone
            if len(entries) == 1:
                return [e]
            return [self._own(model, x) for x in entries]

    def _own(self, model, x: Entry) -> Rows | Exception:
        """An entry in a call of its own; its logits copied (the next call reuses the buffer)."""
        res = self.batch(model, [x])[0]
        if not isinstance(res, Exception):
            res.logits = res.logits.copy()
        return res

    def _batch(self, model, entries: list[Entry]) -> list[Rows]:
        pool = model.pool
        seqs, hidden, shapes = [], [], []
        for x in entries:
            tokens = np.asarray(x.tokens, dtype=np.int64)
            n = len(tokens)
            pos = pool.reserve(model.track, x.r.slot, n)
            start, ids, before = pos, tokens, 0
            if model is self.target and n < model.min_t:
                start, ids, before = self._widen(model, x.r, tokens, pos)
            elif self._last_row(model, n, pos):
                start, ids, before = self._widen(model, x.r, tokens, pos, 2)
            wide = len(ids)
            keep = wide if x.keep is None else min(n, x.keep) + wide - n - before
            seqs.append((x.r.slot, ids, start, keep))
            hidden.append(x.hidden)
            shapes.append((pos, n, wide, before))
        out = model.run_batch(Batch.of(seqs, hidden))
        results = []
        record = model is self.target and self.features is not None
        for i, (x, (pos, n, wide, before)) in enumerate(zip(entries, shapes, strict=True)):
            logits = out.logits[i]
            if wide > n:  # the rows of the entry's tokens only: logits holds the call's last len(logits) rows
                w = n if x.keep is None or len(logits) == wide else min(n, x.keep)
                lo = before + n - w - (wide - len(logits))
                logits = logits[lo : lo + w]
            h = None if out.hidden is None else out.hidden[i][before : before + n]
            if record:
                self.features[x.r.slot, pos : pos + n] = h
            pool.advance(model.track, x.r.slot, n)
            results.append(Rows(logits, h, out.ms[i]))
        if model is self.target:
            self.counters.target_calls += out.calls
        else:
            self.counters.draft_calls += out.calls
        return results

    @staticmethod
    def _last_row(model, n: int, pos: int) -> bool:
        """A filler-writing packed model's lone token at the pool's last row: its lane has no row
        for the filler after it (runtime/backends/packed.py), so the call takes the token before too."""
        return model.filler and n == 1 and pos + 2 > model.pool.capacity

    @staticmethod
    def _widen(model, r: Request, tokens: np.ndarray, pos: int, width: int | None = None) -> tuple[int, np.ndarray, int]:
        """A call of `width` (default `model.min_t`) tokens holding `tokens` at `pos`: -> (start,
        ids, rows before). Forward, a filler after them (its row lies past the track: stale,
        overwritten by the next call); at the end of the buffer, backward: the row before
        recomputed, which writes what a wide call wrote there before (every row of such a
        target comes from wide calls)."""
        pad = (width or model.min_t) - len(tokens)
        if pos + len(tokens) + pad <= model.max_seq_len:
            return pos, np.concatenate((tokens, np.repeat(tokens[-1:], pad))), 0
        if pos < pad:
            raise ValueError(f"{model.name}: no room for a {len(tokens) + pad}-token call at {pos}")
        return pos - pad, np.concatenate((np.asarray(r.seq[pos - pad : pos], dtype=np.int64), tokens)), pad

    def drafts(self, calls: list[tuple[Request, DraftCall]]) -> list:
        """The draft model's calls of one draft step, every request's in one batch (catch-up
        reads of several tokens included). -> per call (logits row [V], hidden row [H] | None),
        copies, or the exception that request's call raised."""
        model = self.draft
        reads = [self._reads_prompt(model, r) for r, _ in calls]
        results = self.batch(model, [Entry(r, c.tokens, c.keep, c.hidden) for r, c in calls])
        out = []
        for (r, _), res, reading in zip(calls, results, reads, strict=True):
            if isinstance(res, Exception):
                out.append(res)
                continue
            if reading:  # a separate draft reads the prompt in its first rounds: the call's time
                r.stats.draft_prefill_ms += res.ms
                r.stats.prefill_ms += res.ms
            out.append((res.logits[-1].copy(), None if res.hidden is None else res.hidden[-1].copy()))
        return out

    @staticmethod
    def _reads_prompt(model, r: Request) -> bool:
        """Whether the draft's call for `r` still reads its prompt: its rows start at the
        drafter's `offset` (a windowed draft's first row is a later token)."""
        return r.drafter.offset + model.pool.length(model.track, r.slot) < len(r.prompt)
