"""The packed graphs on specrt's own 4-bit operator (export/kernel_graph.py, runtime/kernels):
written where the form applies, a row's bits in any call, the model's numbers, and speculative =
target-only through the engine, alone and under concurrency."""

from __future__ import annotations

import json
import shutil
import threading
from collections import Counter

import numpy as np
import onnx
import pytest
from tiny_gguf import write_tiny_gguf

import specrt
from checks import (
    assert_missing_file_is_a_bundle_error,
    check_row_invariance,
    fill_slot,
    packed_model,
)
from specrt.export import export_bundle
from specrt.export.kernel_graph import add_kernel_graphs
from specrt.runtime.bundle.manifest import load_manifest

KW = dict(draft="none", max_draft_tokens=16, echo=None)


@pytest.fixture(scope="module")
def bundles(tiny_dirs, tmp_path_factory):
    base = tmp_path_factory.mktemp("kernels")
    gguf = write_tiny_gguf(base / "tiny.gguf")
    export_bundle(str(gguf), base / "gguf", precision="gguf", accuracy_level=4, max_seq_len=256, **KW)
    export_bundle(str(gguf), base / "gguf-l0", precision="gguf", accuracy_level=0, max_seq_len=256, **KW)
    export_bundle(str(tiny_dirs["target"]), base / "int4-l0", precision="int4", accuracy_level=0, max_seq_len=256, **KW)
    # a Q4_K_M-like file (the coder's types): every projection QMatMulGGML's, every node row-exact
    km = write_tiny_gguf(base / "km.gguf", types=[{"attn_q": "Q4_K", "attn_k": "Q4_K", "attn_v": "Q6_K",
                                                    "attn_output": "Q4_K", "ffn_gate": "Q4_K", "ffn_up": "Q4_K",
                                                    "ffn_down": "Q6_K"}] * 2)
    export_bundle(str(km), base / "km", precision="gguf", accuracy_level=4, max_seq_len=256, **KW)
    # the same bundle with the kernel graphs made without the GGUF: QMatMul4 / QMatMul8 over the
    # packed graphs' fp32 scales and mins (a bundle exported before QMatMulGGML)
    shutil.copytree(base / "gguf", base / "gguf-qm")
    man = load_manifest(base / "gguf-qm")
    add_kernel_graphs(base / "gguf-qm", man.target)
    man.save(base / "gguf-qm")
    return {"gguf": base / "gguf", "gguf-l0": base / "gguf-l0", "int4-l0": base / "int4-l0", "gguf-qm": base / "gguf-qm",
            "km": base / "km", "file": gguf}


def _ops(path) -> Counter:
    g = onnx.load(str(path), load_external_data=False).graph
    bits = Counter(f"{a['bits']}-bit/{a['block_size']} MatMulNBits" for n in g.node if n.op_type == "MatMulNBits"
                   for a in [{a.name: a.i for a in n.attribute}])
    return Counter(n.op_type for n in g.node) + bits


def test_written_where_the_form_applies(bundles):
    man = load_manifest(bundles["gguf"])
    assert man.target.packed.kernels == "target/packed{lanes}.kernels.onnx"
    assert (bundles["gguf"] / man.target.packed.kernel_data).is_file()
    before = _ops(bundles["gguf"] / man.target.packed.file(4))
    after = _ops(bundles["gguf"] / man.target.packed.kernel_file(4))
    qm = _ops(bundles["gguf-qm"] / man.target.packed.kernel_file(4))
    # the tiny GGUF's 4-bit Q4_K x3, Q4_0 and Q4_1; its 8-bit Q5_0, Q5_1, Q5_K, Q6_K x2, Q8_0
    # and Q6_K LM head (export/tiny_gguf.py; export/gguf_blocks.py FORMS); Q2_K and Q3_K (4 bits
    # in blocks of 16) stay MatMulNBits. Exported from the GGUF, QMatMulGGML reads the Q4_K,
    # Q4_0, Q5_K, Q6_K and Q8_0 blocks; Q4_1, Q5_0 and Q5_1 keep QMatMul4 / QMatMul8.
    assert before["4-bit/32 MatMulNBits"] == qm["QMatMul4"] == 5
    assert before["8-bit/16 MatMulNBits"] + before["8-bit/32 MatMulNBits"] == qm["QMatMul8"] == 7
    assert (after["QMatMulGGML"], after["QMatMul4"], after["QMatMul8"]) == (9, 1, 2) and not qm["QMatMulGGML"]
    assert after["MatMulNBits"] == after["4-bit/16 MatMulNBits"] == qm["MatMulNBits"] == 2
    # the mins' corrections (Q4_K x3, Q4_1, Q5_1, Q5_K) went into the operators
    assert after["MatMul"] == before["MatMul"] - 6
    # each layer's per-lane attention (a Gather and a GQA per lane, a Concat, the unpack Gather)
    # is one PackedAttention over every lane
    layers = man.target.kv.layers
    assert before["GroupQueryAttention"] == 4 * layers and after["GroupQueryAttention"] == 0
    assert after["PackedAttention"] == layers
    # level 0 computes its projections in fp32, left alone; its attention runs on the operator
    l0 = load_manifest(bundles["int4-l0"]).target
    ops = _ops(bundles["int4-l0"] / l0.packed.kernel_file(2))
    assert ops["PackedAttention"] == l0.kv.layers and not ops["QMatMul4"] + ops["QMatMul8"] + ops["GroupQueryAttention"]


