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


def test_a_windowed_tracks_offset_goes_with_its_rows():
    """A track whose row 0 holds sequence position `offset` (a windowed draft): parking, taking
    the slot again, copying it and emptying it keep rows and offset together."""
    pool = KVPool(KVLayout(layers=1, kv_heads=1, head_dim=2, max_seq_len=64, dtype="float32"), 3)
    t, d = pool.track("target"), pool.track("draft")
    s = 0
    pool.assign(s)
    pool.advance(t, s, 40)
    pool.set_offset(d, s, 30)
    pool.advance(d, s, 8)  # the draft holds tokens 30 .. 37
    with pytest.raises(ValueError, match="rewind it first"):
        pool.set_offset(d, s, 31)
    pool.host[0][s, 0, :8] = 7.0
    tokens = list(range(40))
    pool.park(s, tokens)
    assert pool.idle() == {s: tokens} and (pool.length(d, s), pool.offset(d, s)) == (8, 30)
    # a copy of 36 shared tokens: the draft keeps rows 30 .. 35 at its offset
    c = 1
    pool.assign(c, 36, source=s)
    assert (pool.length(t, c), pool.length(d, c), pool.offset(d, c)) == (36, 6, 30)
    assert (pool.host[0][c, 0, :6] == 7.0).all()
    # a prompt sharing only 25 tokens: none of the draft's rows (they start at 30)
    pool.free(c)
    pool.assign(c, 25, source=s)
    assert (pool.length(t, c), pool.length(d, c), pool.offset(d, c)) == (25, 0, 0)
    # the next turn takes the idle slot itself; emptied, the offset goes
    pool.assign(s, 40)
    assert (pool.length(d, s), pool.offset(d, s)) == (8, 30)
    pool.free(s)
    assert (pool.length(d, s), pool.offset(d, s)) == (0, 0)
