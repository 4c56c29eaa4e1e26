"""tools/weight_bytes.py: what one target call streams, counted per weight form."""

import numpy as np
import onnx
import weight_bytes
from onnx import TensorProto, helper, numpy_helper


def test_a_q4k_projection_counts_codes_scales_block_sums_and_mins(tmp_path):
    """One exact Q4_K projection as export/nbits.py writes it (MatMulNBits 4-bit block 32 at
    accuracy level 4, then the mins MatMul) and a float LM head: codes 4 bits, fp32 scales and
    MLAS's fp32 block sums 1 bit each, mins 1 bit, the head 32 bits; the embedding table apart."""
    n, k = 64, 128
    inits = [numpy_helper.from_array(np.zeros((n, k // 32, 16), np.uint8), "p_q4"),
             numpy_helper.from_array(np.zeros((n, k // 32), np.float32), "p_scales"),
             numpy_helper.from_array(np.zeros((k // 32, n), np.float32), "p_minsT"),
             numpy_helper.from_array(np.zeros((1000, n), np.float32), "embed")]
    nodes = [helper.make_node("Gather", ["embed", "ids"], ["x"]),
             helper.make_node("MatMulNBits", ["x", "p_q4", "p_scales"], ["y"], domain="com.microsoft",
                              K=k, N=n, bits=4, block_size=32, accuracy_level=4),
             helper.make_node("MatMul", ["sums", "p_minsT"], ["corr"]),
             helper.make_node("Gemm", ["y", "embed"], ["logits"], transB=1)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1]),
                                       helper.make_tensor_value_info("sums", TensorProto.FLOAT, [1, k // 32])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 1000])], initializer=inits)
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g), str(path))
    forms, gathered = weight_bytes.account(path)
    q = forms["MatMulNBits 4-bit, block 32"]
    assert q["weights"] == n * k
    assert q["codes"] == n * k / 2 and q["scales (fp32)"] == q["block sums (fp32, packed)"] == q["mins (fp32)"] == n * k / 8
    assert forms["float MatMul"]["weights"] == 1000 * n and forms["float MatMul"]["fp32 matrix"] == 4 * 1000 * n
    assert gathered == {"Gather": 4 * 1000 * n}


def test_kernel_operators_count_what_they_read(tmp_path):
    """QMatMul4: 4-bit codes and fp32 scales and mins (6 bits a weight); QMatMulGGML: the GGUF
    blocks it reads (Q4_K: 4.5 bits a weight, the file's own)."""
    n, k = 32, 256
    inits = [numpy_helper.from_array(np.zeros((n // 16, k // 32, 256), np.uint8), "c"),
             numpy_helper.from_array(np.zeros((n // 16, k // 32, 16), np.float32), "s"),
             numpy_helper.from_array(np.zeros((n // 16, k // 32, 16), np.float32), "m"),
             numpy_helper.from_array(np.zeros((n // 16, k // 256, 16 * 144), np.uint8), "b")]
    nodes = [helper.make_node("QMatMul4", ["x", "c", "s", "m"], ["y"], domain="specrt", K=k, N=n),
             helper.make_node("QMatMulGGML", ["y2", "b"], ["z"], domain="specrt", K=k, N=n, type="Q4_K")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k]),
                                       helper.make_tensor_value_info("y2", TensorProto.FLOAT, [1, k])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, n])], initializer=inits)
    path = tmp_path / "k.onnx"
    onnx.save(helper.make_model(g), str(path))
    forms, _ = weight_bytes.account(path)
    q4 = forms["QMatMul4 (4-bit, block 32)"]
    assert q4["weights"] == n * k and q4["codes"] == n * k / 2 and q4["scales (fp32)"] == q4["mins (fp32)"] == n * k / 8
    gg = forms["QMatMulGGML Q4_K"]
    assert gg["weights"] == n * k and gg["blocks (the GGUF's own)"] * 8 / (n * k) == weight_bytes.GGUF_BITS["Q4_K"]
