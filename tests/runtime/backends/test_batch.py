"""The batch contract (runtime/backends/batch.py, `PoolModel.run_batch`): one batch of sequences
of any widths gives each sequence the rows it gives alone, bit for bit, on a packed model (one
call per `lanes` sequences) and on a model that splits the batch into its own calls."""

from __future__ import annotations

import numpy as np
import pytest

from specrt.runtime.backends.batch import Batch
from specrt.runtime.backends.packed import PackedModel
from specrt.runtime.bundle.loader import load_models


def test_batch_layout_and_bad_batches():
    b = Batch.of([(2, np.array([5, 6, 7]), 10, 1), (0, np.array([9]), 4, 8)])
    assert b.tokens.tolist() == [5, 6, 7, 9] and b.loc.tolist() == [0, 3, 4]
    assert b.slots.tolist() == [2, 0] and b.starts.tolist() == [10, 4] and b.keeps.tolist() == [1, 1]
    assert b.seq(0).tolist() == [5, 6, 7] and b.count(1) == 1 and b.hidden is None
    with pytest.raises(ValueError, match="each slot once"):
        Batch.of([(1, np.array([5]), 0, 1), (1, np.array([6]), 1, 1)])
    with pytest.raises(ValueError, match="one or more tokens"):
        Batch.of([(1, np.array([], dtype=np.int64), 0, 1)])
    with pytest.raises(ValueError, match="one or more sequences"):
        Batch.of([])


def _seqs(model, g):
    """A prompt chunk, plain rows and verification rows over slots 0..3, each at its track's
    length, whose rows below were written by a prefill of its own."""
    out = []
    for slot, (n, keep) in enumerate([(7, 1), (1, 1), (4, 4), (1, 1)]):
        past = 3 + 2 * slot
        model.pool.assign(slot)
        model.run(slot, g.integers(3, model.vocab - 1, past), 0)  # rows [0, past) of the slot
        model.pool.advance(model.track, slot, past)  # a rows call's filler for a slot goes past them
        out.append((slot, g.integers(3, model.vocab - 1, n), past, keep))
    return out


@pytest.mark.parametrize("bundle", ["int8", "eagle"])
def test_a_batch_gives_each_sequence_its_rows_alone(tiny_bundles, bundle):
    """int8: a packed target (one call for as many sequences as it has lanes, more calls past
    them); eagle: an unpacked `ort` graph, which splits the batch (one rows call for the
    one-token sequences, a call for each other)."""
    parts = load_models(tiny_bundles[bundle], max_batch=4, hugepages=False)
    model = parts.target
    assert isinstance(model, PackedModel) == (bundle == "int8")
    seqs = _seqs(model, np.random.default_rng(5))
    alone = [model.run_batch(Batch.of([s])).logits[0].copy() for s in seqs]
    out = model.run_batch(Batch.of(seqs))
    for got, want, (_, _, _, keep) in zip(out.logits, alone, seqs, strict=True):
        assert got.shape == (keep, model.vocab)
        np.testing.assert_array_equal(got, want)
    if isinstance(model, PackedModel):
        assert out.calls == len(model.groups([len(t) for _, t, _, _ in seqs])) == -(-len(seqs) // model.lanes)
        lanes, tokens = model.room([len(t) for _, t, _, _ in seqs])
        assert 0 < lanes <= model.lanes and 0 < tokens <= model.max_tokens
    else:
        assert out.calls == 1 + 2  # the two one-token rows in one call, then the chunk and the 4-token row
        assert len(out.hidden) == len(seqs) and out.hidden[2].shape == (4, model.hidden_size)
        assert model.room([1, 4]) == (model.pool.slots, model.max_prefill_t)
