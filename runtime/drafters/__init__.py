"""Drafters propose tokens; the target decides. One drafter object per request (its state:
which rows of the draft model's cache are valid, what the last round proposed).

Protocol:
    route(seq) -> str                 which sub-drafter would propose now ("model" | "ngram");
                                      the request's adaptive policy for that route picks k
    start(seq, k, cfg, rng, policy) -> Proposal | DraftCall
        begin a proposal of at most k tokens continuing `seq` (the committed tokens): either
        the finished proposal (no model call needed) or the first draft-model call
    take(logits [V], hidden [H] | None) -> Proposal | DraftCall
        the logits row of the last call (and its hidden state, for EAGLE); returns the next
        call or the finished proposal
    commit(seq_len)                   the committed sequence now has seq_len tokens
The scheduler runs the calls (batching the one-token calls of many requests into one) and
advances the draft track's length in the KV pool by each call's width.
A `policy` (runtime/adaptive.py) may end a model draft early (confidence early stop).
"""

from .auto import AutoDrafter
from .base import DraftCall, Proposal
from .eagle import EagleDrafter
from .model import ModelDrafter
from .ngram import NgramDrafter

__all__ = ["AutoDrafter", "DraftCall", "EagleDrafter", "ModelDrafter", "NgramDrafter", "Proposal"]
