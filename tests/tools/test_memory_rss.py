"""tools/memory_rss.py measures what it says: a fresh load's RSS beside the loader's prediction."""

import memory_rss


def test_one_load_reports_rss_and_the_prediction(tiny_bundles):
    # a process of its own, as the tool measures: inside the test process, RSS after a load
    # could read below RSS before it (pages freed by earlier tests meanwhile)
    r = memory_rss.fresh(str(tiny_bundles["int8"]), 2, 64)
    assert (r["slots"], r["seq"]) == (2, 64)
    assert r["base"] < r["loaded"] <= r["peak"]  # VmHWM is never below the RSS it has seen
    # the tiny pair: onnxruntime's code pages dominate both the prediction and what was added
    assert r["predicted"] <= r["predicted_peak"] and r["predicted"] > 2 * 64 * 512
