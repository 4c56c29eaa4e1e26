"""QMatMulGGML (native/qmatmul_ggml*.cc): a GGUF tensor's own blocks (export/kernel_blocks.py)
against gguf-py's dequantization, a row's bits in any call, and a wrong form caught.

Real onnxruntime sessions over the built library. Each instruction-set form the CPU cannot run is
a skip that says so; the portable C++ form is the definition the others are held to bit for bit.
"""

from __future__ import annotations

import shutil
import subprocess

import gguf
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from onnx import TensorProto, helper, numpy_helper

from checks import FAST_FORMS, isa_forms, kernel_model
from checks import kernel_session as session
from paths import ROOT
from specrt.export import kernel_blocks
from specrt.export.gguf_blocks import import_blocks
from specrt.export.kernel_blocks import OP, TYPES, record_bytes, repack
from specrt.runtime import kernels
from specrt.runtime.kernels import layout

BEST = kernels.isa()  # the fastest form this CPU runs
SIZES = (2, 3, 4, 5, 6, 7, 8, 9, 15, 16, 17, 33, 64)
WIDE = tuple(m for m in SIZES if m >= 5)  # the calls that run Q4_K's AMX form where it runs (qmatmul_ggml_op.cc kAmxMinRows)
# byte offsets of each type's fp16 fields
F16 = {"Q4_0": [0], "Q8_0": [0], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}


