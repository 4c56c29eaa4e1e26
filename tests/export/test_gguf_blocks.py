"""GGUF blocks -> MatMulNBits inputs: bit for bit against gguf-py's own dequantization, and run
through onnxruntime's MatMulNBits."""

import gguf
import numpy as np
import onnxruntime as ort
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from onnx import TensorProto, helper, numpy_helper

from specrt.export.gguf_blocks import FORMS, import_blocks

# byte offsets of each type's fp16 fields (d, and m / dmin where there is one)
F16_FIELDS = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
              "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}


def hand_made(type_name: str, n: int, k: int, seed: int = 0) -> np.ndarray:
    """Random block bytes of `type_name` (every code pattern is a valid block) with finite fp16
    scales of both signs, as GGUFReader hands a tensor over: uint8 [n, bytes per row]."""
    rng = np.random.default_rng(seed)
    per_block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]
    blocks = rng.integers(0, 256, size=(n * k // per_block, type_size), dtype=np.uint8)
    for off in F16_FIELDS[type_name]:
        vals = (rng.standard_normal(len(blocks)) * 0.02).astype(np.float16)
        blocks[:, off:off + 2] = vals.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(n, -1)


def test_every_form_is_tested():
    assert set(F16_FIELDS) == set(FORMS)


@pytest.mark.parametrize("type_name", sorted(FORMS))
def test_blocks_reproduce_gguf_dequantize_bit_for_bit(type_name):
    n, k = 6, 512
    raw = hand_made(type_name, n, k)
    want = gguf.quants.dequantize(raw, GGMLQuantizationType[type_name])
    qw = import_blocks(raw, type_name, n, k)
    assert qw.shape == (n, k) and qw.kind == type_name
    assert qw.packed.shape == (n, k // qw.block, qw.block * qw.bits // 8)
    got = qw.dequantize()
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))  # bits, -0.0 included


@pytest.mark.parametrize("type_name", sorted(FORMS))
def test_blocks_decoded_in_slabs_of_rows_are_the_same(type_name, monkeypatch):
    """A tensor is decoded a few rows at a time (the decoders' temporaries are 4 bytes a
    weight): slabs of 2 rows (and a ragged last one) give every array of the one-slab import."""
    from specrt.export import gguf_blocks

    n, k = 7, 512
    raw = hand_made(type_name, n, k, seed=3)
    whole = import_blocks(raw, type_name, n, k)
    monkeypatch.setattr(gguf_blocks, "SLAB_WEIGHTS", 2 * k)
    slabs = import_blocks(raw, type_name, n, k)
    assert (slabs.bits, slabs.block) == (whole.bits, whole.block)
    for a, b in ((slabs.packed, whole.packed), (slabs.scales, whole.scales), (slabs.zero_points, whole.zero_points)):
        np.testing.assert_array_equal(a, b)
    assert (slabs.mins is None) == (whole.mins is None)
    if whole.mins is not None:
        np.testing.assert_array_equal(slabs.mins, whole.mins)


def test_hand_computed_q4_1_block():
    # d = 0.5, m = -1, codes 0..15 then 15..0: ggml puts element j in the low nibble of byte j
    # and element j + 16 in its high nibble; MatMulNBits wants elements 2j / 2j + 1 in byte j
    codes = np.array(list(range(16)) + list(range(15, -1, -1)), np.uint8)
    block = np.concatenate([np.array([0.5, -1.0], np.float16).view(np.uint8), codes[:16] | (codes[16:] << 4)])
    qw = import_blocks(block[None], "Q4_1", 1, 32)
    assert (qw.bits, qw.block) == (4, 32) and qw.zero_points[0, 0] == 0 and qw.mins[0, 0] == -1.0
    assert list(qw.codes()[0, 0]) == list(codes)
    assert list(qw.packed[0, 0, :2]) == [0 | 1 << 4, 2 | 3 << 4]
    np.testing.assert_array_equal(qw.dequantize()[0], 0.5 * codes - 1.0)


def test_hand_computed_q8_0_block():
    x = np.arange(-16, 16, dtype=np.int8)
    block = np.concatenate([np.array([0.25], np.float16).view(np.uint8), x.view(np.uint8)])
    qw = import_blocks(block[None], "Q8_0", 1, 32)
    assert (qw.bits, qw.block, qw.zero_points[0, 0]) == (8, 32, 128) and qw.mins is None
    assert list(qw.packed[0, 0, :2]) == [112, 113]  # x + 128
    np.testing.assert_array_equal(qw.dequantize()[0], 0.25 * x.astype(np.float32))


@pytest.mark.parametrize("type_name", ["IQ4_NL", "F16", "TQ2_0"])
def test_types_without_a_form_give_none(type_name):
    assert import_blocks(np.zeros((1, 64), np.uint8), type_name, 1, 32) is None


def _matmulnbits(qw, x):
    n, k = qw.shape
    inits = [numpy_helper.from_array(qw.packed, "B"), numpy_helper.from_array(qw.scales, "S")]
    ins = ["A", "B", "S"]
    zp = qw.packed_zero_points()
    if zp is not None:
        inits.append(numpy_helper.from_array(zp, "Z"))
        ins.append("Z")
    node = helper.make_node("MatMulNBits", ins, ["Y"], domain="com.microsoft", K=k, N=n, bits=qw.bits,
                            block_size=qw.block, accuracy_level=0)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, [None, k])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"A": x})[0]