def test_a_rows_bits_do_not_depend_on_the_call(bundles):
    # MatMulNBits and the mins' fp32 MatMul left for the types QMatMulGGML does not read: fillers
    assert not load_manifest(bundles["gguf"]).target.packed.one_row
    assert check_row_invariance(bundles["gguf"], [100, 3, 230, 40, 17, 200, 64, 120], kernels=True) == 18
    # every node computes a lone row as a wide call does: a lone token runs as one row, no filler
    # (the check's width 1 alone is then a one-row call against the same row beside others)
    assert load_manifest(bundles["km"]).target.packed.one_row
    e, _, pm = packed_model(bundles["km"], max_seq_len=64, kernels=True)
    assert pm.filler is False and _ops(bundles["km"] / e.packed.kernel_file(2))["QMatMulGGML"] == 13
    assert check_row_invariance(bundles["km"], [100, 3, 230, 40, 17, 200, 64, 120], kernels=True) == 18
    assert not load_manifest(bundles["int4-l0"]).target.packed.one_row
    # fp32 projections (MLAS SGEMM, which the fillers keep off M = 1) with the attention operator
    assert check_row_invariance(bundles["int4-l0"], [70, 130, 5, 64, 63, 200, 1, 33], kernels=True) == 18


def test_the_attention_operator_computes_what_gqa_does(bundles):
    """Level 0 graphs differ only in their attention: the operator's logits match GQA's to float
    rounding, at short and longer contexts and across the softmax's 64-position chunks."""
    rng = np.random.default_rng(5)
    for ctx, T in ((0, 7), (63, 3), (150, 17)):
        toks = rng.integers(3, 120, ctx + T)
        out = {}
        for kernels in (False, True):
            _, _, pm = packed_model(bundles["int4-l0"], slots=1, lanes=1, kernels=kernels)
            assert pm.graph.name == ("packed1.kernels.onnx" if kernels else "packed1.onnx")
            fill_slot(pm, 0, toks[:ctx])
            out[kernels] = pm.run(0, toks[ctx:], ctx).copy()
        assert not np.array_equal(out[True], out[False])  # another kernel ran
        np.testing.assert_allclose(out[True], out[False], rtol=0, atol=2e-4 * np.abs(out[False]).max())


def test_as_close_to_the_gguf_weights_as_matmulnbits(bundles):
    """The level-0 export computes in fp32 over the GGUF's exact weights: the reference. Both
    level-4 forms quantize activations to int8 per 32-block; onnxruntime's adds the mins' term
    from the fp32 block sums, the operator from the quantized ones, the exact dot of the
    dequantized weights with the quantized activations (as llama.cpp does)."""
    toks = np.random.default_rng(3).integers(3, 120, 60)
    out = {}
    for name, kernels in (("gguf-l0", False), ("gguf", False), ("gguf", True)):
        _, _, pm = packed_model(bundles[name], slots=1, lanes=1, kernels=kernels)
        fill_slot(pm, 0, toks[:50])
        out[name, kernels] = pm.run(0, toks[50:60], 50).copy()
    ref = out["gguf-l0", False]
    err = {k: np.abs(v - ref).mean() / np.abs(ref).mean() for k, v in out.items()}
    print("mean |logit error| against fp32, relative:", err)
    assert not np.array_equal(out["gguf", True], out["gguf", False])  # another kernel ran
    assert err["gguf", True] <= 1.2 * err["gguf", False]
    assert (out["gguf", True].argmax(-1) == ref.argmax(-1)).mean() >= 0.9


def _solo(pipe, prompt, n):
    return [t for c in pipe.stream_ids(prompt, max_new_tokens=n, draft="none", k=0, ignore_eos=True) for t in c]


