"""Drafters propose tokens; the target decides. The contract: runtime/drafters/protocol.py
`Drafter` (route -> start -> take ... -> Proposal, then commit); what they hand back:
runtime/drafters/proposal.py (`Proposal`, `DraftCall`).
"""

from .auto import AutoDrafter
from .eagle import EagleDrafter
from .model import ModelDrafter
from .ngram import NgramDrafter
from .proposal import DraftCall, Proposal
from .protocol import Drafter

__all__ = ["AutoDrafter", "DraftCall", "Drafter", "EagleDrafter", "ModelDrafter", "NgramDrafter", "Proposal"]
