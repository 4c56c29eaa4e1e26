"""Call-cost probes kept on disk, per bundle and machine.

Adaptive k starts from a probe of the target's call time per width and the draft's step
(`adaptive.measure_costs`, seconds for the default pair on 2 cores) and then follows the measured
rounds online (`Costs.observe` rescales the whole curve). A service probes once; a one-shot
`specrt generate --adaptive` paid the probe on every run, longer than its generation. The probe's
*shape* (how a wider call compares with a step, and the draft with the target) is a property of
the bundle on this machine, so it is kept: `~/.cache/specrt/costs-<key>.json` (or
$SPECRT_CACHE_DIR). The key covers what changes the shape (`key`). A file that is missing,
unreadable, invalid or from another key is simply probed again; nothing here can fail a request.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import tempfile
from pathlib import Path

from .adaptive import Costs


def cache_dir() -> Path | None:
    """$SPECRT_CACHE_DIR, else $XDG_CACHE_HOME/specrt, else ~/.cache/specrt; None where there is
    no home to put it in (a container user without a passwd entry): no cache then."""
    if os.environ.get("SPECRT_CACHE_DIR"):
        return Path(os.environ["SPECRT_CACHE_DIR"])
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]) / "specrt"
    try:
        return Path.home() / ".cache" / "specrt"
    except (RuntimeError, KeyError):
        return None


def cpu_model() -> str:
    """/proc/cpuinfo's model name ("" where there is none); also what the bench records."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return ""


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))  # what this process may use (cgroups, taskset)
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _file(path: Path) -> str:
    try:
        st = path.stat()
        return f"{path.name}:{st.st_size}:{st.st_mtime_ns}"
    except OSError:
        return path.name


PROBE = 6  # what `measure_costs` records; 2: a min_t target's narrow widths priced as its widened call;
#           3: the growth per position of context (slope, draft_slope) beside the curves; 4: draft_read_ms;
#           5: a kernel graph's one-token calls run one row (no filler): their prices changed;
#           6: the widths 16, 32, 64 too (the last before the AMX form's next block of rows)


def key(folder: Path, manifest, *, device: str, threads: int | None, extra: str = "") -> str:
    """What changes the probe's shape: the bundle (path, creation time, graph and weight files as
    they are on disk), this machine's CPU and usable cores, threads, device, onnxruntime,
    `extra` (the caller's session settings) and the probe's own version."""
    import onnxruntime as ort

    folder = Path(folder).resolve()
    entries = [e for e in (manifest.target, manifest.draft) if e is not None]
    parts = [folder, manifest.created, *(_file(folder / f) for e in entries for f in (e.graph, e.data) if f),
             cpu_model() or platform.processor(), platform.machine(), _cores(), threads, device, ort.__version__, extra,
             PROBE]
    return hashlib.sha256("\n".join(str(x) for x in parts).encode()).hexdigest()[:24]


def load(k: str) -> Costs | None:
    d = cache_dir()
    if d is None:
        return None
    try:
        data = json.loads((d / f"costs-{k}.json").read_text())
        if data.get("key") != k:
            return None
        target_ms = {int(t): float(v) for t, v in data["target_ms"].items()}
        draft_ms = float(data["draft_ms"])
        rows_ms = {int(b): float(v) for b, v in data.get("rows_ms", {}).items()}
        draft_rows_ms = {int(b): float(v) for b, v in data.get("draft_rows_ms", {}).items()}
        curves = [*target_ms.values(), *rows_ms.values(), *draft_rows_ms.values()]
        if (1 not in target_ms or not all(math.isfinite(v) and v > 0 for v in curves)
                or not (math.isfinite(draft_ms) and draft_ms >= 0)):
            return None
        slope = {int(t): float(v) for t, v in data.get("slope", {}).items()}
        draft_slope, context = float(data.get("draft_slope", 0.0)), int(data.get("context", 128))
        draft_read = float(data.get("draft_read_ms", 0.0))
        if not all(math.isfinite(v) and v >= 0 for v in [*slope.values(), draft_slope, draft_read]):
            return None
        return Costs(target_ms, draft_ms, rows_ms=rows_ms, draft_rows_ms=draft_rows_ms, context=context,
                     slope=slope, draft_slope=draft_slope, draft_read_ms=draft_read)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def save(k: str, costs: Costs) -> None:
    d = cache_dir()
    if d is None:
        return
    tmp = None
    try:
        d.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=d, prefix=f".costs-{k}.", suffix=".tmp", delete=False) as f:
            tmp = Path(f.name)
            json.dump({"key": k, "target_ms": costs.target_ms, "draft_ms": costs.draft_ms,
                       "rows_ms": costs.rows_ms, "draft_rows_ms": costs.draft_rows_ms, "context": costs.context,
                       "slope": costs.slope, "draft_slope": costs.draft_slope, "draft_read_ms": costs.draft_read_ms}, f)
        tmp.replace(d / f"costs-{k}.json")  # atomic: readers see the old file or the new one
    except (OSError, TypeError, ValueError):
        if tmp is not None:
            tmp.unlink(missing_ok=True)
