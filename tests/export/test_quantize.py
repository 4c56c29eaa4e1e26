import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from specrt.export import quantize
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


def test_hand_computed_block_8bit():
    w = np.array([[1.0, -2.0, 0.5, 4.0] + [0.0] * 28], dtype=np.float32)
    packed, scales = quantize_rtn_sym(w, 32, bits=8)
    assert packed.shape == (1, 1, 32) and scales.shape == (1, 1)
    assert scales[0, 0] == -4.0 / 128  # largest magnitude (4.0, signed) maps to code -128
    # w / scale = [-32, 64, -16, -128] -> +128 -> one code per byte
    assert list(packed[0, 0, :5]) == [96, 192, 112, 0, 128]
    np.testing.assert_array_equal(dequantize(packed, scales, 32, bits=8), w)


@pytest.mark.parametrize("bits", [4, 8])
def test_roundtrip_error_bounded_and_padding(bits):
    w = np.random.default_rng(0).standard_normal((8, 70)).astype(np.float32)  # K not a multiple of 32
    packed, scales = quantize_rtn_sym(w, 32, bits)
    assert packed.shape == (8, 3, 32 * bits // 8)
    back = dequantize(packed, scales, 70, bits)
    blocks = np.pad(np.abs(w), ((0, 0), (0, 26))).reshape(8, 3, 32).max(-1)
    # half a step from rounding; a full step where +2^(bits-1) clips to the top code
    bound = np.repeat(blocks / 2 ** (bits - 1) * 1.0001, 32, axis=1)[:, :70]
    assert (np.abs(back - w) <= bound + 1e-7).all()
    if bits == 8:  # 8 bits is 16x finer than 4: the error bound is the point of the int8 draft
        assert np.abs(back - w).max() < (blocks.max() / 128) * 1.0001


@pytest.mark.parametrize("bits", [4, 8])
def test_row_slabs_give_the_same_bytes(bits, monkeypatch):
    """A tall weight is quantized a slab of rows at a time (its fp32 temporaries bounded): the
    same codes and scales as in one piece, ragged last slab included."""
    w = np.random.default_rng(1).standard_normal((23, 70)).astype(np.float32)
    whole = quantize_rtn_sym(w, 32, bits)
    monkeypatch.setattr(quantize, "RTN_SLAB_ROWS", 5)
    slabs = quantize_rtn_sym(w, 32, bits)
    assert all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(whole, slabs, strict=True))


def test_bits_other_than_4_or_8_refused():
    with pytest.raises(ValueError, match="4 or 8"):
        quantize_rtn_sym(np.ones((2, 32), np.float32), 32, bits=3)


@pytest.mark.parametrize("bits", [4, 8])
def test_onnxruntime_matmulnbits_reads_our_layout(bits):
    rng = np.random.default_rng(1)
    K, N = 64, 24
    w = rng.standard_normal((N, K)).astype(np.float32)
    packed, scales = quantize_rtn_sym(w, 32, bits)
    node = helper.make_node("MatMulNBits", ["A", "B", "S"], ["Y"], domain="com.microsoft",
                            K=K, N=N, bits=bits, block_size=32, accuracy_level=0)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, [2, K])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, N])],
        initializer=[numpy_helper.from_array(packed, "B"), numpy_helper.from_array(scales, "S")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    a = rng.standard_normal((2, K)).astype(np.float32)
    got = sess.run(None, {"A": a})[0]
    np.testing.assert_allclose(got, a @ dequantize(packed, scales, K, bits).T, atol=1e-4)
