"""Drafters propose tokens; the target decides. The contract: runtime/drafters/protocol.py
`Drafter` (route -> start -> take ... -> Proposal, then commit); what they hand back:
runtime/drafters/base.py (`Proposal`, `DraftCall`).
"""

from .auto import AutoDrafter
from .base import DraftCall, Proposal
from .eagle import EagleDrafter
from .model import ModelDrafter
from .ngram import NgramDrafter
from .protocol import Drafter

__all__ = ["AutoDrafter", "DraftCall", "Drafter", "EagleDrafter", "ModelDrafter", "NgramDrafter", "Proposal"]
