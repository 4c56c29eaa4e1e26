"""Host buffers of the EAGLE feature tensors (`io.hidden_out` / `io.hidden_in`), allocated once;
shared by the backends. A graph without them gets None buffers and ignores `hidden`."""

from __future__ import annotations

import numpy as np

from ..bundle.manifest import ModelEntry


class FeatureBuffers:
    def _init_features(self, entry: ModelEntry, max_t: int) -> None:
        H = self.hidden_size = entry.hidden_size
        self._h_out = np.zeros((max_t, H), dtype=np.float32) if entry.io.hidden_out else None
        self._h_in = np.zeros((max_t, H), dtype=np.float32) if entry.io.hidden_in else None
        self.hidden: np.ndarray | None = None  # [T, H] view of the last call's hidden states

    @property
    def takes_hidden(self) -> bool:
        return self._h_in is not None

    @property
    def has_hidden_out(self) -> bool:
        return self._h_out is not None
