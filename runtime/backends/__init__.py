"""Backends run one decoder graph with persistent KV buffers. The protocol (see `ort.py`):

    backend.run(tokens: int64 [T], past_len: int) -> float32 [T, V] logits (host view owned by
    the backend, valid until the next run); KV rows [past_len, past_len + T) are written in place.

The speculation loop never knows which backend it drives.
"""
