"""Packed calls (export/packed.py, runtime/backends/packed.py): one call carries many sequences,
and a sequence's logits and K/V rows are the same bits whatever else the call holds.

Row invariance is checked with np.array_equal on tiny bundles of both weight forms the `ort`
lowering has (fp32 MatMul; MatMulNBits at accuracy level 0 and level 4, a GGUF's blocks) and on
the default bundle: a row alone against the same row in calls of widths 1..17 beside 1..7 other
rows of other widths and lengths, at contexts below and above GroupQueryAttention's KV block
(~512 positions) and at the last rows of the buffer."""

import numpy as np
import onnx
import pytest
from tiny_gguf import write_tiny_gguf

from checks import Snapshot, assert_missing_file_is_a_bundle_error
from checks import check_row_invariance as _check_invariance
from checks import fill_slot as _fill
from checks import packed_model as _models
from specrt.export import export_bundle
from specrt.export.packed import LANES, pack_bundle, pack_graph
from specrt.runtime import kernels
from specrt.runtime.backends.kvpool import KVPool
from specrt.runtime.backends.ort import OrtModel
from specrt.runtime.backends.packed import PackedModel
from specrt.runtime.bundle.manifest import load_manifest

KW = dict(draft="none", max_draft_tokens=16, echo=None)


@pytest.fixture(scope="module")
def bundles(tiny_dirs, tmp_path_factory):
    """fp32 (S_max 1024: contexts across the attention's KV block), the same with an fp16 KV
    cache, gguf at accuracy level 4, RTN int4 at level 0."""
    base = tmp_path_factory.mktemp("packed")
    gguf = write_tiny_gguf(base / "tiny.gguf")
    hf = str(tiny_dirs["target"])
    specs = {"fp32": (hf, dict(max_seq_len=1024)), "fp32-kv16": (hf, dict(max_seq_len=1024, kv_dtype="fp16")),
             "gguf-l4": (str(gguf), dict(precision="gguf", accuracy_level=4, max_seq_len=256)),
             "int4-l0": (hf, dict(precision="int4", accuracy_level=0, max_seq_len=256))}
    for name, (src, kw) in specs.items():
        export_bundle(src, base / name, **kw, **KW)
    return {name: base / name for name in specs}


@pytest.mark.parametrize("name", ["fp32", "fp32-kv16"])
def test_a_rows_bits_do_not_depend_on_the_call_fp32(bundles, name):
    # slot 0 at a context just below the attention's KV block, others across it and near S_max
    assert _check_invariance(bundles[name], [500, 30, 700, 5, 1000, 260, 90, 1003]) == 18


@pytest.mark.parametrize("name", ["gguf-l4", "int4-l0"])
def test_a_rows_bits_do_not_depend_on_the_call_quantized(bundles, name):
    assert _check_invariance(bundles[name], [100, 3, 230, 40, 17, 200, 64, 120]) == 18


def test_the_last_rows_of_the_buffer(bundles):
    """A lone token has a filler row after it; at the pool's last row there is none, so the
    model refuses it with a clear error and the engine sends the token before it too
    (calls.py `_room`): that call's row is the bits the token gets anywhere else."""
    e = load_manifest(bundles["gguf-l4"]).target
    short, long_ = KVPool(e.kv, 1, "cpu", max_seq_len=48), KVPool(e.kv, 1, "cpu", max_seq_len=64)
    a = PackedModel(bundles["gguf-l4"] / e.packed.file(1), e, short, lanes=1, threads=2)
    b = PackedModel(bundles["gguf-l4"] / e.packed.file(1), e, long_, lanes=1, threads=2)
    assert a.max_seq_len == 48
    toks = np.arange(5, 53, dtype=np.int64)
    _fill(a, 0, toks[:47])
    _fill(b, 0, toks[:47])
    with pytest.raises(ValueError, match="needs the row after it"):
        a.run(0, toks[47:48], 47)
    want = b.run(0, toks[47:48], 47)[0]
    got = a.run(0, toks[46:48], 46)[1]
    assert np.array_equal(got, want)


def test_packed_rows_equal_the_bundle_graph_at_two_tokens_or_more(bundles):
    """The packed graph is the bundle's model: a sequence's rows equal the bundle graph's own
    rows of calls of >= 2 tokens (its one-token calls take other kernels), logits and K/V."""
    for name in ("fp32", "fp32-kv16", "gguf-l4"):
        e, pool, pm = _models(bundles[name], slots=1, lanes=1)
        opool = KVPool(e.kv, 1, "cpu")
        om = OrtModel(bundles[name] / e.graph, e, opool, threads=2)
        toks = np.random.default_rng(1).integers(3, e.vocab_size - 1, 120)
        p = 0
        for T in (37, 2, 5, 17, 2, 9):
            a, b = pm.run(0, toks[p : p + T], p), om.run(0, toks[p : p + T], p)
            assert np.array_equal(a, b), f"{name}: {T} tokens at {p}"
            p += T
        assert all(np.array_equal(x[:, :, :p], y[:, :, :p]) for x, y in zip(pool.host, opool.host, strict=True))


