"""A request's own processing of logits — penalties (runtime/sampling/logits.py), then its grammar's mask
(runtime/sampling/grammar.py) — for the target's rows and for its draft's.

Exactness: the target's row i of a verification call is processed as a target-only step at
that position would be, with the history the tokens before it make (committed output +
draft[:i]). The draft's rows get the same processing over the committed output + what it has
proposed so far: it then proposes from (nearly) the distribution verification compares with —
acceptance, not exactness, is what that buys (verification divides by the q it sampled from).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np

from .grammar import GrammarError, Matcher, apply_mask
from .logits import Penalties, apply_penalties


class Processed(Protocol):
    """What processing reads of a request (runtime/engine/request.py `Request`, which the engine
    owns: nothing here writes it)."""

    prompt: list[int]
    seq: list[int]  # prompt + committed new tokens
    eos_ids: frozenset[int]
    penalties: Penalties | None
    grammar: Matcher | None


def _active(r: Processed) -> bool:
    return (r.penalties is not None and r.penalties.active) or r.grammar is not None


def process(r: Processed, rows: np.ndarray, drafts=()) -> np.ndarray:
    """Target rows [T, V]: row i follows the committed sequence plus drafts[:i] (grammar-valid:
    `cut_to_grammar`). The raw rows themselves when the request asks for nothing."""
    if r.penalties is not None and r.penalties.active:
        rows = apply_penalties(rows, r.penalties, r.prompt, r.seq[len(r.prompt):], drafts, r.eos_ids)
    if r.grammar is not None:
        allowed = r.grammar.masks(drafts[: len(rows) - 1])
        _some_allowed(allowed)
        rows = apply_mask(rows, allowed)
    return rows


def _some_allowed(allowed: np.ndarray) -> None:
    """A row where the grammar allows no token has no next token: the request cannot go on (a
    grammar in an error state); it ends with this error rather than a token picked from nothing.
    (The rows' logits are finite, `check_finite`, and no penalty a grammar admits sets -inf.)"""
    if not allowed.any(axis=-1).all():
        raise GrammarError("the grammar allows no token here (a grammar engine error)")


def draft_processor(r: Processed) -> Callable[[np.ndarray, list[int]], np.ndarray] | None:
    """(draft logits row [V], tokens proposed so far this round) -> the row processed as the
    target's would be at that position; None when the request asks for nothing."""
    if not _active(r):
        return None

    def process_row(row: np.ndarray, proposed: list[int]) -> np.ndarray:
        rows = row[None]
        if r.penalties is not None and r.penalties.active:
            rows = apply_penalties(rows, r.penalties, r.prompt, r.seq[len(r.prompt):] + list(proposed), [], r.eos_ids)
        if r.grammar is not None:
            rows = apply_mask(rows, r.grammar.mask_after(proposed)[None])
        return rows[0]

    return process_row