@pytest.mark.parametrize("type_name", sorted(FORMS))
def test_onnxruntime_reads_the_imported_form(type_name):
    """MatMulNBits over the imported inputs plus the block-sum correction equals x @ W.T for the
    gguf-dequantized W, to fp32 rounding (accuracy_level 0: fp32 compute)."""
    n, k = 8, 512
    raw = hand_made(type_name, n, k, seed=1)
    qw = import_blocks(raw, type_name, n, k)
    w = gguf.quants.dequantize(raw, GGMLQuantizationType[type_name])
    x = np.random.default_rng(2).standard_normal((3, k)).astype(np.float32)
    y = _matmulnbits(qw, x)
    if qw.mins is not None:
        y = y + x.reshape(3, -1, qw.block).sum(-1) @ qw.mins.T
    ref = x.astype(np.float64) @ w.T.astype(np.float64)
    assert np.abs(y - ref).max() <= 1e-5 * np.abs(ref).max()


def test_fused_forms_dequantize_to_the_stacked_weights():
    """q/k/v (or gate/up) of one input fuse into one MatMulNBits weight when bits and block agree;
    a part without mins gets zero mins, which leaves its values as they are."""
    from specrt.export.quantize import fuse

    a = import_blocks(hand_made("Q4_0", 4, 64, seed=3), "Q4_0", 4, 64)
    b = import_blocks(hand_made("Q4_1", 2, 64, seed=4), "Q4_1", 2, 64)
    both = fuse([a, b])
    assert both.shape == (6, 64) and both.kind == "Q4_0+Q4_1"
    assert (both.mins[:4] == 0).all()
    np.testing.assert_array_equal(both.dequantize(), np.concatenate([a.dequantize(), b.dequantize()]))
    assert fuse([a, import_blocks(hand_made("Q8_0", 2, 64), "Q8_0", 2, 64)]) is None  # 4 vs 8 bits
    assert fuse([a, import_blocks(hand_made("Q6_K", 2, 256), "Q6_K", 2, 256)]) is None


def test_rows_reorders_every_part():
    qw = import_blocks(hand_made("Q4_K", 4, 256), "Q4_K", 4, 256)
    order = np.array([2, 0, 3, 1])
    np.testing.assert_array_equal(qw.rows(order).dequantize(), qw.dequantize()[order])
