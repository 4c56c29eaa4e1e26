"""llama.cpp's `infill` sampler (src/llama-sampler.cpp `llama_sampler_infill_apply`), which
llama.vscode and llama.vim put after top-k and top-p: it ends a completion when the end of text
is likely enough and otherwise keeps only the texts the model clearly prefers.

On one row's candidates (the tokens top-k / top-p kept, most probable first):
1. If 3 · P(end) · n > P(text), with n the candidates llama.cpp holds (k after top-k, the
   nucleus after top-p, else the vocabulary), only the end-of-generation tokens are kept.
2. Otherwise tokens whose text is a prefix of another's are merged: for each candidate in order,
   each later-or-earlier candidate whose piece starts with its piece is folded into whichever of
   the two is more probable (that one's merged probability grows, the other leaves). llama.cpp
   compares pieces without special tokens (control tokens have none, so they never merge).
3. Text tokens whose merged probability is under 0.2 leave; if no text token is left, the row
   is the end token alone. Then, renormalized, text tokens under 1 / (texts left + 1) leave.
The row's final distribution is the *unmerged* probabilities of the tokens left, renormalized:
llama.cpp's last step (`dist`) draws from the survivors' logits again, so merging decides who
stays, not how likely each is.

A pure function of one row: target and draft rows go through it alike (runtime/sampling/draws.py
`probs`), so speculation stays exact. Greedy requests never reach it: this server applies
temperature before it, and after greedy's one candidate it changes nothing.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

import numpy as np

FIRST_CUT = 0.2  # llama.cpp's first threshold on merged probabilities


@dataclass(frozen=True, eq=False)
class InfillSampler:
    """One vocabulary's infill filter. pieces: each id's bytes without special tokens
    (runtime/bundle/pieces.py `Pieces.table(vocab, special=False)`); eog: the ids that end
    generation (the tokenizer's `eog_ids`); eot: the token a row collapses to when no text is left."""

    pieces: tuple[bytes, ...]
    eog: frozenset[int]
    eot: int

    def __call__(self, p: np.ndarray, truncated: bool) -> np.ndarray:
        """p [..., V] float64 rows (after temperature, top-k, top-p; each sums to 1) -> the rows
        llama.cpp's infill sampler leaves, each summing to 1. truncated: whether top-k or top-p
        cut the candidates (else llama.cpp holds the whole vocabulary: its n in step 1)."""
        flat = p.reshape(-1, p.shape[-1])
        out = np.stack([self._row(row, truncated) for row in flat])
        return out.reshape(p.shape)

    def _row(self, row: np.ndarray, truncated: bool) -> np.ndarray:
        cand = np.flatnonzero(row > 0)
        cand = cand[np.lexsort((cand, -row[cand]))]  # most probable first, ties by id
        pc = row[cand]
        eog = np.fromiter((int(t) in self.eog for t in cand), dtype=bool, count=len(cand))
        n = len(cand) if truncated else len(row)
        out = np.zeros_like(row)
        if 3 * pc[eog].sum() * n > pc[~eog].sum():
            keep = eog
        else:
            merged = self._merge(cand, pc)
            keep = eog | (merged >= FIRST_CUT)
            texts = int((keep & ~eog).sum())
            if texts == 0:
                out[self.eot] = 1.0
                return out
            m = merged / merged[keep].sum()
            keep &= eog | (m >= 1.0 / (texts + 1))
        out[cand[keep]] = pc[keep]
        return out / out.sum()

    def _merge(self, cand: np.ndarray, pc: np.ndarray) -> np.ndarray:
        """Step 2 in llama.cpp's order: candidates i0 then i1 by index, each merge changing
        what the later comparisons see. -> the merged probabilities (0: merged away)."""
        merged = pc.copy()
        dead = np.zeros(len(cand), dtype=bool)
        for i0, partners in enumerate(self._partners(cand)):
            for i1 in partners:
                if dead[i0]:
                    break
                if dead[i1]:
                    continue
                dst, src = (i1, i0) if merged[i1] > merged[i0] else (i0, i1)
                merged[dst] += merged[src]
                merged[src], dead[src] = 0.0, True
        return merged

    def _partners(self, cand: np.ndarray) -> list[list[int]]:
        """For each candidate with a non-empty piece, the other candidates whose piece starts
        with it, in index order (strings sharing a prefix sit together in sorted order)."""
        pieces = [self.pieces[t] if t < len(self.pieces) else b"" for t in cand]
        order = sorted(range(len(cand)), key=pieces.__getitem__)
        keys = [pieces[i] for i in order]
        out = []
        for i0, piece in enumerate(pieces):
            found = []
            if piece:
                j = bisect_left(keys, piece)
                while j < len(keys) and keys[j].startswith(piece):
                    if order[j] != i0:
                        found.append(order[j])
                    j += 1
            out.append(sorted(found))
        return out
