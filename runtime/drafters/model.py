"""Draft with a small model over a KV pool track: its own pool, or (a self-draft: a quantized
copy of the target, same KV layout) the target's.

Shared pool (self-draft): the draft's rows of committed tokens are the target's own K/V, taken
by moving a length pointer (`KVPool.adopt`), so the draft never computes the prompt (the int8
draft's prompt pass cost more than the fp32 target's, docs/benchmarks.md) and drafts from the
target's exact context. It writes only rows at or past the target's length — its proposals and
the last committed token, which the target has not consumed yet — and the next verification
call rewrites those rows before attending to them: that is what keeps the target exact.
Own pool (another model): the draft catches up on the committed tokens it lacks, in chunks.
A window bounds that: when more than `window` tokens are missing (a long prompt, a long run of
n-gram rounds), the draft drops its rows and reads only the last `window` committed tokens, at
positions counted from there (rotary attention sees the same relative positions); its row i
then holds token `offset + i` (the pool keeps the offset with the rows: `KVPool.set_offset`). Its pool may hold fewer rows than the target's (the loader gives a
windowed draft its window and a run after it, runtime/bundle/memory.py `windowed_rows`): when a
round would outgrow them, it reads the window again from the end. Reading a 2k-token prompt cost the 0.5B coder draft 9.3 s on
this CPU, more than its drafting saved (docs/benchmarks.md §18). At the request's end its rows
stay with their offset: a conversation's next turn (an agent's, with its tools prompt) reuses
them as far as its prompt shares the tokens they hold, and reads only what is new.
Proposals stay proposals either way: verification checks every token against the target, so a
window changes acceptance, never the output.
"""

from __future__ import annotations

import numpy as np

from ..sampling.draws import Draws, SamplingConfig, probs
from .proposal import DraftCall, Proposal
from .protocol import Drafter


class ModelDrafter(Drafter):
    name = "model"

    def __init__(self, model, slot: int, target_track: str | None = None, process=None,
                 window: int | None = None):
        """model: the draft model (runtime/backends/ort.py OrtModel or a one-slot adapter);
        target_track: the target's track when the draft shares its pool (self-draft);
        process(logits [V], proposed so far) -> logits: the request's penalties and grammar mask
        (runtime/sampling/processing.py); proposals are chosen from the processed distribution, which is
        then the q verification divides by. window: the most committed tokens a draft with its own
        pool reads to catch up (None: all of them)."""
        if window is not None and window < 1:
            raise ValueError(f"a draft window must be at least 1 token, got {window}")
        self.model, self.slot, self.pool = model, slot, model.pool
        self.window = window if target_track is None else None  # a shared pool adopts, never reads
        self.process = process
        self.track = model.track
        self.target_track = target_track
        others = set(self.pool.tracks) - {self.track}
        if target_track is None and others:
            raise ValueError(f"this draft writes into a KV pool shared with {sorted(others)}: pass the target's "
                             "track (target_track=...) so it adopts the target's rows instead of overwriting them")
        self._pending: list[np.ndarray] = []  # catch-up chunks still to feed

    @property
    def length(self) -> int:
        return self.pool.length(self.track, self.slot)

    @property
    def offset(self) -> int:
        """The committed token at row 0 (> 0 once windowed; the pool keeps it with the rows)."""
        return self.pool.offset(self.track, self.slot)

    def route(self, seq) -> str:
        return self.name

    def start(self, seq, k: int, cfg: SamplingConfig, rng: Draws, policy=None) -> DraftCall:
        """Feed the committed tokens the cache lacks (one normally; two after a round where
        every proposal was accepted; many after n-gram rounds or at the first round of a
        separate draft); the last row's logits give the first proposal."""
        if self.target_track is not None:  # the committed rows are the target's
            self.pool.adopt(self.track, self.slot, len(seq) - 1, self.target_track)
        self._k, self._cfg, self._rng, self._policy = k, cfg, rng, policy
        self._n0 = len(seq)  # proposal j is the token after len(seq) + j
        self._want_conf = policy is not None
        self._toks, self._q, self._confs = [], [], []
        if self.window is not None and self._rewindow(len(seq), k):
            self.pool.rewind(self.track, self.slot, 0)
            self.pool.set_offset(self.track, self.slot, len(seq) - self.window)
        lag = np.asarray(seq[self.offset + self.length :], dtype=np.int64)
        c = self.model.max_prefill_t
        self._pending = [lag[s : s + c] for s in range(0, len(lag), c)]
        return DraftCall(self._pending.pop(0), keep=1)

    def _rewindow(self, n: int, k: int) -> bool:
        """Read the window again: more than it is missing, or this round's rows (the committed
        tokens from `offset` and k proposals) would not fit the pool."""
        return n - self.offset - self.length > self.window or n - self.offset + k > self.pool.capacity

    def lag(self, seq) -> int:
        """Committed tokens the next round reads before its first proposal (a windowed draft
        reads at most its window)."""
        if self.target_track is not None:
            return 0
        missing = len(seq) - self.offset - self.length
        return missing if self.window is None or missing <= self.window else self.window

    def take(self, logits: np.ndarray, hidden=None) -> DraftCall | Proposal:
        if self._pending:
            return DraftCall(self._pending.pop(0), keep=1)
        cfg = self._cfg
        if self.process is not None:
            logits = self.process(logits, self._toks)
        if not np.isfinite(logits.max()):  # nothing left to propose (a vocabulary-subset head
            return self._proposal()           # whose every token a grammar or bias ruled out)
        if cfg.greedy:
            t = int(logits.argmax())
            if self._want_conf:
                self._confs.append(_margin(logits, t))
        else:
            qj = probs(logits, cfg)
            t = self._rng.pick(qj, self._n0 + len(self._toks))  # coupled: argmax q / E at that position
            if not self._rng.coupled:  # rejection sampling divides by q; coupled verification matches tokens
                self._q.append(qj)
            self._confs.append(float(qj[t]))
        self._toks.append(t)
        j = len(self._toks) - 1
        done = len(self._toks) >= self._k or (self._want_conf and not self._policy.continue_after(j, self._confs))
        if not done:
            return self._next_call(t)
        return self._proposal()

    def _proposal(self) -> Proposal:
        q = np.stack(self._q) if self._q else None  # None: greedy or coupled (verified by token match)
        return Proposal(np.asarray(self._toks, dtype=np.int64), q, self._confs, self.name)

    def _next_call(self, tok: int) -> DraftCall:
        return DraftCall(np.array([tok], dtype=np.int64))

    def commit(self, seq_len: int) -> None:
        # cache rows hold seq[:n] + proposals[:k-1]; the valid prefix is the committed part
        # (shared: the target's rows from here on; the next start adopts them)
        self.pool.rewind(self.track, self.slot, min(self.length, seq_len - 1 - self.offset))

    def release(self) -> None:
        """The request ends: the rows stay, with their offset in the pool (module docstring)."""


def _margin(logits: np.ndarray, top: int) -> float:
    """Greedy confidence: 1 - p2/p1 of the draft's two best tokens (0 = a tie, 1 = decisive).
    A greedy draft token is rejected where the target's best token differs; a draft close to
    the target (int8 self-draft) differs almost only where its own top two are close, whatever
    the top token's probability. (Top-1 probability as the signal left the calibration table
    flat for such a draft, and rounds of k = 14 ran to the end on tokens it then lost.)"""
    best = logits[top]
    logits[top] = -np.inf
    second = logits.max()
    logits[top] = best
    return float(1.0 - np.exp(second - best))
