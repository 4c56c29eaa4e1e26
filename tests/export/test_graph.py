"""Graphs of every family x lowering against transformers, through the real runtime decoder."""

import numpy as np
import pytest

from specrt.export.arch import arch_from_model, numpy_weights
from specrt.export.bundle import save_graph
from specrt.export.graph import LOGITS_KEEP, GraphOptions, build_graph
from specrt.export.validate import reference_logits
from specrt.runtime.backends.harness import SequenceHarness
from specrt.runtime.backends.ort import OrtBackend
from specrt.runtime.bundle.manifest import IONames, KVLayout, ModelEntry
from tiny import FAMILIES, tiny_model

S_MAX = 64


def make_decoder(model, tmp_path, lowering="ort", precision="fp32", level=4):
    arch = arch_from_model(model, S_MAX)
    opts = GraphOptions(lowering=lowering, precision=precision, max_seq_len=S_MAX, int4_accuracy_level=level)
    graph = build_graph(arch, numpy_weights(model), opts)
    if lowering == "standard":
        import onnx

        onnx.checker.check_model(graph, full_check=True)
        assert {n.domain for n in graph.graph.node} <= {""}, "standard lowering must use only standard ops"
    name, _ = save_graph(graph, tmp_path)
    kv_dtype = "float16" if precision == "fp16" else "float32"
    entry = ModelEntry(vocab_size=arch.vocab, max_tokens_per_call=17,
                       io=IONames(logits_to_keep=LOGITS_KEEP if lowering == "ort" else ""),
                       kv=KVLayout(arch.layers, arch.kv_heads, arch.head_dim, kv_dtype, S_MAX))
    return SequenceHarness(OrtBackend(tmp_path / name, entry))


@pytest.mark.parametrize("lowering", ["ort", "standard"])
@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_logits_to_keep_returns_the_last_rows(family, lowering, tmp_path):
    """A prompt chunk needs only its last row: the ort graph skips the LM head for the others;
    the standard graph (no such input) returns every row. Either way the kept rows are the
    full call's, and the KV cache is the same."""
    model = tiny_model(family)
    full, kept = make_decoder(model, tmp_path / "a", lowering), make_decoder(model, tmp_path / "b", lowering)
    ids = np.random.default_rng(3).integers(3, 128, size=20)
    want = full.forward(ids[:13]).copy()
    got = kept.forward(ids[:13], keep=2).copy()
    assert got.shape == ((2, want.shape[1]) if lowering == "ort" else want.shape)
    np.testing.assert_allclose(got[-2:], want[-2:], atol=1e-5, rtol=0)
    np.testing.assert_allclose(kept.prefill(ids[13:]), full.prefill(ids[13:]), atol=1e-5, rtol=0)
    np.testing.assert_allclose(kept.forward(ids[:3]), full.forward(ids[:3]), atol=1e-5, rtol=0)  # keep=None: all rows


def test_logits_to_keep_leaves_hidden_out_whole(tmp_path):
    """An EAGLE target outputs every position's features even when only one logits row is kept."""
    model = tiny_model("llama")
    arch = arch_from_model(model, S_MAX)
    graph = build_graph(arch, numpy_weights(model), GraphOptions(max_seq_len=S_MAX, hidden_out="hidden_states"))
    name, _ = save_graph(graph, tmp_path)
    entry = ModelEntry(vocab_size=arch.vocab, hidden_size=arch.hidden, max_tokens_per_call=17,
                       io=IONames(hidden_out="hidden_states", logits_to_keep=LOGITS_KEEP),
                       kv=KVLayout(arch.layers, arch.kv_heads, arch.head_dim, "float32", S_MAX))
    dec = SequenceHarness(OrtBackend(tmp_path / name, entry), keep_hidden=True)
    ids = np.random.default_rng(4).integers(3, 128, size=9)
    assert dec.forward(ids, keep=2).shape == (2, arch.vocab)
    assert dec.hidden.shape == (9, arch.hidden)
    feats = dec.features[:9].copy()
    dec.reset()
    dec.forward(ids)
    np.testing.assert_allclose(dec.features[:9], feats, atol=1e-6, rtol=0)


