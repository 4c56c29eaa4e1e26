"""TensorRT: profiles and op checks run anywhere; building and running need TensorRT + a GPU."""

import importlib.util

import pytest

from specrt.export.arch import arch_from_model, numpy_weights
from specrt.export.graph import GraphOptions, build_graph
from specrt.export.trt import profile_for, unsupported_ops
from specrt.runtime.bundle.manifest import KVLayout, ModelEntry
from tiny import tiny_model

HAS_TRT = importlib.util.find_spec("tensorrt") is not None


def _graph(lowering):
    m = tiny_model("llama")
    return build_graph(arch_from_model(m, 64), numpy_weights(m), GraphOptions(lowering=lowering, max_seq_len=64))


def test_profile_covers_verification_widths_and_context():
    e = ModelEntry(max_tokens_per_call=17, kv=KVLayout(2, 2, 16, "float32", 64))
    prof = profile_for(e)
    assert prof["input_ids"] == [[1, 1], [1, 5], [1, 17]]
    assert prof["attention_mask"] == [[1, 1], [1, 32], [1, 64]]
    assert prof["past_key_values.1.value"] == [[1, 2, 64, 16]] * 3
    assert len(prof) == 2 + 2 * 2


def test_standard_graph_is_importable_by_recent_trt_only():
    std = _graph("standard")
    assert unsupported_ops(std, (10, 15)) == []
    assert unsupported_ops(std, (10, 3)) == ["Attention (needs TensorRT >= 10.14)", "TensorScatter (needs TensorRT >= 10.15)"]
    assert any("com.microsoft::GroupQueryAttention" in b for b in unsupported_ops(_graph("ort"), (10, 15)))


def test_export_trt_needs_standard_lowering(tmp_path):
    from specrt.export import export_bundle

    with pytest.raises(ValueError, match="standard"):
        export_bundle("unused", tmp_path / "b", trt=True, echo=None)


@pytest.mark.trt
@pytest.mark.skipif(not HAS_TRT, reason="TensorRT is not installed here (NVIDIA's index, GPU machines only)")
def test_trt_engine_matches_onnxruntime(tiny_dirs, tmp_path):
    import numpy as np

    import specrt
    from specrt.export import export_bundle

    export_bundle(str(tiny_dirs["target"]), tmp_path / "b", draft="none", lowering="standard", trt=True,
                  max_seq_len=128, max_draft_tokens=8, echo=None)
    ref = specrt.load(tmp_path / "b", draft="none")
    trt_pipe = specrt.load(tmp_path / "b", draft="none", device="trt")
    ids = [1, 5, 9, 33, 7]
    a = ref.target.prefill(ids)
    b = trt_pipe.target.prefill(ids)
    np.testing.assert_allclose(a, b, atol=1e-3)
    want = [t for c in ref.stream_ids(ids, max_new_tokens=20, k=0, draft="none") for t in c]
    got = [t for c in trt_pipe.stream_ids(ids, max_new_tokens=20, k=0, draft="none") for t in c]
    assert got == want
