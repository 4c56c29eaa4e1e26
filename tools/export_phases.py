"""Where an export's time and memory go, phase by phase: runs `specrt export ARGS...` in this
process with the export's own functions wrapped (loading, graph building, each check session,
each reference forward, the packed and kernel graphs, the subset, the compaction). Each phase's
peak is exact: the kernel's high-water mark (VmHWM) is read and reset (/proc/self/clear_refs) at
every phase boundary, and each interval's peak is charged to every phase open during it.

    flock /work/heavy.lock .venv/bin/python tools/export_phases.py --json phases.json -- \
        --config configs/coder.toml --out /tmp/coder

Prints one line per call (nested by depth: its peak RSS, its RSS on return, its wall time) and
writes them as JSON (--json FILE). Linux only.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from pathlib import Path

# (module, attribute) -> the phase's name; patched where the export looks them up
PHASES = [
    ("specrt.export.steps", "LoadedModel.__init__", "load model (metadata, tokenizer, skeleton)"),
    ("specrt.export.steps", "GGUFWeights.__init__", "GGUF weights map"),
    ("specrt.export.api", "target_entry", "target graph"),
    ("specrt.export.quant_target", "import_gguf", "plan the GGUF imports"),
    ("specrt.export.steps", "write_model", "write graph + weights"),
    ("specrt.export.packed", "pack_entry", "packed + kernel graphs"),
    ("specrt.export.packed", "add_kernel_graphs", "kernel graphs"),
    ("specrt.export.api", "check_target", "target check"),
    ("specrt.export.quant_target", "level0_twin", "write the level-0 twin"),
    ("specrt.export.steps", "decoder", "session (portable graph)"),
    ("specrt.export.steps", "kernel_decoder", "session (kernel graph)"),
    ("specrt.export.quant_target", "observe", "observe a graph"),
    ("specrt.export.quant_target", "prefetch", "reference forward (batched)"),
    ("specrt.export.steps", "streamed_logits", "reference forward"),
    ("specrt.export.quant_target", "compare", "compare"),
    ("specrt.export.api", "model_draft_entry", "draft (load, graph, check)"),
    ("specrt.export.steps", "measure_draft", "draft check"),
    ("specrt.export.steps", "check_decoder", "parity check"),
    ("specrt.export.steps", "observe", "observe a graph"),
    ("specrt.export.steps", "compare", "compare"),
    ("specrt.export.steps", "draft_agreement", "agreement probe"),
    ("specrt.export.api", "subset_draft", "vocabulary subset"),
    ("specrt.export.vocab_subset", "choose", "rank the vocabulary"),
    ("specrt.export.vocab_subset", "rewrite", "rewrite the head"),
    ("specrt.export.api", "_write", "tokenizer, manifest, packed graphs, compaction"),
    ("specrt.export.packed", "pack_bundle", "packed + kernel graphs (bundle)"),
    ("specrt.export.api", "drop_bundle", "drop the portable graphs"),
]


def _status() -> dict[str, int]:
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(("VmHWM:", "VmRSS:")):
            out[line[:5]] = int(line.split()[1])
    return out


class Tracer:
    def __init__(self):
        self.t0 = time.perf_counter()
        self.open: list[dict] = []
        self.rows: list[dict] = []
        self.peak_mib = 0.0  # the whole run's (a reset mark also resets ru_maxrss)

    def boundary(self) -> int:
        """Charge the interval since the last boundary to every open phase; reset the mark."""
        s = _status()
        self.peak_mib = max(self.peak_mib, s["VmHWM"] / 1024)
        for fr in self.open:
            fr["peak_mib"] = max(fr["peak_mib"], s["VmHWM"] / 1024)
        Path("/proc/self/clear_refs").write_text("5")
        return s["VmRSS"]

    def wrap(self, name: str, fn):
        @functools.wraps(fn)
        def traced(*a, **kw):
            rss = self.boundary() / 1024
            fr = {"phase": name, "depth": len(self.open), "start_s": time.perf_counter() - self.t0, "rss_in_mib": rss,
                  "peak_mib": rss}
            self.rows.append(fr)
            self.open.append(fr)
            try:
                return fn(*a, **kw)
            finally:
                fr["rss_out_mib"] = self.boundary() / 1024
                self.open.remove(fr)
                fr["seconds"] = time.perf_counter() - self.t0 - fr["start_s"]
        return traced

    def install(self) -> None:
        import importlib

        for mod, attr, name in PHASES:
            owner = importlib.import_module(mod)
            *path, last = attr.split(".")
            for p in path:
                owner = getattr(owner, p)
            setattr(owner, last, self.wrap(name, getattr(owner, last)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, help="write the phases here")
    ap.add_argument("export_args", nargs=argparse.REMAINDER, help="-- then specrt export's arguments")
    a = ap.parse_args()
    args = a.export_args[1:] if a.export_args[:1] == ["--"] else a.export_args
    tr = Tracer()
    tr.install()
    from specrt.cli import main as cli

    t0 = time.perf_counter()
    rc = 0
    try:
        cli(["export", *args], standalone_mode=False)
    except SystemExit as e:
        rc = int(e.code or 0)
    wall = time.perf_counter() - t0
    tr.boundary()
    peak = tr.peak_mib
    for r in tr.rows:
        print(f"{r['peak_mib']:7.0f} MiB peak {r.get('rss_out_mib', 0):7.0f} after {r.get('seconds', 0):7.1f} s  "
              f"{'  ' * r['depth']}{r['phase']}")
    print(f"peak RSS {peak:.0f} MiB, wall {wall:.1f} s, exit {rc}")
    if a.json:
        a.json.write_text(json.dumps({"args": args, "wall_s": wall, "peak_rss_mib": peak, "phases": tr.rows}, indent=1))
    return rc


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