@pytest.mark.parametrize("lowering", ["ort", "standard"])
@pytest.mark.parametrize("family", FAMILIES)
def test_parity_multitoken_and_rewind(family, lowering, tmp_path):
    model = tiny_model(family)
    dec = make_decoder(model, tmp_path, lowering)
    ids = np.random.default_rng(1).integers(3, 128, size=40)
    ref = reference_logits(model, ids)  # [40, V], one transformers forward

    # prefill 12 in one call, then a T=9 verification-shaped call continuing from the cache
    got = np.concatenate([dec.forward(ids[:12]).copy(), dec.forward(ids[12:21]).copy()])
    np.testing.assert_allclose(got, ref[:21], atol=2e-4, rtol=0)

    # the same 9 tokens one at a time give the same logits as the multi-token call
    dec.rewind(12)
    seq = np.stack([dec.forward(ids[i : i + 1])[0].copy() for i in range(12, 21)])
    np.testing.assert_allclose(seq, got[12:], atol=2e-5, rtol=0)

    # rewind into the middle, feed different tokens, then the original ones: stale rows must
    # not leak (a longer continuation past the old length checks the mask too)
    dec.rewind(15)
    dec.forward(np.full(6, 7))
    dec.rewind(15)
    got2 = dec.forward(ids[15:32]).copy()
    np.testing.assert_allclose(got2, ref[15:32], atol=2e-4, rtol=0)
    assert dec.length == 32


@pytest.mark.parametrize("lowering", ["ort", "standard"])
def test_fp16_runs_close_to_fp32(lowering, tmp_path):
    model = tiny_model("qwen3")
    dec = make_decoder(model, tmp_path, lowering, "fp16")
    ids = np.arange(3, 23)
    np.testing.assert_allclose(dec.forward(ids[:17]), reference_logits(model, ids)[:17], atol=2e-2, rtol=0)


@pytest.mark.parametrize("level", [0, 4])
@pytest.mark.parametrize("precision,bits", [("int4", 4), ("int8", 8)])
def test_quantized_graph_matches_dequantized_weights(tmp_path, precision, bits, level):
    """The int4/int8 graph computes with exactly the dequantized weights: to fp32 rounding at
    accuracy_level 0, up to its int8 activations at level 4."""
    import torch

    from specrt.export import quantize

    model = tiny_model("llama")
    dec = make_decoder(model, tmp_path, "ort", precision, level)
    deq = tiny_model("llama")
    with torch.no_grad():
        for name, p in deq.named_parameters():
            if p.ndim == 2 and "embed" not in name:
                packed, scales = quantize.quantize_rtn_sym(p.numpy(), 32, bits)
                p.copy_(torch.from_numpy(quantize.dequantize(packed, scales, p.shape[1], bits)))
        deq.lm_head.weight = torch.nn.Parameter(deq.model.embed_tokens.weight.clone())
        emb = deq.model.embed_tokens.weight.numpy()
        packed, scales = quantize.quantize_rtn_sym(emb, 32, bits)
        deq.lm_head.weight.copy_(torch.from_numpy(quantize.dequantize(packed, scales, emb.shape[1], bits)))
    ids = np.arange(3, 20)
    ref = reference_logits(deq, ids)
    got = dec.forward(ids)
    full = reference_logits(model, ids)
    err_deq = np.abs(got - ref).max()
    if level == 0:
        assert err_deq < 1e-4 * np.abs(ref).max(), err_deq
    else:  # int8 activations: 3-6% of the largest logit on this tiny model, noise from the weights' rounding
        assert err_deq < 0.1 * np.abs(ref).max(), err_deq
    assert err_deq < np.abs(got - full).max()  # closer to its own weights than to fp32


def test_unsupported_architecture_is_named():
    from specrt.export.families import UnsupportedArchitecture, family_for

    with pytest.raises(UnsupportedArchitecture, match="gpt2.*supported model types: llama"):
        family_for("gpt2")


@pytest.mark.parametrize("precision", ["int4", "int8"])
def test_standard_lowering_refuses_matmulnbits(precision):
    model = tiny_model("llama")
    arch = arch_from_model(model, S_MAX)
    with pytest.raises(ValueError, match="ort"):
        build_graph(arch, numpy_weights(model), GraphOptions(lowering="standard", precision=precision))
