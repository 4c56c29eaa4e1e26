"""Median call times of several shapes, interleaved round-robin so that a burst of load hits
every shape alike (the cost tools: packed_costs.py, kv_dtype_costs.py)."""

from __future__ import annotations

import time

import numpy as np


def interleaved_medians(calls: dict, reps: int) -> dict:
    """calls: key -> a function of no arguments. -> key -> median ms over `reps` passes (after
    one warm-up call each)."""
    times = {k: [] for k in calls}
    for f in calls.values():
        f()  # warm up
    for _ in range(reps):
        for k, f in calls.items():
            t0 = time.perf_counter()
            f()
            times[k].append(1000 * (time.perf_counter() - t0))
    return {k: float(np.median(v)) for k, v in times.items()}