def test_calls_of_many_rows(bundles):
    """More rows than lanes go in several calls (run_rows); a call of more sequences than lanes,
    repeated slots or too many tokens is refused with a clear error."""
    e, pool, pm = _models(bundles["gguf-l4"], slots=8, lanes=2)
    for s in range(8):
        _fill(pm, s, np.arange(3, 13 + s))
    snap = Snapshot(pool)
    rows = pm.run_rows(0, np.arange(20, 28), np.arange(10, 18)).copy()
    for s in range(8):
        snap.restore()
        assert np.array_equal(rows[s], pm.run(s, np.array([20 + s]), 10 + s)[0])
    with pytest.raises(ValueError, match="1..2 sequences"):
        pm.run_packed([(s, np.array([5]), 10, None) for s in range(3)])
    with pytest.raises(ValueError, match="at most"):
        pm.run_packed([(0, np.arange(3, 3 + pm.max_tokens), 0, None), (1, np.array([4]), 10, None)])


def test_lanes_follow_the_load(bundles, tiny_bundles):
    """Every export of an `ort` target writes the packed graphs; a load runs the fewest lanes
    that hold its slots; EAGLE and standard-lowering bundles have none."""
    man = load_manifest(bundles["fp32"])
    assert man.target.packed.lanes == list(LANES)
    assert [man.target.packed.lanes_for(s) for s in (1, 2, 3, 8, 9, 40)] == [1, 2, 4, 8, 16, 16]
    assert not load_manifest(tiny_bundles["eagle"]).target.packed.graph
    import specrt

    pipe = specrt.load(bundles["fp32"], max_batch=3, draft="none")
    try:
        assert type(pipe.parts.target).__name__ == "PackedModel" and pipe.parts.target.lanes == 4
    finally:
        pipe.close()
    pipe = specrt.load(bundles["fp32"], max_batch=3, draft="none", packed=False)
    try:
        assert type(pipe.parts.target).__name__ == "OrtModel"
    finally:
        pipe.close()


def test_a_missing_packed_graph_is_a_clear_bundle_error(bundles, tmp_path):
    assert_missing_file_is_a_bundle_error(bundles["int4-l0"], "target/packed4.onnx", tmp_path)


def test_pack_graph_refuses_what_it_cannot_pack(tiny_bundles):
    man = load_manifest(tiny_bundles["eagle"])
    m = onnx.load(str(tiny_bundles["eagle"] / man.target.graph), load_external_data=False)
    with pytest.raises(ValueError, match="packed form"):
        pack_graph(m, man.target, 2)


def test_pack_bundle_adds_the_graphs_to_an_older_bundle(bundles, tmp_path):
    """A bundle exported before packed graphs existed gets them from `python -m export.packed`."""
    import json
    import shutil

    b = tmp_path / "old"
    shutil.copytree(bundles["int4-l0"], b)
    data = json.loads((b / "specrt.json").read_text())
    del data["target"]["packed"]
    (b / "specrt.json").write_text(json.dumps(data))
    for f in (b / "target").glob("packed*.onnx"):
        f.unlink()
    assert not load_manifest(b).target.packed.graph
    paths = pack_bundle(b, lanes=(1, 4))
    # and their attention on specrt's operator (export/kernel_attention.py)
    assert [p.name for p in paths] == ["packed1.onnx", "packed4.onnx", "packed1.kernels.onnx", "packed4.kernels.onnx"]
    assert load_manifest(b).target.packed.lanes == [1, 4]
    assert load_manifest(b).target.packed.kernels == "target/packed{lanes}.kernels.onnx"


@pytest.mark.slow
def test_a_rows_bits_do_not_depend_on_the_call_default_bundle(default_bundle):
    """The real default target (fp32, S_max 2048): contexts below and above the KV block and at
    the end of the buffer."""
    assert _check_invariance(default_bundle, [505, 40, 1500, 5, 700, 2000, 90, 300], widths=(1, 2, 6, 17)) == 12
    if kernels.fast():  # its kernel graph: the attention on specrt's operator (export/kernel_attention.py)
        assert _check_invariance(default_bundle, [505, 40, 1500, 5, 700, 2000, 90, 300], widths=(1, 2, 6, 17),
                                 kernels=True) == 12
