"""Call-cost probes kept on disk, per bundle and machine.

Adaptive k starts from a probe of the target's call time per width and the draft's step
(`adaptive.measure_costs`, ~2 s for the default pair on 2 cores) and then follows the measured
rounds online (`Costs.observe` rescales the whole curve). A service probes once; a one-shot
`specrt generate --adaptive` paid the probe on every run, longer than its generation. The probe's
*shape* (how a wider call compares with a step, and the draft with the target) is a property of
the bundle on this machine, so it is kept: `~/.cache/specrt/costs-<key>.json` (or
$SPECRT_CACHE_DIR). The key covers what changes the shape: the bundle (path, creation time, graph
files), the CPU model and core count, threads, device and the onnxruntime version. A file that
is missing, unreadable or from another key is simply probed again; nothing here can fail a
request.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from pathlib import Path

from .adaptive import Costs


def cache_dir() -> Path:
    if os.environ.get("SPECRT_CACHE_DIR"):
        return Path(os.environ["SPECRT_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specrt"


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


def key(folder: Path, manifest, *, device: str, threads: int | None, extra: str = "") -> str:
    import onnxruntime as ort

    parts = [str(Path(folder).resolve()), manifest.created, manifest.target.graph,
             manifest.draft.graph if manifest.draft else "", _cpu(), str(os.cpu_count()), str(threads),
             device, ort.__version__, extra]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def load(k: str) -> Costs | None:
    try:
        d = json.loads((cache_dir() / f"costs-{k}.json").read_text())
        if d.get("key") != k:
            return None
        target_ms = {int(t): float(v) for t, v in d["target_ms"].items()}
        if 1 not in target_ms or not all(v > 0 for v in target_ms.values()):
            return None
        return Costs(target_ms, float(d["draft_ms"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def save(k: str, costs: Costs) -> None:
    d = cache_dir()
    try:
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f".costs-{k}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps({"key": k, "target_ms": costs.target_ms, "draft_ms": costs.draft_ms}))
        tmp.replace(d / f"costs-{k}.json")
    except OSError:
        pass
