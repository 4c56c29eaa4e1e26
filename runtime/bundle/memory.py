"""What a load will hold in memory, against what the machine has (docs/design.md, "Memory").

Predicted from the manifest and file sizes, before any session or KV buffer exists:
  weights   each graph's files x WEIGHT_FACTOR[precision]: what onnxruntime keeps once it has
            prepacked them (measured; docs/benchmarks.md "Memory")
  runtime   onnxruntime's code pages that the sessions touch (RUNTIME_BYTES, measured)
  KV        slots x max_seq_len x bytes per token, over every pool (a self-draft shares the
            target's; a separate draft has its own, of at most `windowed_rows` rows when it reads
            a window: runtime/drafters/model.py)
  buffers   each OrtModel's host ids / mask / logits / feature buffers (runtime/backends/ort.py)
            and the EAGLE features array [slots, S, H]
  peak      a session being built holds its raw initializers beside the prepacked copy, so the
            load's peak is the larger of the steady total and that transient
Available: on CPU the smaller of /proc/meminfo MemAvailable and the room left under the memory
cgroup's limit (v2 or v1, every level up to the root); with CUDA the device's free memory (NVML).
An explicit slot count is refused when the load cannot fit what is available; `auto` takes as
many slots as fit in a fraction of it. A load that names no context (`fit_seq`) and cannot hold its
slots at the bundle's S_max gets the longest context that fits instead, down to MIN_FIT_SEQ, and
says so (a 32k bundle on a machine that holds 8 slots of 14k). Everything here is a pure function but `available_bytes`,
the one reading of the machine, which tests replace.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

AUTO = "auto"
DEFAULT_MEMORY_FRACTION = 0.9  # of available memory that `auto` may fill (docs/design.md, "Memory")
AUTO_MAX_SLOTS = 64  # `auto` never allocates more slots than this (docs/design.md, "Memory")
# resident bytes after prepacking / bytes of the graph's files, per precision (default pair,
# docs/benchmarks.md "Memory": fp32 target 1.007, int8 draft 0.665); others unmeasured: 1.0
WEIGHT_FACTOR = {"fp32": 1.01, "int8": 0.67}
RUNTIME_BYTES = 140 << 20  # onnxruntime code paged in by the default pair's sessions: 137-142 MB measured
MIN_FIT_SEQ = 4096  # a context shortened to fit memory goes no lower (docs/design.md, "Memory")
WINDOW_RUN = 2048  # rows a windowed draft's pool holds past its window (runtime/drafters/model.py)
_UNLIMITED = 1 << 60  # cgroup v1 writes "no limit" as a page-rounded 2^63 - 1


class InsufficientMemory(ValueError):
    """The load would not fit in the memory available (a user error: the CLI prints it)."""


@dataclass(frozen=True)
class ModelMemory:
    """One graph loaded as an OrtModel."""

    name: str  # "target" | "draft"
    file_bytes: int  # graph + external weights on disk
    weights: int  # bytes resident once the session is built
    vocab: int
    rows: int  # widest call (tokens): rows of its ids and logits buffers below `slots`
    features: int  # float32 feature values per buffer row (EAGLE IO: H per input or output)
    lanes: tuple[int, ...] = ()  # a packed target's lane counts (runtime/backends/packed.py)
    lane_rows: int = 0  # its logits rows per lane (a lane's widest verification)

    def buffers(self, slots: int, seq: int) -> int:
        """Host IO buffers (bytes): ids int64 [rows], logits float32 [rows, V], features
        float32 [rows, features], mask int64 [slots * seq]; rows = max(slots, widest call), or
        for a packed target every lane's widest verification (the lanes the slots load)."""
        rows = max(slots, self.rows)
        if self.lanes:
            lanes = min((n for n in self.lanes if n >= slots), default=max(self.lanes))
            rows = max(self.rows, lanes * self.lane_rows) + 2
        return rows * (8 + 4 * self.vocab + 4 * self.features) + 8 * slots * seq


