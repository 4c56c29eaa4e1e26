"""tools/bundle_ab.py: two bundles taking turns, each arm's medians, the ratio, exactness per bundle."""

import json
import sys

import bundle_ab

from paths import ROOT


def test_two_bundles_side_by_side(tiny_bundles, tmp_path, monkeypatch):
    a, b = str(tiny_bundles["int8"]), str(tiny_bundles["int4"])
    out = tmp_path / "ab.json"
    monkeypatch.setattr(sys, "argv", ["bundle_ab.py", a, b, "--workload", str(ROOT / "configs/workloads/code.jsonl"),
                                      "--prompts", "2", "--max-new-tokens", "6", "--out", str(out)])
    bundle_ab.main()
    d = json.loads(out.read_text())
    assert len(d["rows"]) == 2 * 2 * 2  # prompts x arms x bundles
    assert [r["bundle"] for r in d["rows"][:2]] == [a, b] and [r["bundle"] for r in d["rows"][4:6]] == [b, a]
    s = d["summary"]
    assert s[f"{a} exact"] is True and s[f"{b} exact"] is True  # speculative = target-only on each
    for arm in ("none", "model"):
        assert s[f"B/A {arm}"]["tpot_ms"] == s[f"{b} {arm}"]["tpot_ms"] / s[f"{a} {arm}"]["tpot_ms"]
    assert all(len(r["tokens"]) == 6 for r in d["rows"])
