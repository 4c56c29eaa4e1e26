"""export/twin_pieces.py: the level-0 twin's teacher-forced check run in pieces of the graph, one
session at a time, gives `observe_forced`'s rows bit for bit, for any number of pieces (cuts
inside layers included: every tensor a later node reads crosses), and leaves no piece file."""

import numpy as np
import onnx
import pytest
from tiny_gguf import write_tiny_gguf

from specrt.export import twin_pieces
from specrt.export.quant_target import level0_twin, prepare
from specrt.export.steps import LoadedModel, Settings, decoder, write_model
from specrt.export.validate import compare, observe, observe_forced


@pytest.fixture(scope="module")
def twin(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("twin")
    m = LoadedModel(str(write_tiny_gguf(tmp / "t.gguf")), 256, stream=True)
    cfg = Settings(256, 8, "gguf", "ort", 12, 4)
    opts = cfg.target_graph(False)
    qw, _ = prepare(m, opts, None)
    entry = write_model(tmp, "target", m.arch, m.weights, opts, cfg.max_t, {}, "export", qw)
    ref = m.reference(cfg)
    tw = level0_twin(tmp, entry)
    own = observe(decoder(tmp, tw), ref)
    return tmp, tw, ref, own.tokens, observe_forced(decoder(tmp, tw), ref, own.tokens)


@pytest.mark.parametrize("piece_bytes", [1 << 40, 200_000, 50_000])
def test_pieces_give_the_whole_twins_rows(twin, piece_bytes):
    tmp, tw, ref, tokens, whole = twin
    n = len(twin_pieces.cuts(onnx.load(str(tmp / tw.graph), load_external_data=False), piece_bytes))
    assert n == 1 if piece_bytes > 1 << 30 else n > 5
    got = twin_pieces.observe_forced_in_pieces(tmp, tw, ref, tokens, piece_bytes)
    for a, b in ((got.prefill, whole.prefill), (got.continuation, whole.continuation), (got.forced, whole.forced)):
        assert np.array_equal(a, b)
    assert np.array_equal(got.tokens, tokens) and compare(got, ref, "fp32").passed
    assert not list(tmp.rglob("*.piece*.onnx"))


def test_a_piece_reads_only_its_own_weights(twin):
    tmp, tw, *_ = twin
    model = onnx.load(str(tmp / tw.graph), load_external_data=False)
    starts = twin_pieces.cuts(model, 200_000)
    last = twin_pieces._consumers(model)
    seen = set()
    for a, b in zip(starts, [*starts[1:], len(model.graph.node)], strict=True):
        fed = dict.fromkeys([i.name for i in model.graph.input], np.zeros(1, np.float32))
        fed.update({o: np.zeros(1, np.float32) for n in model.graph.node for o in n.output})
        m, _, _ = twin_pieces.piece_model(model, a, b, fed, last)
        names = {t.name for t in m.graph.initializer}
        assert sum(twin_pieces._bytes(t) for t in m.graph.initializer if t.name not in seen) <= 200_000 or b - a == 1
        seen |= names
