"""tools/memory_rss.py measures what it says: a fresh load's RSS beside the loader's prediction."""

import memory_rss


def test_one_load_reports_rss_and_the_prediction(tiny_bundles):
    r = memory_rss.one(str(tiny_bundles["int8"]), 2, 64)
    assert (r["slots"], r["seq"]) == (2, 64)
    assert r["base"] < r["loaded"] <= r["peak"]  # VmHWM is never below the RSS it has seen
    # the tiny pair: onnxruntime's code pages dominate both the prediction and what was added
    assert r["predicted"] <= r["predicted_peak"] and r["predicted"] > 2 * 64 * 512