@dataclass(frozen=True)
class MemoryPlan:
    models: tuple[ModelMemory, ...]  # in the order the loader builds them
    kv_per_token: int  # KV bytes per slot and position, every pool of max_seq_len rows together
    features_per_token: int  # EAGLE features array: bytes per slot and position (0 without)
    runtime: int = RUNTIME_BYTES
    kv_capped: tuple[tuple[int, int], ...] = ()  # (bytes per position, rows) of pools that hold at
    #                                              most `rows` positions (a windowed draft's)

    @property
    def weights(self) -> int:
        return sum(m.weights for m in self.models)

    def kv_per_slot(self, seq: int) -> int:
        return self.kv_per_token * seq + sum(b * min(seq, rows) for b, rows in self.kv_capped)

    def buffers(self, slots: int, seq: int) -> int:
        return sum(m.buffers(slots, seq) for m in self.models) + self.features_per_token * slots * seq

    def steady(self, slots: int, seq: int) -> int:
        """Bytes held once loaded: runtime + weights + KV + buffers."""
        return self.runtime + self.weights + slots * self.kv_per_slot(seq) + self.buffers(slots, seq)

    def peak(self, slots: int, seq: int) -> int:
        """Bytes at the load's high point: the steady total, or a session being built (the
        models before it resident, its own raw files beside its prepacked weights)."""
        held, worst = self.runtime, 0
        for m in self.models:
            held += m.weights
            worst = max(worst, held + m.file_bytes)
        return max(worst, self.steady(slots, seq))

    def max_slots(self, budget: int, seq: int, ceiling: int | None = None) -> int:
        """Most slots of `seq` tokens whose load fits in `budget` bytes (0: none), at most `ceiling`."""
        hi = max(0, budget // max(1, self.kv_per_slot(seq)) + 1)  # KV alone caps it
        if ceiling is not None:
            hi = min(hi, ceiling)
        lo = 0
        while lo < hi:  # peak() grows with slots: largest n with peak(n) <= budget
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if self.peak(mid, seq) <= budget else (lo, mid - 1)
        return lo

    def max_seq(self, budget: int, slots: int, limit: int) -> int:
        """Longest context (tokens, at most `limit`) for `slots` slots within `budget` (0: none)."""
        lo, hi = 0, limit
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if self.peak(slots, mid) <= budget else (lo, mid - 1)
        return lo


@dataclass(frozen=True)
class Sizing:
    """What a load was sized to: slots and context, the plan, and the memory it was checked
    against (None: unknown, not checked)."""

    slots: int
    seq: int
    plan: MemoryPlan
    available: int | None
    shortened_from: int | None = None  # the context asked for, when `seq` was shortened to fit

    @property
    def kv_bytes(self) -> int:
        return self.slots * self.plan.kv_per_slot(self.seq)

    def summary(self) -> str:
        """One line for logs: slots, KV per slot and in total, weights per model."""
        weights = ", ".join(f"{m.name} {_gb(m.weights)}" for m in self.plan.models)
        avail = f" of {_gb(self.available)} available" if self.available is not None else ""
        return (f"{self.slots} slots x {self.seq} tokens, KV {_mib(self.plan.kv_per_slot(self.seq))} per slot "
                f"({_gb(self.kv_bytes)} in all), weights {weights}; predicted {_gb(self.plan.steady(self.slots, self.seq))}"
                f"{avail}{self.note()}")

    def note(self) -> str:
        """What fitting memory changed, for logs ("" when nothing)."""
        if self.shortened_from is None:
            return ""
        return (f"; context shortened from {self.shortened_from} to {self.seq} tokens so that {self.slots} slots fit "
                f"(set max_seq_len or max_batch to choose)")


def windowed_rows(window: int) -> int:
    """Rows of a windowed draft's pool: its window and a run of tokens after it (it reads its
    window again when a request outgrows them)."""
    return window + WINDOW_RUN


def size(plan: MemoryPlan, slots: int | str, seq: int, available: int | None, *,
         fraction: float = DEFAULT_MEMORY_FRACTION, ceiling: int = AUTO_MAX_SLOTS, s_max: int | None = None,
         fit_seq: bool = False) -> Sizing:
    """Resolve `slots` ("auto": as many as fit in `fraction` of `available`, at most `ceiling`)
    or check an explicit count against all of `available`; raises InsufficientMemory with the
    numbers and what would fit. available None (cannot be read here): explicit counts pass
    unchecked, auto is refused. s_max: the bundle's context, the longest `seq` the message may
    suggest. fit_seq: `seq` was not asked for (the bundle's S_max): where the slots do not fit,
    the longest context that fits them in `fraction` of `available`, rounded down to 256 tokens
    and at least min(seq, MIN_FIT_SEQ), is taken instead of refusing."""
    if not 0 < fraction <= 1:
        raise ValueError(f"memory fraction must be in (0, 1], got {fraction}")
    if fit_seq and available is not None:
        # a context specrt picks itself leaves headroom, as `auto` does: a re-check against a later,
        # slightly smaller reading (the server sizes, then loads) must not refuse its own choice
        fitted = _fit_seq(plan, slots, seq, int(fraction * available), available)
        if fitted is not None:
            return fitted
    if slots == AUTO:
        if available is None:
            raise ValueError("max_batch 'auto' needs the available memory, which cannot be read on this machine: "
                             "give a slot count")
        budget = int(fraction * available)
        n = plan.max_slots(budget, seq, ceiling)
        if n < 1:
            raise InsufficientMemory(_message(plan, 1, seq, budget, f"{fraction:.0%} of the {_gb(available)} available "
                                              f"(memory fraction) is {_gb(budget)}", s_max or seq))
        return Sizing(n, seq, plan, available)
    if available is not None and plan.peak(slots, seq) > available:
        raise InsufficientMemory(_message(plan, slots, seq, available, f"{_gb(available)} is available", s_max or seq))
    return Sizing(slots, seq, plan, available)


def _fit_seq(plan: MemoryPlan, slots: int | str, seq: int, budget: int, available: int) -> Sizing | None:
    """The load at a shorter context when `slots` (auto: one) do not fit at `seq` but fit at
    min(seq, MIN_FIT_SEQ) or more; None when no shortening is needed or none helps."""
    n = 1 if slots == AUTO else slots
    if plan.peak(n, seq) <= budget:
        return None
    longest = plan.max_seq(budget, n, seq)
    longest = longest - longest % 256 if longest >= 256 else longest
    if longest < min(seq, MIN_FIT_SEQ):
        return None
    return Sizing(n, longest, plan, available, shortened_from=seq)


def _message(plan: MemoryPlan, slots: int, seq: int, budget: int, what: str, s_max: int) -> str:
    """What the load needs, part by part, against `what` (a clause naming `budget` bytes), and
    the largest slot count and context that fit in `budget`."""
    need, steady = plan.peak(slots, seq), plan.steady(slots, seq)
    parts = (f"weights {_gb(plan.weights)} ({', '.join(f'{m.name} {_gb(m.weights)}' for m in plan.models)}), "
             f"KV {_gb(slots * plan.kv_per_slot(seq))} ({slots} x {_mib(plan.kv_per_slot(seq))}), "
             f"buffers {_gb(plan.buffers(slots, seq))}, onnxruntime {_gb(plan.runtime)}")
    load = f"; building a session peaks at {_gb(need)}" if need > steady else ""
    fits = plan.max_slots(budget, seq)
    longest = plan.max_seq(budget, slots, s_max)
    if fits:
        hint = f"at most {fits} slots of {seq} tokens fit (max_batch <= {fits}, or 'auto')"
    else:
        hint = f"not even one slot of {seq} tokens fits"
    if longest and longest != seq:
        hint += f", or {slots} slots of at most {longest} tokens (max_seq_len <= {longest})"
    return (f"not enough memory for {slots} KV slots of {seq} tokens: the load needs {_gb(steady)} ({parts}){load}, "
            f"and {what}; {hint}")


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


# --- what the machine has ----------------------------------------------------------------------
def available_bytes(device: str) -> int | None:
    """Bytes a load may take now: CPU, the smaller of MemAvailable and the memory cgroup's
    room; CUDA, device 0's free memory. None when it cannot be read."""
    if device == "cuda":
        return cuda_free_bytes()
    known = [n for n in (mem_available(), cgroup_room()) if n is not None]
    return min(known) if known else None


def mem_available(path: str = "/proc/meminfo") -> int | None:
    """MemAvailable (bytes): free memory plus what the kernel can reclaim without swapping."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def cgroup_room(proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> int | None:
    """Bytes left under this process's memory cgroup limits (the tightest level from its own
    group up to the root): limit - usage + inactive page cache (reclaimable, as MemAvailable
    counts it). cgroup v2 (memory.max, memory.current) or v1 (memory.limit_in_bytes,
    memory.usage_in_bytes); None without a limit."""
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return None
    rooms = []
    for line in lines:
        fields = line.split(":", 2)  # hierarchy-id:controllers:path
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        if controllers == "":  # v2 unified hierarchy
            files = ("memory.max", "memory.current", "inactive_file")
            base = Path(root) if not (Path(root) / "unified").is_dir() else Path(root) / "unified"
        elif "memory" in controllers.split(","):
            files = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
            base = Path(root) / "memory"
        else:
            continue
        rooms += [r for r in (_room(d, *files) for d in _levels(base, path)) if r is not None]
    return min(rooms) if rooms else None


def _levels(base: Path, path: str) -> list[Path]:
    """The group's folder and its parents up to the hierarchy's root; only the root when the
    group's own folder is not visible (a cgroup namespace mounts the group as the root)."""
    own = base / path.lstrip("/")
    if not own.is_dir():
        return [base]
    return [own, *[p for p in own.parents if p.is_relative_to(base)]]


def _room(folder: Path, limit_file: str, usage_file: str, inactive_key: str) -> int | None:
    try:
        limit = (folder / limit_file).read_text().strip()
        usage = int((folder / usage_file).read_text())
    except (OSError, ValueError):
        return None
    if limit == "max" or int(limit) >= _UNLIMITED:
        return None
    inactive = 0
    try:
        for line in (folder / "memory.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == inactive_key:
                inactive = int(value)
    except (OSError, ValueError):
        pass
    return max(0, int(limit) - usage + inactive)


def cuda_free_bytes(index: int = 0) -> int | None:
    """Free memory of CUDA device `index` through NVML (the driver's library; no CUDA runtime
    needed), None where it cannot be read."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None

    class Info(ctypes.Structure):
        _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]

    handle, info = ctypes.c_void_p(), Info()
    if nvml.nvmlInit_v2() != 0:
        return None
    try:
        if nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) != 0:
            return None
        if nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(info)) != 0:
            return None
        return int(info.free)
    finally:
        nvml.nvmlShutdown()


def file_bytes(folder: Path, *files: str | None) -> int:
    return sum(os.path.getsize(folder / f) for f in files if f)
