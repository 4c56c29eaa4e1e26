"""The model calls a step makes, one sequence or many rows at once, on the pool models
(runtime/backends/protocol.py `PoolModel`).

Every call reserves its rows in the model's track before running and advances the track after,
so the KV pool's bookkeeping and the buffers never disagree; the target's calls record the EAGLE
features of the rows they wrote. Logits come back as views of the model's output buffer (valid
until the next call on that model) from `one`, and as copies from `rows` and `drafts` (several
requests read them after the call).
"""

from __future__ import annotations

import time

import numpy as np

from ..drafters import DraftCall
from .counters import Counters
from .request import Request


class ModelCalls:
    def __init__(self, target, draft, features: np.ndarray | None, counters: Counters):
        """features: [slots, S_max, H] the target's hidden state per slot and position (EAGLE
        drafts), or None."""
        self.target, self.draft = target, draft
        self.features = features
        self.counters = counters

    def _count(self, model) -> None:
        if model is self.target:
            self.counters.target_calls += 1
        else:
            self.counters.draft_calls += 1

    def one(self, model, r: Request, tokens, hidden=None, keep: int | None = None) -> np.ndarray:
        """One sequence's call of T tokens on `model` at its track's length in `r`'s slot.
        -> logits view [T or keep, V] (valid until the next call on `model`). A target narrower
        than its `min_t` runs widened (`_widen`): the rows asked for are what a wide call gives."""
        tokens = np.asarray(tokens, dtype=np.int64)
        n = len(tokens)
        pos = model.pool.reserve(model.track, r.slot, n)
        start, ids, before = pos, tokens, 0
        if model is self.target and n < model.min_t:
            start, ids, before = self._widen(model, r, tokens, pos)
        elif self._last_row(model, n, pos):
            start, ids, before = self._widen(model, r, tokens, pos, 2)
        wide = len(ids)
        logits = model.run(r.slot, ids, start, hidden, None if keep is None else min(n, keep) + wide - n - before)
        if wide > n:  # the rows of `tokens` only: logits holds the call's last len(logits) rows
            w = n if keep is None or len(logits) == wide else min(n, keep)
            lo = before + n - w - (wide - len(logits))
            logits = logits[lo : lo + w]
        if model is self.target and self.features is not None:
            self.features[r.slot, pos : pos + n] = model.hidden[before : before + n]
        self._count(model)
        model.pool.advance(model.track, r.slot, n)
        return logits

    @staticmethod
    def _last_row(model, n: int, pos: int) -> bool:
        """An exact packed model's lone token at the pool's last row: its lane has no row for the
        filler after it (runtime/backends/packed.py), so the call takes the token before too."""
        return model.exact and n == 1 and pos + 2 > model.pool.capacity

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

    def rows(self, model, reqs: list[Request], tokens, hidden=None) -> list[tuple[np.ndarray, np.ndarray | None]]:
        """One call of one token for each of `reqs` on `model`, over the smallest slot range that
        holds them; slots in the range that are not served write a filler token at their spare
        row. -> per request (logits row [V], hidden row [H] | None), copies."""
        pool = model.pool
        by_slot = {r.slot: i for i, r in enumerate(reqs)}
        lo, hi = min(by_slot), max(by_slot) + 1
        toks = np.zeros(hi - lo, dtype=np.int64)
        pasts = np.empty(hi - lo, dtype=np.int64)
        feats = np.zeros((hi - lo, model.hidden_size), dtype=np.float32) if model.takes_hidden else None
        for s in range(lo, hi):
            i = by_slot.get(s)
            if i is None:
                pasts[s - lo] = pool.spare_row(s)
                continue
            toks[s - lo] = tokens[i]
            pasts[s - lo] = pool.reserve(model.track, s, 1)
            if feats is not None and hidden[i] is not None:
                feats[s - lo] = np.reshape(hidden[i], -1)
        logits = model.run_rows(lo, toks, pasts, feats)
        record = model is self.target and self.features is not None
        out = []
        for r in reqs:
            row = r.slot - lo
            if record:
                self.features[r.slot, pasts[row]] = model.hidden[row]
            pool.advance(model.track, r.slot, 1)
            out.append((logits[row].copy(), model.hidden[row].copy() if model.has_hidden_out else None))
        self._count(model)
        return out

    def packed(self, model, entries: list[tuple], keep: int | None = None) -> list[np.ndarray]:
        """One packed call (runtime/backends/packed.py) holding every entry's tokens at its
        track's length in its slot: at most `model.lanes` entries, each (request, tokens) or
        (request, tokens, keep) (its last `keep` rows of logits; default `keep`, None: all).
        -> per entry logits [T or keep, V], views of the model's output buffer (valid until the
        next call on `model`)."""
        pool = model.pool
        seqs = []
        for r, tokens, *own in entries:
            tokens = np.asarray(tokens, dtype=np.int64)
            k = own[0] if own else keep
            pos, ids = pool.reserve(model.track, r.slot, len(tokens)), tokens
            if self._last_row(model, len(tokens), pos):  # the token before goes first: its row is not kept
                pos, ids, _ = self._widen(model, r, tokens, pos, 2)
            seqs.append((r.slot, ids, pos, len(tokens) if k is None else min(k, len(tokens))))
        out = model.run_packed(seqs)
        for r, tokens, *_ in entries:
            pool.advance(model.track, r.slot, len(tokens))
        self._count(model)
        return out

    def drafts(self, calls: list[tuple[Request, DraftCall]]) -> list:
        """The draft model's calls of one draft step: the one-token calls of many requests in one
        batched call where the model takes rows, the others one by one.
        -> per call (logits row [V], hidden row [H] | None), or the exception that call raised."""
        model = self.draft
        if model.packs:
            return self._draft_packed(model, calls)
        out: list = [None] * len(calls)
        ones = [i for i, (_, c) in enumerate(calls) if len(c.tokens) == 1]
        if model.batch_rows and len(ones) > 1:
            rows = self.rows(model, [calls[i][0] for i in ones], [calls[i][1].tokens[0] for i in ones],
                             [calls[i][1].hidden for i in ones])
            for i, res in zip(ones, rows, strict=True):
                out[i] = res
        for i, (r, c) in enumerate(calls):
            if out[i] is None:
                out[i] = self._draft_one(model, r, c)
        return out

    def _draft_packed(self, model, calls: list[tuple[Request, DraftCall]]) -> list:
        """A packed draft: every request's call of this draft step, catch-up reads of several
        tokens included, in packed calls of at most `lanes` requests and `max_tokens` tokens.
        A failed call is retried request by request, so a failure ends only its own request."""
        out: list = [None] * len(calls)
        group: list[int] = []
        tokens = 0  # in the group so far
        for i, (_, c) in enumerate(calls):
            if group and (len(group) == model.lanes or tokens + len(c.tokens) > model.max_tokens):
                self._draft_group(model, calls, group, out)
                group, tokens = [], 0
            group.append(i)
            tokens += len(c.tokens)
        if group:
            self._draft_group(model, calls, group, out)
        return out

    def _draft_group(self, model, calls, group: list[int], out: list) -> None:
        try:
            t0 = time.perf_counter()
            reads = [self._reads_prompt(model, calls[i][0]) for i in group]
            logits = self.packed(model, [(calls[i][0], calls[i][1].tokens) for i in group], keep=1)
            ms = 1000 * (time.perf_counter() - t0)
            for i, rows, reading in zip(group, logits, reads, strict=True):
                out[i] = (rows[-1].copy(), None)
                if reading:  # a separate draft reads the prompt in its first rounds: the call's time
                    calls[i][0].stats.draft_prefill_ms += ms
                    calls[i][0].stats.prefill_ms += ms
        except Exception as e:  # noqa: BLE001 - whose call was it? each one alone
            if len(group) == 1:
                out[group[0]] = e
                return
            for i in group:
                self._draft_group(model, calls, [i], out)

    @staticmethod
    def _reads_prompt(model, r: Request) -> bool:
        """Whether the draft's call for `r` still reads its prompt: its rows start at the
        drafter's `offset` (a windowed draft's first row is a later token)."""
        return r.drafter.offset + model.pool.length(model.track, r.slot) < len(r.prompt)

    def _draft_one(self, model, r: Request, c: DraftCall):
        try:
            reads_prompt = self._reads_prompt(model, r)
            t0 = time.perf_counter()
            logits = self.one(model, r, c.tokens, c.hidden, c.keep)
            if reads_prompt:  # a separate draft reads the prompt in its first round
                ms = 1000 * (time.perf_counter() - t0)
                r.stats.draft_prefill_ms += ms
                r.stats.prefill_ms += ms
            return logits[-1].copy(), model.hidden[-1].copy() if model.has_hidden_out else None
        except Exception as e:  # noqa: BLE001 - this request's call: the caller ends it alone
            return e
