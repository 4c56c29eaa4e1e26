"""Weight-only quantized targets: a GGUF's own blocks imported exactly (precision gguf) and RTN
int4 / int8 from any source, each held to parity with transformers on the same weights, and
speculation over them equal to target-only decoding."""

import json

import numpy as np
import onnx
import pytest
from tiny_gguf import EOT, TYPES, write_tiny_gguf

import specrt
from specrt.export import export_bundle
from specrt.export.quant_target import level0_twin
from specrt.runtime.bundle.manifest import load_manifest

KW = dict(max_seq_len=256, max_draft_tokens=8, echo=None)


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@pytest.fixture(scope="module")
def quant_bundles(tiny_gguf, tiny_dirs, tmp_path_factory):
    base = tmp_path_factory.mktemp("qbundles")
    hf = str(tiny_dirs["target"])
    specs = {
        "gguf-l0": (str(tiny_gguf), dict(precision="gguf", accuracy_level=0, draft="self-int8")),
        "gguf-l4": (str(tiny_gguf), dict(precision="gguf", accuracy_level=4, draft=str(tiny_gguf))),
        "int4": (hf, dict(precision="int4", draft="self-int8")),
        "int8-l0": (hf, dict(precision="int8", accuracy_level=0, draft=str(tiny_dirs["bad_draft"]))),
    }
    for name, (src, kw) in specs.items():
        export_bundle(src, base / name, **kw, **KW)
    return {name: base / name for name in specs}


def _nodes(bundle, op):
    m = onnx.load(str(bundle / "target" / "model.onnx"), load_external_data=False)
    return [n for n in m.graph.node if n.op_type == op]


def test_gguf_import_is_exact_and_recorded_per_type(quant_bundles):
    man = load_manifest(quant_bundles["gguf-l0"])
    t = man.target
    assert t.precision == "gguf" and t.parity["passed"] and t.parity["tolerance"] == 1e-3
    # the GGUF's own end tokens join the tokenizer's EOS in the end-of-generation ids
    eos = man.tokenizer.eos_token_ids
    assert 2 in eos and EOT not in eos and man.tokenizer.eog_token_ids == sorted({*eos, EOT})
    assert t.parity["tokenizer_vs_gguf"]["ends"] == {"eos": 2, "eot": EOT}
    assert t.parity["prefill_max_abs"] < 1e-3 and t.parity["greedy_match"] == t.parity["greedy_steps"]
    q = t.quantization
    counts = {}
    for layer in TYPES:
        for kind in layer.values():
            counts[kind] = counts.get(kind, 0) + 1
    counts["Q8_0"] += 1  # token_embd
    counts["Q6_K"] += 1  # output
    assert {k: v["tensors"] for k, v in q["types"].items() if k != "F32"} == counts
    assert q["fallback"] == {"IQ4_NL": {"reason": "IQ4_NL has no exact MatMulNBits form", "tensors": ["blk.1.ffn_up.weight"]}}
    assert "zero point 0, per-block mins" in q["types"]["Q4_K"]["form"]
    # at level 0 the 8-bit forms run as float (no fp32-compute 8-bit kernel): only 4-bit nodes
    nodes = _nodes(quant_bundles["gguf-l0"], "MatMulNBits")
    assert nodes and {a.i for n in nodes for a in n.attribute if a.name == "bits"} == {4}
    assert {a.i for n in nodes for a in n.attribute if a.name == "accuracy_level"} == {0}
    assert "accuracy_level 4" in q["types"]["Q6_K"]["form"]


def test_gguf_embedding_is_gathered_from_the_files_blocks(quant_bundles):
    """The untied tiny GGUF's Q8_0 token table: GatherBlockQuantized, no fp32 table in the graph
    (its rows are the dequantized ones bit for bit: tests/export/test_gather_blocks.py; the
    parity gate above covers the whole graph)."""
    for name in ("gguf-l0", "gguf-l4"):
        assert len(_nodes(quant_bundles[name], "GatherBlockQuantized")) == 1
        assert not [n for n in _nodes(quant_bundles[name], "Gather") if "embed_tokens" in n.input]
        assert "GatherBlockQuantized over the file's Q8_0 blocks" in load_manifest(quant_bundles[name]).target.quantization["embedding"]


def test_a_tied_float_head_keeps_sharing_the_fp32_table(tmp_path):
    """Tied, level 0: the Q8_0 head runs as float over the table the Gather reads (one copy)."""
    src = write_tiny_gguf(tmp_path / "tied.gguf", tie=True)
    export_bundle(str(src), tmp_path / "b", precision="gguf", accuracy_level=0, draft="none", **KW)
    assert not _nodes(tmp_path / "b", "GatherBlockQuantized")
    gemm = _nodes(tmp_path / "b", "Gemm")
    assert gemm and "embed_tokens" in gemm[0].input
    assert load_manifest(tmp_path / "b").target.parity["passed"]


def test_gguf_level4_is_gated_on_its_level0_twin(quant_bundles):
    t = load_manifest(quant_bundles["gguf-l4"]).target
    p = t.parity
    assert p["passed"] and p["checked_at_accuracy_level"] == 0 and p["prefill_max_abs"] < 1e-3
    own = p["accuracy_level_4"]
    assert own["greedy_steps"] == p["greedy_steps"] and own["prefill_max_abs"] > p["prefill_max_abs"]
    nodes = _nodes(quant_bundles["gguf-l4"], "MatMulNBits")
    assert {a.i for n in nodes for a in n.attribute if a.name == "bits"} == {4, 8}
    assert {a.i for n in nodes for a in n.attribute if a.name == "block_size"} == {16, 32}
    assert not list((quant_bundles["gguf-l4"] / "target").glob("*level0*"))  # the twin is gone


