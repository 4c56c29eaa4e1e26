"""tools/cpp_speed.py: specrt-cpp and the Python runtime taking turns on the same ids."""

import json
import subprocess
import sys

import cpp_speed

from paths import ROOT


def test_both_sides_give_the_same_tokens(tiny_bundles, tmp_path, monkeypatch):
    built = subprocess.run(["make", "-s", "cpp"], cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert built.returncode == 0, built.stderr[-2000:]
    out = tmp_path / "speed.json"
    monkeypatch.setattr(sys, "argv", ["cpp_speed.py", str(tiny_bundles["int8"]), "--workload",
                                      str(ROOT / "configs/workloads/code.jsonl"), "--prompts", "2",
                                      "--max-new-tokens", "6", "--out", str(out)])
    cpp_speed.main()
    d = json.loads(out.read_text())
    assert [r["side"] for r in d["rows"][:4]] == ["python", "cpp", "cpp", "python"]  # turns alternate
    for draft in ("model", "none"):
        s = d["summary"][draft]
        assert s["same_tokens"] is True and s["cpp/python"] == s["cpp"] / s["python"]
