"""nbits.gather: the rows of a block-quantized table are its dequantized rows, bit for bit, for
every GGUF type with an exact form (zero points 0 / 4 / 8 / 16 / 32 / 128, per-block mins)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from tiny_gguf import random_blocks

from specrt.export import nbits
from specrt.export.emitter import GraphBuilder
from specrt.export.gguf_blocks import import_blocks

TYPES = ["Q4_0", "Q4_1", "Q4_K", "Q2_K", "Q3_K", "Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0"]
N, K = 40, 512


@pytest.mark.parametrize("kind", TYPES)
def test_gathered_rows_are_the_dequantized_rows(kind):
    qw = import_blocks(random_blocks(kind, N, K, np.random.default_rng(1)), kind, N, K)
    g = GraphBuilder(np.float32)
    out = nbits.gather(g, "ids", "table", qw)
    graph = helper.make_graph(g.nodes, "t", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["b", "t"])],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)], g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(nbits.MS, 1)])
    ids = np.array([[0, 7, 39], [3, 3, 21]], dtype=np.int64)
    rows = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"ids": ids})[0]
    assert rows.shape == (2, 3, K)
    assert np.array_equal(rows, qw.dequantize()[ids])