def test_level0_twin_shares_the_weights_file(quant_bundles, tmp_path):
    import shutil

    folder = tmp_path / "b"
    shutil.copytree(quant_bundles["gguf-l4"], folder)
    entry = load_manifest(folder).target
    twin = level0_twin(folder, entry)
    m = onnx.load(str(folder / twin.graph), load_external_data=False)
    levels = {a.i for n in m.graph.node if n.op_type == "MatMulNBits" for a in n.attribute if a.name == "accuracy_level"}
    assert levels == {0}
    locs = {e.value for init in m.graph.initializer for e in init.external_data if e.key == "location"}
    assert locs == {entry.data.split("/")[-1]}


@pytest.mark.parametrize("name,bits", [("int4", 4), ("int8-l0", 8)])
def test_rtn_targets_match_transformers_on_the_fake_quantized_weights(quant_bundles, name, bits):
    t = load_manifest(quant_bundles[name]).target
    assert t.parity["passed"] and t.parity["prefill_max_abs"] < 1e-3
    assert t.quantization["method"] == "rtn" and t.quantization["bits"] == bits
    if name == "int8-l0":  # 8-bit at level 0 runs as float over the fake-quantized values
        assert not _nodes(quant_bundles[name], "MatMulNBits")
    else:
        assert len(_nodes(quant_bundles[name], "MatMulNBits")) == 2 * 4 + 1  # per layer qkv, o, gate_up, down; the LM head


def _logits(bundle, ids):
    from specrt.runtime.backends.harness import SequenceHarness
    from specrt.runtime.backends.ort import OrtBackend

    entry = load_manifest(bundle).target
    dec = SequenceHarness(OrtBackend(bundle / entry.graph, entry), "target")
    return dec.forward(np.array(ids, dtype=np.int64)).copy()


def test_rtn_values_differ_from_the_float_target(quant_bundles, tiny_dirs, tmp_path):
    """The int4 target is another model than the fp32 one (else its parity would prove nothing)."""
    export_bundle(str(tiny_dirs["target"]), tmp_path / "fp32", draft="none", **KW)
    ids = [1, 5, 9, 33, 7]
    assert np.abs(_logits(tmp_path / "fp32", ids) - _logits(quant_bundles["int4"], ids)).max() > 1e-2


def test_gguf_precision_needs_a_gguf_source(tiny_dirs, tmp_path):
    with pytest.raises(ValueError, match="not a GGUF source"):
        export_bundle(str(tiny_dirs["target"]), tmp_path / "x", precision="gguf", draft="none", **KW)
    assert not (tmp_path / "x").exists()


def test_quantized_target_needs_the_ort_lowering(tiny_dirs, tmp_path):
    with pytest.raises(ValueError, match="only the 'ort' lowering"):
        export_bundle(str(tiny_dirs["target"]), tmp_path / "x", precision="int4", lowering="standard", draft="none", **KW)


def test_fallback_is_said(tiny_gguf, tmp_path):
    said = []
    export_bundle(str(tiny_gguf), tmp_path / "b", precision="gguf", draft="none", **{**KW, "echo": said.append})
    msg = [m for m in said if "IQ4_NL" in m]
    assert msg and "blk.1.ffn_up.weight" in msg[0] and "float MatMul" in msg[0]
    assert json.loads((tmp_path / "b" / "specrt.json").read_text())["target"]["quantization"]["fallback"]


MODES = [("model", False), ("ngram", False), ("auto", False), ("model", True), ("ngram", True), ("auto", True)]
PROMPTS = [[1, 5, 9, 33, 7], [1, 100, 4, 4, 4, 90, 12, 60], [1, 5, 9, 33, 7, 5, 9, 33, 7, 5, 9]]


@pytest.mark.parametrize("bundle", ["gguf-l0", "gguf-l4", "int4", "int8-l0"])
@pytest.mark.parametrize("draft,adaptive", MODES)
@pytest.mark.parametrize("k", [1, 4])
def test_speculation_over_a_quantized_target_equals_target_only(quant_bundles, bundle, draft, adaptive, k):
    with specrt.load(quant_bundles[bundle], adaptive=False) as pipe:
        for prompt in PROMPTS:
            want = [t for c in pipe.stream_ids(prompt, max_new_tokens=30, draft="none", k=0) for t in c]
            got = [t for c in pipe.stream_ids(prompt, max_new_tokens=30, k=k, draft=draft, adaptive=adaptive) for t in c]
            assert got == want, (bundle, draft, adaptive, k, prompt)


def test_cli_exports_and_inspects_a_gguf_import(tiny_gguf, tmp_path):
    import subprocess
    import sys

    out = tmp_path / "cli"
    cmd = [sys.executable, "-m", "specrt.cli", "export", "--target", str(tiny_gguf), "--draft", "none",
           "--precision", "gguf", "--accuracy-level", "0", "--max-seq-len", "256", "--max-draft-tokens", "4", "--out", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "IQ4_NL" in res.stderr  # the fallback is said
    q = load_manifest(out).target.quantization
    assert (q["method"], q["accuracy_level"]) == ("gguf", 0)
    shown = subprocess.run([sys.executable, "-m", "specrt.cli", "inspect", str(out)], capture_output=True, text=True).stdout
    assert "weights: gguf, accuracy_level 0" in shown and "no exact form (float): IQ4_NL" in shown
