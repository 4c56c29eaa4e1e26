import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from specrt.export.quantize import dequantize, quantize_rtn_sym


def test_hand_computed_block():
    w = np.array([[1.0, -2.0, 0.5, 4.0] + [0.0] * 28], dtype=np.float32)
    packed, scales = quantize_rtn_sym(w, 32)
    assert packed.shape == (1, 1, 16) and scales.shape == (1, 1)
    assert scales[0, 0] == -0.5  # largest magnitude (4.0, signed) maps to code -8
    codes = np.stack([packed & 15, packed >> 4], -1).reshape(-1)
    # w / scale = [-2, 4, -1, -8] -> +8 -> [6, 12, 7, 0]
    assert list(codes[:4]) == [6, 12, 7, 0]
    np.testing.assert_array_equal(dequantize(packed, scales, 32), w)


def test_roundtrip_error_bounded_and_padding():
    w = np.random.default_rng(0).standard_normal((8, 70)).astype(np.float32)  # K not a multiple of 32
    packed, scales = quantize_rtn_sym(w, 32)
    assert packed.shape == (8, 3, 16)
    back = dequantize(packed, scales, 70)
    blocks = np.pad(np.abs(w), ((0, 0), (0, 26))).reshape(8, 3, 32).max(-1)
    # half a step from rounding; a full step where +8 clips to the top code 7
    bound = np.repeat(blocks / 8 * 1.0001, 32, axis=1)[:, :70]
    assert (np.abs(back - w) <= bound + 1e-7).all()


def test_onnxruntime_matmulnbits_reads_our_layout():
    rng = np.random.default_rng(1)
    K, N = 64, 24
    w = rng.standard_normal((N, K)).astype(np.float32)
    packed, scales = quantize_rtn_sym(w, 32)
    node = helper.make_node("MatMulNBits", ["A", "B", "S"], ["Y"], domain="com.microsoft",
                            K=K, N=N, bits=4, block_size=32, accuracy_level=0)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, [2, K])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, N])],
        initializer=[numpy_helper.from_array(packed, "B"), numpy_helper.from_array(scales, "S")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    a = rng.standard_normal((2, K)).astype(np.float32)
    got = sess.run(None, {"A": a})[0]
    np.testing.assert_allclose(got, a @ dequantize(packed, scales, K).T, atol=1e-4)
