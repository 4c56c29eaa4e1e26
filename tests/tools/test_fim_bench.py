"""tools/fim_bench.py: the workload it makes from a real file, and one short run over HTTP on a
tiny FIM bundle (two specrt arms, the exactness check between them)."""

from __future__ import annotations

import json
import queue

import fim_bench

from tiny import save_tiny


def test_cases_cut_the_file_where_they_say():
    src = open(queue.__file__).read()
    cases = fim_bench.make_cases(src, 4)
    assert [c.kind for c in cases] == ["line", "block"] * 4 and len({c.line for c in cases}) >= 6
    for c in cases:
        assert c.prefix + c.typed + c.removed + c.suffix[1:] == src  # the middle removed, nothing else
        assert c.removed.strip() and c.suffix.startswith("\n")
        first, typed = c.body(False), c.body(True)
        assert typed["prompt"] == first["prompt"] + c.removed[0] and typed["input_prefix"] == first["input_prefix"]


def test_a_short_run_on_a_tiny_fim_bundle(tmp_path):
    from specrt.export import export_bundle

    hf = save_tiny(tmp_path / "hf", fim=True)
    export_bundle(str(hf), tmp_path / "fim", draft="self-int8", max_seq_len=512, max_draft_tokens=8, echo=None)
    src = tmp_path / "f.py"
    src.write_text("".join(f"def f{i}(x):\n    y = x + {i}  # w{10 + i} w{11 + i}\n    return y\n" for i in range(20)))
    out = tmp_path / "fim.json"
    rc = fim_bench.main(["--engines", str(tmp_path / "fim"), "--arms", "model,none", "--file", str(src),
                         "--cursors", "1", "--ctx", "512", "--threads", "1", "--out", str(out)])
    res = json.loads(out.read_text())
    assert rc == 0 and res["mismatches"] == []
    assert {(s["arm"], s["kind"], s["phase"]) for s in res["summary"]} == {
        (arm, kind, phase) for arm in ("model", "none") for kind in ("line", "block") for phase in ("first", "keystroke")}
    keystrokes = [r for r in res["rows"] if r["phase"] == "keystroke"]
    assert all(r["cached"] > 0 and r["tokens"] > 0 for r in keystrokes)
