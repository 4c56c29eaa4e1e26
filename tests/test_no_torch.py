"""The runtime never imports torch / transformers / optimum, checked in a fresh process."""

import json
import subprocess
import sys

CODE = """
import sys, json
import specrt
pipe = specrt.load(sys.argv[1])
res = pipe.generate("w5 w6", max_new_tokens=5, chat=False)
bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'optimum'))
print(json.dumps({"bad": bad, "n": res.stats.new_tokens}))
"""


def test_runtime_generation_imports_no_torch(tiny_bundles):
    r = subprocess.run([sys.executable, "-c", CODE, str(tiny_bundles["int4"])], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["bad"] == [] and out["n"] > 0


def test_the_runtime_never_imports_the_exporter():
    """A runtime-only install has no specrt.export (nor torch): no runtime module may import it,
    the TensorRT plan choice included (its GPU tag lives in runtime/backends/trt.py)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "runtime"
    bad = [str(p) for p in root.rglob("*.py")
           if re.search(r"^\s*(from\s+(specrt\.export|\.\.+export)\b|import\s+specrt\.export)", p.read_text(), re.M)]
    assert bad == []
