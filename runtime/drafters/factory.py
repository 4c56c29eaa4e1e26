"""Which drafter a request gets: the factory the scheduler is handed at construction
(runtime/engine/scheduler.py `make_drafter`), built once from the loaded parts."""

from __future__ import annotations

from ..sampling.processing import draft_processor
from .auto import AutoDrafter
from .eagle import EagleDrafter
from .model import ModelDrafter
from .ngram import NgramDrafter


class DrafterFactory:
    def __init__(self, parts, max_k: int, window: int | None = None):
        """parts: runtime/bundle/loader.py `LoadedModels` (the draft model, its features,
        whether it shares the target's KV); max_k: the widest proposal a call can verify;
        window: the most committed tokens a separate draft reads to catch up (None: all)."""
        self.parts, self.max_k, self.window = parts, max_k, window

    def __call__(self, r):
        """-> a fresh drafter for request `r` (by `r.draft`), or None for "none". The caller
        checked that a draft model is loaded when `r.draft` needs one."""
        p = self.parts
        if r.draft == "none":
            return None
        if r.draft == "ngram":
            return NgramDrafter(max_proposal=self.max_k)
        if p.eagle:
            model = EagleDrafter(p.draft, r.slot, p.features[r.slot], process=draft_processor(r))
        else:
            model = ModelDrafter(p.draft, r.slot, "target" if p.shared_kv else None, process=draft_processor(r),
                                 window=self.window)
        return model if r.draft == "model" else AutoDrafter(model, NgramDrafter(max_proposal=self.max_k))
