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
