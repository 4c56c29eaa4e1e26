"""tools/width_nodes.py on the tiny int8 self-draft (MatMulNBits at level 4 + GroupQueryAttention)."""

import importlib.util

from paths import ROOT

spec = importlib.util.spec_from_file_location("width_nodes", ROOT / "tools" / "width_nodes.py")
width_nodes = importlib.util.module_from_spec(spec)
spec.loader.exec_module(width_nodes)


def test_rows_in_graph_order_from_the_embedding(tiny_bundles):
    folder = tiny_bundles["int8"] / "draft"
    before = sorted(folder.iterdir())
    rows = width_nodes.probe(str(folder / "model.onnx"), layers=1)
    ops = [op for _, op, _ in rows]
    assert ops[0] == "Gather" and "GroupQueryAttention" in ops and "MatMulNBits" in ops
    # what precedes the first attention sees the same token either way: identical rows
    first_attn = ops.index("GroupQueryAttention")
    assert all(d == 0.0 for _, _, d in rows[:first_attn])
    assert sorted(folder.iterdir()) == before  # the probe graph is removed
