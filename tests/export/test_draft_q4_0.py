"""A draft's symmetric int4 weights on QMatMulGGML's Q4_0 blocks (export/kernel_graph.py
`_q4_0_weight`; docs/design.md "A draft's int4 in Q4_0 blocks"): the same weights in 4.5 bits
instead of QMatMul4's 6, only for a draft, only where exactly the same; the target's graphs
untouched; speculation over it equals target-only."""

from __future__ import annotations

import shutil
from collections import Counter

import numpy as np
import onnx
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize
from onnx import TensorProto, helper, numpy_helper
from tiny_gguf import write_tiny_gguf

import specrt
from specrt.export import export_bundle
from specrt.export.kernel_graph import _Graph, _q4_0_weight, add_kernel_graphs, rewrite
from specrt.export.quantize import dequantize, quantize_rtn_sym
from specrt.export.steps import kernel_decoder
from specrt.runtime.bundle.manifest import load_manifest

KW = dict(max_seq_len=256, max_draft_tokens=8, echo=None)
PROMPTS = [[1, 5, 9, 33, 7, 5, 9, 33, 7, 5, 9], [4, 8, 15, 16, 23, 42, 8, 15, 16], list(range(10, 50))]


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    """The coder pair's recipe on tiny GGUFs (a gguf target, an int4 draft cut to 64 tokens), with
    its portable graphs; the same bundle with the draft's kernel graphs made as a target's
    (QMatMul4); and a self-int4 draft of an RTN target."""
    base = tmp_path_factory.mktemp("draft_q4_0")
    target = str(write_tiny_gguf(base / "t.gguf"))
    draft = str(write_tiny_gguf(base / "d.gguf", seed=2, tie=True, embd="Q4_K"))
    export_bundle(target, base / "pair", draft=draft, precision="gguf", accuracy_level=4, draft_precision="int4",
                  draft_vocab=64, **KW)
    shutil.copytree(base / "pair", base / "pair-qm")
    man = load_manifest(base / "pair-qm")
    add_kernel_graphs(base / "pair-qm", man.draft)  # draft=False: QMatMul4, as before
    man.save(base / "pair-qm")
    export_bundle(target, base / "self", precision="int4", draft="self-int4", **KW)
    return {"pair": base / "pair", "pair-qm": base / "pair-qm", "self": base / "self"}


def _ops(path) -> Counter:
    g = onnx.load(str(path), load_external_data=False).graph
    return Counter((n.op_type, {a.name: a.s for a in n.attribute}.get("type", b"").decode()) for n in g.node
                   if n.op_type.startswith("QMatMul") or n.op_type == "MatMulNBits")


def _exact_in_q4_0(folder, entry) -> tuple[int, int]:
    """(projections whose weights Q4_0 holds exactly, others) in `entry`'s packed graph."""
    model = onnx.load(str(folder / entry.packed.file(1)), load_external_data=False)
    gr = _Graph(model.graph, (folder / entry.graph).parent)
    held = [_q4_0_weight(gr, n, (4, 32), None) is not None for n in model.graph.node if n.op_type == "MatMulNBits"]
    return sum(held), len(held) - sum(held)


@pytest.mark.parametrize("name", ["pair", "self"])
def test_every_int4_projection_of_the_draft_reads_q4_0_blocks(bundles, name):
    """Where Q4_0 holds the weights exactly: all of the GGUF draft's; the self-draft of this tiny
    RTN target has blocks of near-zero weights whose scales fp16 cannot hold (the coder's 0.5B has none)."""
    man = load_manifest(bundles[name])
    held, kept = _exact_in_q4_0(bundles[name], man.draft)
    assert held > 0 and (kept == 0 if name == "pair" else kept > 0)
    for lanes in man.draft.packed.lanes:
        before = _ops(bundles[name] / man.draft.packed.file(lanes))
        after = _ops(bundles[name] / man.draft.packed.kernel_file(lanes))
        assert before[("MatMulNBits", "")] == held + kept
        assert after == Counter({("QMatMulGGML", "Q4_0"): held, ("QMatMul4", ""): kept}) - Counter()
    # the target keeps its operators: QMatMul4 where its GGUF tensor is no QMatMulGGML type (Q4_1),
    # QMatMul4 for an RTN target's int4 (its wide verification calls take QMatMul4's AMX path)
    target = _ops(bundles[name] / man.target.packed.kernel_file(2))
    assert target[("QMatMul4", "")] >= 1 and not target[("QMatMulGGML", "Q4_0")] * (name == "self")


