"""tools/export_memory.py on the tiny GGUF: the export runs, each printed step gets its peak and
its time, and the overall peak is the kernel's (at least every sampled one)."""

import importlib.util
import sys

from paths import ROOT

sys.path.insert(0, str(ROOT / "tests" / "export"))
from tiny_gguf import write_tiny_gguf  # noqa: E402

spec = importlib.util.spec_from_file_location("export_memory", ROOT / "tools" / "export_memory.py")
export_memory = importlib.util.module_from_spec(spec)
spec.loader.exec_module(export_memory)


def test_steps_get_their_peaks_and_times(tmp_path):
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    res = export_memory.run(["--target", str(gguf), "--precision", "gguf", "--draft", "none", "--max-seq-len", "256",
                             "--max-draft-tokens", "8", "--out", str(tmp_path / "b")], echo=lambda _: None)
    assert res["rc"] == 0 and (tmp_path / "b" / "specrt.json").is_file()
    names = [s["step"] for s in res["steps"]]
    assert names[0] == "start" and any(n.startswith("loading target") for n in names)
    assert any(n.startswith("bundle ready") for n in names)
    assert abs(sum(s["seconds"] for s in res["steps"]) - res["wall_s"]) < 1e-6
    assert max(s["peak_mib"] for s in res["steps"]) <= res["peak_rss_mib"] + 1
    assert max(s["peak_mib"] for s in res["steps"]) > 50  # a Python process with torch loaded
