"""Peak resident memory of an export, per step: runs `specrt export ARGS...`, samples the process's
VmRSS every 0.25 s and files each sample under the step the export last printed ("[i/n] ...").
The overall peak is the kernel's (ru_maxrss of the child), which a sample can miss.

    python tools/export_memory.py -- --config configs/coder.toml --out engines/coder
    (run it under `flock /work/heavy.lock`: an export of the coder models is a heavy job)

Prints one line per step (its peak RSS, its wall time) and a JSON summary (--json FILE).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

STEP = re.compile(r"^\[(\d+)/(\d+)\] (.*?)\s+\(\+\d+s\)$")


def rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def run(args: list[str], echo=print) -> dict:
    exe = Path(sys.executable).with_name("specrt")
    t0 = time.perf_counter()
    proc = subprocess.Popen([str(exe), "export", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1)
    steps: list[dict] = [{"step": "start", "t0": 0.0, "peak_mib": 0.0}]

    def sample():
        while proc.poll() is None:
            kib = rss_kib(proc.pid)
            steps[-1]["peak_mib"] = max(steps[-1]["peak_mib"], kib / 1024)
            time.sleep(0.25)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    for line in proc.stdout:
        m = STEP.match(line.strip())
        if m:
            steps.append({"step": m.group(3)[:60], "t0": time.perf_counter() - t0, "peak_mib": 0.0})
            echo(line.rstrip())
    proc.wait()
    th.join()
    wall = time.perf_counter() - t0
    for a, b in zip(steps, [*steps[1:], {"t0": wall}], strict=True):
        a["seconds"] = b["t0"] - a["t0"]
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {"args": args, "rc": proc.returncode, "wall_s": wall, "peak_rss_mib": peak, "steps": steps}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, help="write the summary here")
    ap.add_argument("export_args", nargs=argparse.REMAINDER, help="-- then specrt export's arguments")
    a = ap.parse_args()
    args = a.export_args[1:] if a.export_args[:1] == ["--"] else a.export_args
    res = run(args)
    for s in res["steps"]:
        print(f"{s['peak_mib']:8.0f} MiB {s['seconds']:7.1f} s  {s['step']}")
    print(f"peak RSS {res['peak_rss_mib']:.0f} MiB, wall {res['wall_s']:.1f} s, exit {res['rc']}")
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))
    return res["rc"]


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
