"""Prompt-lookup drafting (runtime/drafters/ngram.py)."""

import numpy as np

from specrt.runtime.drafters import NgramDrafter, Proposal


def test_ngram_longest_most_recent_match():
    d = NgramDrafter(n_min=1, n_max=3, max_proposal=4)
    seq = [5, 6, 7, 8, 9, 1, 5, 6, 7, 2, 3, 5, 6, 7]
    # last 3 = [5,6,7]; most recent earlier match starts at 6 -> continuation [2,3,5,6]
    np.testing.assert_array_equal(d.lookup(seq, 8), [2, 3, 5, 6])
    np.testing.assert_array_equal(d.lookup(seq, 2), [2, 3])
    assert len(d.lookup([1, 2, 3], 4)) == 0  # no repeat: nothing proposed
    np.testing.assert_array_equal(d.lookup([4, 9, 4], 3), [9, 4])  # falls back to n = 1
    prop = d.start(seq, 3)  # a finished proposal: no model call
    assert isinstance(prop, Proposal)
    assert prop.q is None and len(prop.tokens) == 3 and prop.drafter == "ngram" and d.route(seq) == "ngram"
    np.testing.assert_array_equal(prop.tokens, [2, 3, 5])
