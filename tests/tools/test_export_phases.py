"""tools/export_phases.py on the tiny GGUF pair: the export runs in the tool's process, each
wrapped phase of it gets its peak and time (nested phases inside their parents), and no phase's
peak is over the run's."""

import json
import subprocess
import sys

from paths import ROOT

sys.path.insert(0, str(ROOT / "tests" / "export"))
from tiny_gguf import write_tiny_gguf  # noqa: E402


def test_phases_get_their_peaks_and_times(tmp_path):
    target, draft = write_tiny_gguf(tmp_path / "t.gguf"), write_tiny_gguf(tmp_path / "d.gguf", seed=1)
    out = tmp_path / "phases.json"
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "export_phases.py"), "--json", str(out), "--",
                        "--target", str(target), "--draft", str(draft), "--precision", "gguf", "--draft-precision",
                        "int4", "--max-seq-len", "256", "--max-draft-tokens", "8", "--out", str(tmp_path / "b")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "b" / "specrt.json").is_file()
    res = json.loads(out.read_text())
    names = {p["phase"] for p in res["phases"]}
    assert {"target check", "draft check", "reference forward", "session (portable graph)"} <= names
    for p in res["phases"]:
        assert p["rss_in_mib"] <= p["peak_mib"] + 1 and p["peak_mib"] <= res["peak_rss_mib"] + 1
        assert p["seconds"] <= res["wall_s"]
    check = next(p for p in res["phases"] if p["phase"] == "target check")
    inner = [p for p in res["phases"] if p["depth"] > check["depth"] and check["start_s"] <= p["start_s"]
             <= check["start_s"] + check["seconds"]]
    assert inner and max(p["peak_mib"] for p in inner) <= check["peak_mib"] + 1  # a parent's peak covers its phases
    assert res["peak_rss_mib"] > 50  # a Python process with torch loaded
