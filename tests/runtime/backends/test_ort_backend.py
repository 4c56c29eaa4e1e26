"""onnxruntime session settings (runtime/backends/ort.py) change speed, never the numbers."""

import numpy as np
import onnxruntime as ort

from specrt.export.nbits import WEIGHT_ONLY
from specrt.runtime.backends.harness import SequenceHarness
from specrt.runtime.backends.ort import PACKED_PRECISIONS, OrtBackend, session_options
from specrt.runtime.bundle.manifest import load_manifest


def _logits(graph, so, keep=None):
    s = ort.InferenceSession(str(graph), so, providers=["CPUExecutionProvider"])
    feeds = {} if keep is None else {"num_logits_to_keep": np.array([keep], np.int64)}
    for i in s.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in i.shape]
        if i.name == "input_ids":
            feeds[i.name] = np.array([[3, 17, 5, 9]], np.int64)
        elif i.name == "attention_mask":
            feeds[i.name] = np.ones((1, 4), np.int64)
        else:  # empty past
            shape[2] = 0
            feeds[i.name] = np.zeros(shape, np.float32)
    return s.run(["logits"], feeds)[0]


def test_prepacking_is_serial(tiny_bundles):
    """Parallel prepacking stays off (docs/design.md, "Prepacking is serial"); our sessions
    compute what onnxruntime's default session computes."""
    so = session_options(2)
    assert so.get_session_config_entry("session.prepack.enable_parallel") == "0"
    plain = ort.SessionOptions()
    plain.intra_op_num_threads = 2
    for model in ("target", "draft"):
        graph = tiny_bundles["int8"] / model / "model.onnx"
        assert np.array_equal(_logits(graph, so), _logits(graph, plain)), model


def test_unpacked_sessions_are_unpacked(tiny_bundles):
    """prepack=False really turns packing off (an unknown config key would be accepted silently):
    MatMulNBits at accuracy_level 4 computes in fp32 without its packed form, so the int8
    draft's logits change."""
    graph = tiny_bundles["int8"] / "draft" / "model.onnx"
    packed, unpacked = _logits(graph, session_options(2)), _logits(graph, session_options(2, prepack=False))
    assert not np.array_equal(packed, unpacked)
    np.testing.assert_allclose(packed, unpacked, atol=0.5)


def test_matmulnbits_graphs_are_packed_whatever_is_asked(tiny_bundles):
    """An export check (prepack=False) computes what the runtime will: the int8 draft's rows are
    the packed session's, bit for bit."""
    assert set(PACKED_PRECISIONS) == set(WEIGHT_ONLY)
    folder = tiny_bundles["int8"]
    entry = load_manifest(folder).draft
    assert entry.precision in PACKED_PRECISIONS
    rows = []
    for prepack in (True, False):
        dec = SequenceHarness(OrtBackend(folder / entry.graph, entry, prepack=prepack))
        rows.append(dec.forward([3, 17, 5, 9]).copy())
    assert np.array_equal(rows[0], rows[1])


def test_logits_to_keep_default_is_every_row(tiny_bundles):
    """Consumers that never feed num_logits_to_keep (onnxruntime-genai, a plain session) get
    all T rows from its default; fed n they get the last n."""
    graph = tiny_bundles["int8"] / "target" / "model.onnx"
    so = session_options(2)
    unfed, fed_all, fed_one = _logits(graph, so), _logits(graph, so, keep=4), _logits(graph, so, keep=1)
    assert unfed.shape[:2] == (1, 4) and fed_one.shape[:2] == (1, 1)
    np.testing.assert_array_equal(unfed, fed_all)
    np.testing.assert_allclose(fed_one[0, -1], unfed[0, -1], atol=1e-5, rtol=0)
