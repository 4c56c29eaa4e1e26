"""onnxruntime session settings (runtime/backends/ort.py) change speed, never the numbers."""

import numpy as np
import onnxruntime as ort

from specrt.runtime.backends.ort import session_options


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


def test_parallel_prepacking_is_set_and_exact(tiny_bundles):
    so = session_options(2)
    assert so.get_session_config_entry("session.prepack.enable_parallel") == "1"
    serial = session_options(2)
    serial.add_session_config_entry("session.prepack.enable_parallel", "0")
    for model in ("target", "draft"):
        graph = tiny_bundles["int8"] / model / "model.onnx"
        assert np.array_equal(_logits(graph, so), _logits(graph, serial)), model


def test_logits_to_keep_default_is_every_row(tiny_bundles):
    """Consumers that never feed num_logits_to_keep (onnxruntime-genai, a plain session) get
    all T rows from its default; fed n they get the last n."""
    graph = tiny_bundles["int8"] / "target" / "model.onnx"
    so = session_options(2)
    unfed, fed_all, fed_one = _logits(graph, so), _logits(graph, so, keep=4), _logits(graph, so, keep=1)
    assert unfed.shape[:2] == (1, 4) and fed_one.shape[:2] == (1, 1)
    np.testing.assert_array_equal(unfed, fed_all)
    np.testing.assert_allclose(fed_one[0, -1], unfed[0, -1], atol=1e-5, rtol=0)
