"""tools/feature_costs.py end to end on the default bundle, a few tokens per arm: every arm ran,
the ratios are computed from the arms' own medians, and the JSON arms spent time in masks."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from paths import ROOT

pytestmark = pytest.mark.slow


def test_feature_costs_runs_every_arm(default_bundle, tmp_path):
    out = tmp_path / "costs.json"
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "feature_costs.py"), "--engines", str(default_bundle),
                        "--tokens", "12", "--repeats", "1", "--out", str(out)],
                       capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    assert set(res) == {f"{d}/{f}" for d in ("none", "model") for f in ("plain", "penalties", "logprobs", "json")}
    for name, row in res.items():
        assert row["n"] == 4 and row["tpot_ms"] > 0, name
    assert res["model/json"]["speedup"] == pytest.approx(res["none/json"]["tpot_ms"] / res["model/json"]["tpot_ms"])
    assert res["none/json"]["mask_ms_per_token"] > 0 and res["none/plain"]["mask_ms_per_token"] == 0
