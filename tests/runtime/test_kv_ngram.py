import numpy as np
import pytest

from specrt.runtime.drafters import NgramDrafter
from specrt.runtime.kv import ContextOverflow, KVCache


def test_kv_pointer():
    kv = KVCache(10)
    assert kv.reserve(4) == 0
    kv.advance(4)
    kv.rewind(2)
    assert kv.length == 2 and kv.room() == 8
    with pytest.raises(ValueError):
        kv.rewind(3)  # forward "rewind" would expose stale rows
    with pytest.raises(ContextOverflow, match="max_seq_len 10"):
        kv.advance(9)


def test_ngram_longest_most_recent_match():
    d = NgramDrafter(n_min=1, n_max=3, max_proposal=4)
    seq = [5, 6, 7, 8, 9, 1, 5, 6, 7, 2, 3, 5, 6, 7]
    # last 3 = [5,6,7]; most recent earlier match starts at 6 -> continuation [2,3,5,6]
    np.testing.assert_array_equal(d.lookup(seq, 8), [2, 3, 5, 6])
    np.testing.assert_array_equal(d.lookup(seq, 2), [2, 3])
    assert len(d.lookup([1, 2, 3], 4)) == 0  # no repeat: nothing proposed
    np.testing.assert_array_equal(d.lookup([4, 9, 4], 3), [9, 4])  # falls back to n = 1
    toks, q = d.propose(seq, 3)
    assert q is None and len(toks) == 3

