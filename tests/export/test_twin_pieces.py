"""export/twin_pieces.py: the level-0 twin's teacher-forced check run in pieces of the graph, one
session at a time, gives `observe_forced`'s rows bit for bit, for any number of pieces (cuts
inside layers included: every tensor a later node reads crosses), and leaves no piece file."""

import dataclasses

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


def test_an_export_whose_twin_is_off_writes_nothing(tmp_path, monkeypatch):
    """The gate through export_bundle: twin rows 2e-3 off (prefill and continuation as they are)
    fail the export, and no bundle is written."""
    from specrt.export import export_bundle, quant_target
    from specrt.export.validate import ParityError

    def off(*a, **kw):
        got = twin_pieces.observe_forced_in_pieces(*a, **kw)
        return dataclasses.replace(got, forced=got.forced + 2e-3 * (np.arange(got.forced.shape[-1]) % 2))

    monkeypatch.setattr(quant_target, "observe_forced_in_pieces", off)
    src = write_tiny_gguf(tmp_path / "t.gguf")
    with pytest.raises(ParityError, match="target graph failed parity"):
        export_bundle(str(src), tmp_path / "b", draft="none", precision="gguf", accuracy_level=4, max_seq_len=256,
                      max_draft_tokens=8, echo=None)
    assert not (tmp_path / "b").exists()
