"""Backends run one decoder graph with persistent KV buffers. The protocol (see `ort.py`):

    backend.run(tokens: int64 [T], past_len: int, hidden=None, keep=None) -> float32 [n, V] logits
    of the last n positions (n = T, or min(keep, T) where the graph takes `logits_to_keep`; a host
    view owned by the backend, valid until the next run); KV rows [past_len, past_len + T) are
    written in place.

The speculation loop never knows which backend it drives.
"""
