"""QMatMul4 / QMatMul8 (native/, runtime/kernels): their numbers, and a row's bits in any call.

Real onnxruntime sessions over the built library. A row's output must be the same bits alone, in
calls of 2..64 rows, with 1 or 2 threads, and in every instruction-set form this CPU has (AMX,
AVX-512 VNNI, AVX2, portable C++), since integer block dot products are exact and each output takes
the same float steps.
"""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from checks import isa_forms, kernel_model
from checks import kernel_session as session
from paths import ROOT
from specrt.runtime import kernels
from specrt.runtime.kernels import layout

BEST = kernels.isa()  # the fastest form this CPU runs


FMTS = [(4, 32), (8, 16), (8, 32)]  # (bits, block)


def model(N, K, codes, scale, mins=None, bias=None, k_attr=None, fmt=(4, 32)) -> bytes:
    bits, block = fmt
    packed, sc, mn = layout.pack(codes, scale, mins, bits, block)
    inits = [numpy_helper.from_array(packed, "codes"), numpy_helper.from_array(sc, "scale")]
    ins = ["x", "codes", "scale"]
    if mins is not None or bias is not None:
        ins.append("min" if mins is not None else "")
        if mins is not None:
            inits.append(numpy_helper.from_array(mn, "min"))
    if bias is not None:
        ins.append("bias")
        inits.append(numpy_helper.from_array(bias.astype(np.float32), "bias"))
    attrs = dict(block_size=block) if bits == 8 else {}
    node = helper.make_node(layout.FORMS[fmt], ins, ["y"], domain=kernels.DOMAIN, K=k_attr or K, N=N, **attrs)
    g = helper.make_graph([node], "q", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return kernel_model(g)


def weights(rng, N, K, with_min=True, with_bias=False, fmt=(4, 32)):
    bits, block = fmt
    codes = rng.integers(0, 1 << bits, (N, K), dtype=np.uint8)
    scale = (rng.random((N, K // block), dtype=np.float32) * 0.02).astype(np.float32)
    mins = -(rng.random((N, K // block), dtype=np.float32) * 0.1).astype(np.float32) if with_min else None
    bias = rng.standard_normal(N).astype(np.float32) if with_bias else None
    return codes, scale, mins, bias


def activations(rng, M, K):
    x = rng.standard_normal((M, K)).astype(np.float32)
    x[:, 5] *= 40  # an outlier channel, as real hidden states have
    if M > 2:
        x[2, 32:64] = 0  # an all-zero block
    return x


@pytest.mark.parametrize("form", isa_forms())
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("with_min,with_bias", [(True, False), (False, True), (True, True)])
def test_matches_float64_over_the_same_quantized_activations(fmt, with_min, with_bias, form, monkeypatch):
    rng = np.random.default_rng(1)
    N, K = 64, 256
    codes, scale, mins, bias = weights(rng, N, K, with_min, with_bias, fmt)
    x = activations(rng, 9, K)
    want = layout.reference(x, codes, scale, mins, bias, fmt[1])
    y = session(model(N, K, codes, scale, mins, bias, fmt=fmt), form, monkeypatch).run(None, {"x": x})[0]
    np.testing.assert_allclose(y, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())
    # and the float weights it stands for, within int8 activation error
    w = np.repeat(scale, fmt[1], 1) * codes + (np.repeat(mins, fmt[1], 1) if with_min else 0)
    exact = x.astype(np.float64) @ w.T + (bias if with_bias else 0)
    assert np.abs(y - exact).max() < 0.02 * np.abs(exact).max()


def _rows_case(fmt):
    rng = np.random.default_rng(2)
    N, K = 96, 320  # 6 tiles (an odd tile after the pairs in some chunks), 10 blocks of 32
    codes, scale, mins, bias = weights(rng, N, K, True, True, fmt)
    return model(N, K, codes, scale, mins, bias, fmt=fmt), activations(rng, 64, K)


def rows_any_call(blob: bytes, form: str, monkeypatch, x: np.ndarray, definition: np.ndarray) -> None:
    for threads in (1, 2):
        s = session(blob, form, monkeypatch, threads)
        alone = np.concatenate([s.run(None, {"x": x[i:i + 1]})[0] for i in range(len(x))])
        assert np.array_equal(alone, definition), threads
        for M in (2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 33, 64):
            for start in (0, 64 - M):
                y = s.run(None, {"x": x[start:start + M]})[0]
                assert np.array_equal(y, alone[start:start + M]), (threads, M, start)


@pytest.mark.parametrize("form", isa_forms())
@pytest.mark.parametrize("fmt", FMTS)
def test_a_row_is_the_same_bits_in_any_call(fmt, form, monkeypatch):
    """Each row alone, and in calls of 2..64 rows at either end, with 1 and 2 threads: the same
    bits as the portable form (the definition) gives that row alone."""
    blob, x = _rows_case(fmt)
    ref = session(blob, "ref", monkeypatch, 1)
    definition = np.concatenate([ref.run(None, {"x": x[i:i + 1]})[0] for i in range(len(x))])
    rows_any_call(blob, form, monkeypatch, x, definition)


@pytest.mark.parametrize("form", isa_forms(("avx2", "avxvnni")))
def test_a_form_that_reorders_one_sum_is_caught(form, monkeypatch):
    """The library built with SPECRT_MUTANT (the AVX2 form's whole-tile loop, and so the AVX-VNNI
    form's, adds each block's terms to the accumulator last, in blocks of 4 rows) must fail the
    test above."""
    if not (shutil.which("make") and shutil.which("g++")):
        pytest.skip("the mutant library needs make and g++")
    built = subprocess.run(["make", "-s", "kernels-mutant"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, f"could not build the mutant library: {built.stderr[-300:]}"
    blob, x = _rows_case((4, 32))
    ref = session(blob, "ref", monkeypatch, 1)
    definition = np.concatenate([ref.run(None, {"x": x[i:i + 1]})[0] for i in range(len(x))])
    monkeypatch.setenv("SPECRT_KERNELS", str(ROOT / ".cache/kernels-mutant/libspecrt_kernels.so"))
    with pytest.raises(AssertionError):
        rows_any_call(blob, form, monkeypatch, x, definition)
    monkeypatch.delenv("SPECRT_KERNELS")
    rows_any_call(blob, form, monkeypatch, x, definition)  # the real library passes it


def test_leading_dims_are_kept(monkeypatch):
    rng = np.random.default_rng(3)
    codes, scale, mins, _ = weights(rng, 32, 64)
    s = session(model(32, 64, codes, scale, mins), BEST, monkeypatch)
    x = activations(rng, 6, 64)
    y = s.run(None, {"x": x.reshape(2, 3, 64)})[0]
    assert y.shape == (2, 3, 32)
    assert np.array_equal(y.reshape(6, 32), s.run(None, {"x": x})[0])
    assert s.run(None, {"x": np.zeros((0, 64), np.float32)})[0].shape == (0, 32)


def test_bad_shapes_are_clear_errors(monkeypatch):
    rng = np.random.default_rng(4)
    codes, scale, mins, _ = weights(rng, 32, 64)
    s = session(model(32, 64, codes, scale, mins), BEST, monkeypatch)
    with pytest.raises(Exception, match="x's last dimension must be K = 64"):
        s.run(None, {"x": np.zeros((2, 32), np.float32)})
    with pytest.raises(Exception, match="K must be a multiple of 32"):
        session(model(32, 64, codes, scale, mins, k_attr=48), BEST, monkeypatch).run(
            None, {"x": np.zeros((1, 48), np.float32)})
    with pytest.raises(Exception, match="codes must hold"):
        session(model(32, 64, codes, scale, mins, k_attr=96), BEST, monkeypatch).run(
            None, {"x": np.zeros((1, 96), np.float32)})
    with pytest.raises(ValueError, match="multiple of 16"):
        layout.pack(codes[:20], scale[:20], mins[:20])
    with pytest.raises(ValueError, match="not 4-bit in blocks of 16"):
        layout.pack(codes, np.ones((32, 4), np.float32), None, 4, 16)
    m = onnx.load_from_string(model(32, 64, codes, np.ones((32, 4), np.float32), fmt=(8, 16)))
    next(a for a in m.graph.node[0].attribute if a.name == "block_size").i = 64
    with pytest.raises(Exception, match="block_size must be 16 or 32"):
        session(m.SerializeToString(), BEST, monkeypatch)


def test_pack_places_each_code_where_the_kernel_reads_it():
    rng = np.random.default_rng(5)
    codes = rng.integers(0, 16, (48, 96), dtype=np.uint8)
    packed, _, _ = layout.pack(codes, np.ones((48, 3), np.float32))
    for t, b, j, c, i in [(0, 0, 0, 0, 0), (2, 1, 3, 5, 2), (1, 2, 1, 15, 3)]:
        byte = packed[t, b, 64 * j + 4 * c + i]
        assert byte & 15 == codes[16 * t + c, 32 * b + 4 * j + i]
        assert byte >> 4 == codes[16 * t + c, 32 * b + 4 * (j + 4) + i]
    codes = rng.integers(0, 256, (48, 96), dtype=np.uint8)
    packed, _, _ = layout.pack(codes, np.ones((48, 6), np.float32), None, 8, 16)
    for t, b, j, c, i in [(0, 0, 0, 0, 0), (2, 5, 3, 5, 2), (1, 2, 1, 15, 3)]:
        assert packed[t, b, 64 * j + 4 * c + i] == codes[16 * t + c, 16 * b + 4 * j + i]


def test_missing_library_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECRT_KERNELS", str(tmp_path / "nope.so"))
    assert not kernels.available()
    with pytest.raises(kernels.KernelsMissing, match="make kernels"):
        kernels.register(ort.SessionOptions())
