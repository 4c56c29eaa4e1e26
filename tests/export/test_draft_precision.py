"""A separate draft model weight-quantized at export (`draft_precision`, the self-drafts' RTN
recipe): its graph is MatMulNBits, and speculation with it stays exact against target-only."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import specrt
from checks import assert_follows, second_token_dist
from specrt.export import export_bundle
from specrt.runtime.bundle.manifest import load_manifest
from specrt.runtime.engine import Stats
from specrt.runtime.sampling.draws import SamplingConfig

KW = dict(max_seq_len=128, max_draft_tokens=8, greedy_steps=8, echo=None)
PROMPTS = [[1, 5, 9, 33, 7], [1, 100, 4, 4, 4, 90, 12, 60]]


@pytest.fixture(scope="module")
def quantized_drafts(tiny_dirs, tmp_path_factory):
    """The tiny target with the random-weights sibling as draft, at int8 and int4."""
    base = tmp_path_factory.mktemp("qdraft")
    out = {}
    for precision in ("int8", "int4"):
        export_bundle(str(tiny_dirs["target"]), base / precision, draft=str(tiny_dirs["bad_draft"]),
                      draft_precision=precision, **KW)
        out[precision] = specrt.load(base / precision, draft="model", adaptive=False)
    yield out
    for pipe in out.values():
        pipe.close()


@pytest.mark.parametrize("precision,bits", [("int8", 8), ("int4", 4)])
def test_quantized_separate_draft_is_matmulnbits(quantized_drafts, precision, bits):
    pipe = quantized_drafts[precision]
    man = load_manifest(pipe.folder)
    d = man.draft
    assert (d.precision, d.recipe, d.kv.dtype) == (precision, f"model-{precision}", "float32")
    assert man.target.precision == "fp32" and man.target.parity["passed"]
    assert 0.0 <= d.parity["greedy_agreement_with_target"] <= 1.0
    graph = onnx.load(str(pipe.folder / d.graph), load_external_data=False)
    nbits = {a.i for n in graph.graph.node if n.op_type == "MatMulNBits" for a in n.attribute if a.name == "bits"}
    assert nbits == {bits}


@pytest.mark.parametrize("precision", ["int8", "int4"])
@pytest.mark.parametrize("k", [1, 3, 8])
def test_quantized_separate_draft_greedy_equals_target_only(quantized_drafts, precision, k):
    pipe = quantized_drafts[precision]
    for prompt in PROMPTS:
        want = [t for c in pipe.stream_ids(prompt, max_new_tokens=30, draft="none", k=0) for t in c]
        st = Stats()
        got = [t for c in pipe.stream_ids(prompt, max_new_tokens=30, k=k, draft="model", stats=st) for t in c]
        assert got == want, (precision, k, prompt)
        assert st.draft_tokens > 0


def test_quantized_separate_draft_sampling_follows_target(quantized_drafts, monkeypatch):
    pipe = quantized_drafts["int4"]
    monkeypatch.setattr(pipe.tokenizer, "eog_ids", set())
    cfg = SamplingConfig(0.8, top_p=0.9)
    prompt = [1, 5, 9, 33, 7, 5, 9]
    want = second_token_dist(pipe, prompt, cfg)
    n, counts, proposed = 2000, np.zeros_like(want), 0
    for seed in range(n):
        st = Stats()
        toks = [t for c in pipe.stream_ids(prompt, max_new_tokens=3, k=4, draft="model", seed=seed,
                                           temperature=0.8, top_p=0.9, stats=st) for t in c]
        counts[toks[1]] += 1
        proposed += st.draft_tokens
    assert proposed >= n  # every request verified at least one draft token
    assert counts[want == 0].sum() == 0
    assert_follows(counts, want, n)


@pytest.mark.parametrize("draft,kw,msg", [
    ("self-int8", {}, "applies to a separate draft model"),
    ("none", {}, "applies to a separate draft model"),
    ("model", {"lowering": "standard"}, "only the 'ort' lowering"),
    ("model", {"draft_precision": "int2"}, "must be one of"),
])
def test_draft_precision_refusals(tiny_dirs, tmp_path, draft, kw, msg):
    draft = str(tiny_dirs["bad_draft"]) if draft == "model" else draft
    kw = {"draft_precision": "int8", **kw}
    with pytest.raises(ValueError, match=msg):
        export_bundle(str(tiny_dirs["target"]), tmp_path / "b", draft=draft, **{**KW, **kw})
    assert not (tmp_path / "b").exists()