def blocks(type_name: str, n: int, k: int, seed: int = 0) -> np.ndarray:
    """Random bytes of `type_name` (any bit pattern is a valid block) with finite fp16 fields of
    both signs: uint8 [n, bytes per row], as GGUFReader hands a tensor over."""
    rng = np.random.default_rng(seed)
    per_block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]
    b = rng.integers(0, 256, size=(n * k // per_block, type_size), dtype=np.uint8)
    for off in F16[type_name]:
        b[:, off:off + 2] = (rng.standard_normal(len(b)) * 0.02).astype(np.float16).view(np.uint8).reshape(-1, 2)
    return b.reshape(n, -1)


def model(raw, type_name: str, n: int, k: int, bias=None, **attrs) -> bytes:
    inits = [numpy_helper.from_array(repack(raw, type_name, n, k), "blocks")]
    if bias is not None:
        inits.append(numpy_helper.from_array(bias.astype(np.float32), "bias"))
    node = helper.make_node(OP, ["x", "blocks"] + (["bias"] if bias is not None else []), ["y"], domain=kernels.DOMAIN,
                            **{"K": k, "N": n, "type": type_name, **attrs})
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return kernel_model(g)


def activations(rng, m: int, k: int) -> np.ndarray:
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[:, 5] *= 40  # an outlier channel, as real hidden states have
    if m > 2:
        x[2, 32:64] = 0  # an all-zero block
    return x


def reference(x, raw, type_name: str, bias=None) -> np.ndarray:
    """gguf-py's dequantized weights against the kernels' int8 activations, in float64."""
    q, sa = layout.quantize(x)
    deq = np.repeat(sa.astype(np.float64), layout.QBLOCK, axis=1) * q
    w = gguf.quants.dequantize(raw, GGMLQuantizationType[type_name]).astype(np.float64)
    y = deq @ w.T
    return y if bias is None else y + bias


@pytest.mark.parametrize("type_name", sorted(TYPES))
def test_a_record_holds_the_ggufs_bytes(type_name):
    raw = blocks(type_name, 32, 512)
    packed = repack(raw, type_name, 32, 512)
    assert packed.nbytes == raw.nbytes and packed.shape[-1] == record_bytes(type_name)
    bits = 8 * TYPES[type_name][1] / TYPES[type_name][0]
    assert bits == {"Q4_0": 4.5, "Q8_0": 8.5, "Q4_K": 4.5, "Q5_K": 5.5, "Q6_K": 6.5625}[type_name]


@pytest.mark.parametrize("isa", isa_forms())
@pytest.mark.parametrize("type_name", sorted(TYPES))
def test_matches_gguf_dequantize_in_float64(type_name, isa, monkeypatch):
    rng = np.random.default_rng(1)
    n, k = 64, 512
    raw = blocks(type_name, n, k, seed=2)
    bias = rng.standard_normal(n).astype(np.float32)
    x = activations(rng, 9, k)
    for b in (None, bias):
        want = reference(x, raw, type_name, b)
        y = session(model(raw, type_name, n, k, b), isa, monkeypatch).run(None, {"x": x})[0]
        np.testing.assert_allclose(y, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())


def rows_any_call(blob: bytes, isa: str, monkeypatch, x: np.ndarray, want: np.ndarray, sizes=SIZES) -> None:
    """Every row of x, alone and in calls of `sizes` rows (1 .. 64) at two places, on 1 and 2
    threads, is `want`'s row bit for bit (AssertionError naming the call otherwise)."""
    for threads in (1, 2):
        s = session(blob, isa, monkeypatch, threads)
        alone = np.concatenate([s.run(None, {"x": x[i:i + 1]})[0] for i in range(len(x))])
        assert np.array_equal(alone, want), (isa, threads, "alone")
        for m in sizes:
            for start in (0, len(x) - m):
                y = s.run(None, {"x": x[start:start + m]})[0]
                assert np.array_equal(y, want[start:start + m]), (isa, threads, m, start)


def _case(type_name: str):
    rng = np.random.default_rng(3)
    # 7 tiles: a lone row's 4, pairs, and a last single tile (the AMX form's one-tile pass); 25
    # blocks of 32 for Q4_0 / Q8_0: a partial span of wide calls (native/qmatmul_ggml_x86.cc)
    n, k = 112, 512 if TYPES[type_name][0] == 256 else 800
    raw = blocks(type_name, n, k, seed=4)
    blob = model(raw, type_name, n, k, rng.standard_normal(n).astype(np.float32))
    return blob, activations(rng, 64, k)


@pytest.mark.parametrize("isa", isa_forms())
@pytest.mark.parametrize("type_name", sorted(TYPES))
def test_a_row_is_the_same_bits_in_any_call(type_name, isa, monkeypatch):
    blob, x = _case(type_name)
    want = session(blob, "ref", monkeypatch, 1).run(None, {"x": x})[0]  # the definition, 64 rows at once
    rows_any_call(blob, isa, monkeypatch, x, want)


@pytest.mark.parametrize("isa", isa_forms((*FAST_FORMS, "amx")))
def test_a_form_that_reorders_one_sum_is_caught(isa, monkeypatch):
    """The library built with SPECRT_MUTANT (its fast forms add each block's terms to the
    accumulator last, in blocks of 4 rows; the AMX form in the fourth row of a tile block) must
    fail the test above, in each form: AMX's in the calls it runs alone."""
    if not (shutil.which("make") and shutil.which("g++")):
        pytest.skip("the mutant library needs make and g++")
    built = subprocess.run(["make", "-s", "kernels-mutant"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, f"could not build the mutant library: {built.stderr[-300:]}"
    blob, x = _case("Q4_K")
    want = session(blob, "ref", monkeypatch, 1).run(None, {"x": x})[0]
    monkeypatch.setenv("SPECRT_KERNELS", str(ROOT / ".cache/kernels-mutant/libspecrt_kernels.so"))
    sizes = WIDE if isa == "amx" else SIZES
    with pytest.raises(AssertionError):
        rows_any_call(blob, isa, monkeypatch, x, want, sizes)
    monkeypatch.delenv("SPECRT_KERNELS")
    rows_any_call(blob, isa, monkeypatch, x, want, sizes)  # the real library passes it


def _qmatmul(qw, fmt) -> bytes:
    """QMatMul4 / QMatMul8 over import_blocks' fp32 scales and mins (the kernel graphs' form)."""
    n, k = qw.shape
    codes = qw.codes().reshape(n, k)
    packed, sc, mn = layout.pack(codes, qw.scales, qw.mins, *fmt)
    inits = [numpy_helper.from_array(a, name) for a, name in ((packed, "codes"), (sc, "scale"), (mn, "min"))]
    attrs = dict(block_size=fmt[1]) if fmt[0] == 8 else {}
    node = helper.make_node(layout.FORMS[fmt], ["x", "codes", "scale", "min"], ["y"], domain=kernels.DOMAIN,
                            K=k, N=n, **attrs)
    g = helper.make_graph([node], "q", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return kernel_model(g)


@pytest.mark.parametrize("type_name,fmt", [("Q4_K", (4, 32)), ("Q5_K", (8, 32))])
def test_k_quants_with_mins_are_qmatmuls_bits(type_name, fmt, monkeypatch):
    """d·sc and dmin·m are exact in fp32, so reading them from the blocks takes QMatMul4 / QMatMul8's
    steps on the exported scales: the same bits, and greedy parity with the kernel graphs."""
    n, k = 64, 512
    raw = blocks(type_name, n, k, seed=5)
    x = activations(np.random.default_rng(6), 17, k)
    old = session(_qmatmul(import_blocks(raw, type_name, n, k), fmt), BEST, monkeypatch).run(None, {"x": x})[0]
    new = session(model(raw, type_name, n, k), BEST, monkeypatch).run(None, {"x": x})[0]
    assert np.array_equal(new, old)


@pytest.mark.parametrize("type_name", sorted(kernel_blocks.PARTS))
def test_records_from_the_bytes_are_the_decoded_records(type_name, monkeypatch):
    """Q4_K / Q6_K records made from ggml's bytes (`kernel_blocks.PARTS`) are those made by
    decoding every code first, byte for byte (ragged slabs, rows reordered)."""
    raw = blocks(type_name, 96, 512, seed=3)
    order = np.random.default_rng(5).permutation(96)
    monkeypatch.setattr(kernel_blocks, "SLAB", 48)
    fast = repack(raw, type_name, 96, 512, order)
    monkeypatch.setattr(kernel_blocks, "PARTS", {})
    assert np.array_equal(fast, repack(raw, type_name, 96, 512, order))


def test_rows_follow_the_order_given():
    raw = blocks("Q6_K", 32, 256)
    order = np.random.default_rng(7).permutation(32)
    assert np.array_equal(repack(raw, "Q6_K", 32, 256, order), repack(raw[order], "Q6_K", 32, 256))


def test_bad_shapes_are_clear_errors(monkeypatch):
    raw = blocks("Q4_K", 32, 256)
    s = session(model(raw, "Q4_K", 32, 256), BEST, monkeypatch)
    with pytest.raises(Exception, match="x's last dimension must be K = 256"):
        s.run(None, {"x": np.zeros((2, 32), np.float32)})
    # refused when the session is built (the weights are initializers), not in the first call
    with pytest.raises(Exception, match="initialization.*blocks must hold N/16 \\* K/256 \\* 2304 bytes \\(Q4_K, K = 512"):
        session(model(raw, "Q4_K", 32, 256, K=512), BEST, monkeypatch)
    with pytest.raises(Exception, match="K must be a multiple of 256 \\(Q4_K\\)"):
        session(model(raw, "Q4_K", 32, 256, K=160), BEST, monkeypatch)
    with pytest.raises(Exception, match="type must be Q4_0, Q8_0, Q4_K, Q5_K or Q6_K, not 'Q3_K'"):
        session(model(raw, "Q4_K", 32, 256, type="Q3_K"), BEST, monkeypatch)
    with pytest.raises(ValueError, match="not IQ4_NL"):
        repack(raw, "IQ4_NL", 32, 256)
    with pytest.raises(ValueError, match="multiples of 16"):
        repack(raw[:8], "Q4_K", 8, 256)
