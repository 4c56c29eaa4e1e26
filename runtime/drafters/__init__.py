"""Drafters propose tokens; the target decides. Protocol (duck-typed):

    name: str
    begin(prompt: list[int]) -> None          prefill / index the prompt
    propose(seq, k, cfg, rng, policy=None) -> (tokens int64 [k'], q [k', V] | None)
        k' <= k proposals continuing `seq` (the committed tokens); q = the distributions the
        tokens were drawn from, or None for a deterministic (one-hot) proposal.
    commit(seq_len: int) -> None              the committed sequence now has seq_len tokens
    confs: list[float]                        draft probabilities of the last proposal (may be [])
A `policy` (runtime/adaptive.py) may end a model draft early (confidence early stop).
"""

from .auto import AutoDrafter
from .eagle import EagleDrafter
from .model import ModelDrafter
from .ngram import NgramDrafter

__all__ = ["AutoDrafter", "EagleDrafter", "ModelDrafter", "NgramDrafter"]
