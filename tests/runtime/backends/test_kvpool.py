"""The KV pool's bookkeeping (runtime/backends/kvpool.py): lengths per track and slot, adopt, rewind, spare rows."""

import pytest

from specrt.runtime.backends.kvpool import ContextOverflow, KVPool
from specrt.runtime.bundle.manifest import KVLayout


def test_kv_pool_tracks_per_slot():
    """The pool's pointers: one length per track and slot, plus
    adopting another track's rows and the spare row of a slot."""
    pool = KVPool(KVLayout(layers=1, kv_heads=1, head_dim=2, max_seq_len=10, dtype="float32"), 3, allocate=False)
    t, d = pool.track("target"), pool.track("draft")
    assert pool.track("target") == t  # idempotent
    assert [pool.alloc(), pool.alloc()] == [0, 1] and pool.free_slots == 1
    assert pool.reserve(t, 1, 4) == 0
    pool.advance(t, 1, 4)
    assert pool.length(t, 1) == 4 and pool.length(t, 0) == 0 and pool.length(d, 1) == 0  # per slot, per track
    pool.rewind(t, 1, 2)
    with pytest.raises(ValueError):
        pool.rewind(t, 1, 3)  # forward "rewind" would expose stale rows
    with pytest.raises(ContextOverflow, match="max_seq_len 10"):
        pool.advance(t, 1, 9)
    pool.adopt(d, 1, 2, t)  # the draft takes the target's rows: only its length moves
    assert pool.length(d, 1) == 2
    with pytest.raises(ValueError, match="adopt"):
        pool.adopt(d, 1, 3, t)  # more rows than the source has
    pool.advance(d, 1, 3)
    assert pool.spare_row(1) == 5 and pool.spare_row(2) == 0  # past every track's rows
    pool.free(1)
    assert pool.length(t, 1) == pool.length(d, 1) == 0 and pool.alloc() == 1  # lowest free slot again
    with pytest.raises(ValueError, match="already free"):
        pool.free(2)
