"""tools/attention_costs.py on the tiny bundle: both graphs run, only the attention differs, and
the graph without the fusion it writes beside the bundle's is removed."""

import importlib.util
import sys

import onnx
import pytest

from paths import ROOT
from specrt.runtime import kernels

spec = importlib.util.spec_from_file_location("attention_costs", ROOT / "tools" / "attention_costs.py")
attention_costs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(attention_costs)


@pytest.mark.skipif(not kernels.available(), reason="the kernel library is not built (make kernels)")
def test_the_two_graphs_differ_in_their_attention_only(tiny_bundles, monkeypatch, capsys):
    from specrt.runtime.bundle.manifest import load_manifest

    bundle = tiny_bundles["good"]
    e = load_manifest(bundle).target
    path = attention_costs.without_fusion(bundle, e)
    try:
        ops = [n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node]
        fused = [n.op_type for n in onnx.load(str(bundle / e.packed.kernel_file(8)), load_external_data=False).graph.node]
    finally:
        path.unlink()
    assert "PackedAttention" not in ops and ops.count("GroupQueryAttention") == 8 * e.kv.layers
    assert fused.count("PackedAttention") == e.kv.layers and "GroupQueryAttention" not in fused
    before = sorted((bundle / "target").iterdir())
    monkeypatch.setattr(sys, "argv", ["attention_costs", str(bundle), "--max-seq-len", "256", "--reps", "1"])
    attention_costs.main()
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 1 x ")]
    # of the cases, only a prompt chunk at position 0 fits 256 rows; both graphs timed, a ratio
    assert len(rows) == 1 and rows[0].startswith("| 1 x ") and "| 0 |" in rows[0] and rows[0].endswith("x |")
    assert sorted((bundle / "target").iterdir()) == before  # the unfused graph is removed