def test_the_blocks_hold_the_packed_graphs_weights_in_4_5_bits(bundles):
    man = load_manifest(bundles["pair"])
    folder = bundles["pair"] / man.draft.graph.rsplit("/", 1)[0]
    model = onnx.load(str(bundles["pair"] / man.draft.packed.file(1)), load_external_data=False)
    gr = _Graph(model.graph, folder)
    weights = 0
    for n in model.graph.node:
        if n.op_type != "MatMulNBits":
            continue
        a = {x.name: x.i for x in n.attribute}
        raw = _q4_0_weight(gr, n, (a["bits"], a["block_size"]), None)
        assert raw is not None and raw.shape == (a["N"], a["K"] // 32, 18)
        got = gguf_dequantize(raw.reshape(a["N"], -1), GGMLQuantizationType.Q4_0)
        want = dequantize(gr.value(n.input[1]).reshape(a["N"], -1, 16), gr.value(n.input[2]).reshape(a["N"], -1),
                          a["K"])
        np.testing.assert_array_equal(got, want)
        weights += a["N"] * a["K"]
    data = (bundles["pair"] / man.draft.packed.kernel_data).stat().st_size
    assert weights * 4.5 / 8 <= data < weights * 4.5 / 8 + 64 * 200  # each array 64-byte aligned
    qm = load_manifest(bundles["pair-qm"]).draft
    assert (bundles["pair-qm"] / qm.packed.kernel_data).stat().st_size >= weights * 6 / 8  # QMatMul4's 6 bits


def _node(w: np.ndarray, name: str, zero_points: bool = False):
    """A 4-bit, block-32 MatMulNBits over w [N, K] (export/quantize.py's RTN) and its initializers."""
    packed, scales = quantize_rtn_sym(w)
    inits = [numpy_helper.from_array(packed, name + "_B"), numpy_helper.from_array(scales, name + "_s")]
    inputs = ["x", name + "_B", name + "_s"]
    if zero_points:
        inits.append(numpy_helper.from_array(np.full((w.shape[0], w.shape[1] // 64), 0x88, np.uint8), name + "_zp"))
        inputs.append(name + "_zp")
    node = helper.make_node("MatMulNBits", inputs, [name + "_y"], domain="com.microsoft", K=w.shape[1], N=w.shape[0],
                            bits=4, block_size=32, accuracy_level=4)
    return node, inits


def test_only_weights_q4_0_holds_exactly_become_blocks(tmp_path):
    """A scale below fp16's normal range (a block of near-zero weights) or explicit zero points keep
    QMatMul4; so does any weight without `q4_0` (a target's)."""
    rng = np.random.default_rng(0)
    w = rng.normal(0, 0.02, (32, 64)).astype(np.float32)
    tiny = w.copy()
    tiny[3, :32] *= 1e-4  # that block's scale ~1e-7: an fp32 with fp16's mantissa, not an fp16
    nodes, inits = zip(*(_node(w, "a"), _node(tiny, "b"), _node(w, "c", zero_points=True)), strict=True)
    g = helper.make_graph(list(nodes), "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                          [helper.make_tensor_value_info(f"{c}_y", TensorProto.FLOAT, [1, 32]) for c in "abc"],
                          [i for two in inits for i in two])
    model = helper.make_model(g)
    ops = {q4_0: [(n.op_type, n.output[0]) for n in rewrite(model, tmp_path, {}, q4_0=q4_0).graph.node]
           for q4_0 in (True, False)}
    assert ops[True] == [("QMatMulGGML", "a_y"), ("QMatMul4", "b_y"), ("QMatMul4", "c_y")]
    assert ops[False] == [("QMatMul4", "a_y"), ("QMatMul4", "b_y"), ("QMatMul4", "c_y")]


def test_the_drafts_logits_are_qmatmul4s_to_float_rounding(bundles):
    """The same weights, another order of float steps (one fma per block against two): the draft's
    logits move by rounding only (a few 1e-4 of their range: a rounding that moves one int8
    activation of the next layer carries on through the layers)."""
    new, old = load_manifest(bundles["pair"]).draft, load_manifest(bundles["pair-qm"]).draft
    for prompt in PROMPTS:
        got = kernel_decoder(bundles["pair"], new).prefill(prompt)
        want = kernel_decoder(bundles["pair-qm"], old).prefill(prompt)
        finite = np.isfinite(want)
        assert np.array_equal(finite, np.isfinite(got)) and finite.sum() == 64  # the subset's
        np.testing.assert_allclose(got[finite], want[finite], rtol=0, atol=1e-3 * np.abs(want[finite]).max())


@pytest.mark.parametrize("name", ["pair", "self"])
def test_speculative_equals_target_only_alone_and_together(bundles, name):
    with specrt.load(bundles[name], max_batch=2) as pipe:
        want = {i: [t for c in pipe.stream_ids(p, max_new_tokens=24, draft="none", ignore_eos=True) for t in c]
                for i, p in enumerate(PROMPTS)}
        for i, p in enumerate(PROMPTS):
            got = [t for c in pipe.stream_ids(p, max_new_tokens=24, draft="model", k=4, ignore_eos=True) for t in c]
            assert got == want[i], (name, i)
        streams = [pipe.stream_ids(p, max_new_tokens=24, draft="model", k=4, ignore_eos=True) for p in PROMPTS[:2]]
        got = [[t for c in s for t in c] for s in streams]
        assert got == [want[0], want[1]]