def test_speculative_equals_target_only_alone_and_together(bundles):
    prompts = [[1, 5, 9, 33, 7, 5, 9, 33, 7, 5, 9], [4, 8, 15, 16, 23, 42, 8, 15, 16], [3, 3, 7, 7, 3, 3, 7],
               list(range(10, 70))]
    with specrt.load(bundles["gguf"], max_batch=4) as pipe:
        assert pipe.parts.target.graph.name == "packed4.kernels.onnx"
        want = [_solo(pipe, p, 30) for p in prompts]
        got = [[t for c in pipe.stream_ids(p, max_new_tokens=30, draft="ngram", k=4, ignore_eos=True) for t in c]
               for p in prompts]
        assert got == want
        together, errors = {}, []

        def client(i):
            try:
                together[i] = [t for c in pipe.stream_ids(prompts[i], max_new_tokens=30, draft="ngram", k=3,
                                                           ignore_eos=True) for t in c]
            except Exception as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors and [together[i] for i in range(len(prompts))] == want


def test_no_kernels_no_avx512_and_no_library_run_the_matmulnbits_graph(bundles, monkeypatch):
    with specrt.load(bundles["gguf"], max_batch=2, draft="none", kernels=False) as pipe:
        assert pipe.parts.target.graph.name == "packed2.onnx"
    monkeypatch.setenv("SPECRT_KERNELS_ISA", "ref")  # a CPU without AVX-512: only the slow C++ form
    with specrt.load(bundles["gguf"], max_batch=2, draft="none") as pipe:
        assert pipe.parts.target.graph.name == "packed2.onnx"
    monkeypatch.delenv("SPECRT_KERNELS_ISA")
    monkeypatch.setenv("SPECRT_KERNELS", "/nonexistent/libspecrt_kernels.so")
    with specrt.load(bundles["gguf"], max_batch=2, draft="none") as pipe:
        assert pipe.parts.target.graph.name == "packed2.onnx"


def test_a_missing_kernel_file_is_a_clear_bundle_error(bundles, tmp_path):
    assert_missing_file_is_a_bundle_error(bundles["gguf"], "target/kernels.onnx.data", tmp_path)


def test_exported_from_the_gguf_the_projections_stream_its_bytes(bundles):
    """Each QMatMulGGML reads the GGUF tensors it was imported from, as many bytes as the file
    holds for them (rows repacked 16 at a time, export/kernel_blocks.py)."""
    from gguf import GGUFReader

    sizes = {t.name: int(t.n_bytes) for t in GGUFReader(str(bundles["file"])).tensors}
    g = onnx.load(str(bundles["gguf"] / load_manifest(bundles["gguf"]).target.packed.kernel_file(2)),
                  load_external_data=False).graph
    dims = {t.name: t.dims for t in g.initializer}
    ops = [n for n in g.node if n.op_type == "QMatMulGGML"]
    for n in ops:
        parts = json.loads(n.doc_string)["gguf"]
        assert int(np.prod(dims[n.input[1]])) == sum(sizes[p["tensor"]] for p in parts), n.name
    q = next(json.loads(n.doc_string)["gguf"][0] for n in ops if "attn_q" in n.doc_string)
    assert q["order"] is not None and sorted(q["order"]) == list(range(q["rows"]))  # llama's q rows, permuted


def test_blocks_compute_what_the_qmatmul_graphs_do(bundles):
    """Q4_K / Q5_K take QMatMul4 / QMatMul8's float steps on the same weights (the same bits);
    Q6_K, Q8_0 and Q4_0 take the zero point out in int32 (native/qmatmul_ggml.h): the logits of
    the two kernel graphs agree but for float rounding (int8 activations can round it up to a
    step), and so does greedy output through the engine."""
    toks = np.random.default_rng(5).integers(3, 120, 200)
    for ctx, T in ((0, 7), (50, 10), (150, 17)):
        out = {}
        for name in ("gguf", "gguf-qm"):
            _, _, pm = packed_model(bundles[name], slots=1, lanes=1, kernels=True)
            fill_slot(pm, 0, toks[:ctx])
            out[name] = pm.run(0, toks[ctx:ctx + T], ctx).copy()
        assert not np.array_equal(out["gguf"], out["gguf-qm"])  # other steps ran
        np.testing.assert_allclose(out["gguf"], out["gguf-qm"], rtol=0, atol=1e-2 * np.abs(out["gguf-qm"]).max())
        assert (out["gguf"].argmax(-1) == out["gguf-qm"].argmax(-1)).all()
    prompts = [[1, 5, 9, 33, 7, 5, 9, 33, 7, 5, 9], [4, 8, 15, 16, 23, 42, 8, 15, 16], list(range(10, 70))]
    greedy = {}
    for name in ("gguf", "gguf-qm"):
        with specrt.load(bundles[name], max_batch=1) as pipe:
            greedy[name] = [_solo(pipe, p, 40) for p in prompts]
    assert greedy["gguf"] == greedy["gguf-qm"]
