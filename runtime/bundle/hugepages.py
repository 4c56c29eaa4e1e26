"""Back a session's weights with 2 MiB pages (Linux, CPU).

A decode step streams every weight once (540 MB for the fp32 target). With 4 KiB pages that
is ~130k TLB misses per step, each a page walk (two-level under a hypervisor). onnxruntime
allocates its prepacked weights with plain malloc, which gets 2 MiB pages only where the
kernel's THP mode is `always`; the common default is `madvise`. After a session is built, the
anonymous memory it added is collapsed in place with madvise(MADV_COLLAPSE) (Linux >= 6.1;
synchronous; independent of the THP sysfs mode). The trade: slightly faster steps (draft steps
gain most: smaller kernels, same page walks) for a longer load that the kernel's free-memory
state sets, so it pays only after some thousands of tokens (numbers: docs/benchmarks.md §1, §4
"Session 5"): on by default for `load()` / `Pipeline` (services) and `specrt bench`, off for the
one-shot `specrt generate` (docs/design.md). Anywhere it
is unsupported it does nothing; a collapse that stalls (fragmented memory: the kernel compacts
synchronously) stops at a time budget and leaves the rest on 4 KiB pages.

Usage: `before = anonymous_pages()`, build the session, `collapse(anonymous_pages() - before)`.
"""

from __future__ import annotations

import ctypes
import sys
import time

HUGE = 2 << 20
MADV_COLLAPSE = 25
BUDGET_S = 3.0  # per session: well above what the default pair takes (docs/design.md, "2 MiB pages")


def enabled() -> bool:
    return sys.platform == "linux"


def anonymous_pages() -> set[int]:
    """2 MiB-aligned page numbers fully inside private anonymous read-write mappings."""
    pages: set[int] = set()
    if not enabled():
        return pages
    try:
        with open("/proc/self/maps") as f:
            lines = f.readlines()
    except OSError:
        return pages
    for line in lines:
        parts = line.split()
        if len(parts) < 5 or not parts[1].startswith("rw") or parts[1][3] != "p":
            continue
        if len(parts) > 5 and not parts[5].startswith("[heap"):  # file-backed or special
            continue
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        pages.update(range(-(-lo // HUGE), hi // HUGE))
    return pages


_madvise = None


def collapse(pages, budget_s: float = BUDGET_S) -> int:
    """MADV_COLLAPSE each page until budget_s has passed; returns the bytes now on 2 MiB pages
    (0 where unsupported)."""
    global _madvise
    if not pages or not enabled():
        return 0
    if _madvise is None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            _madvise = libc.madvise
        except (OSError, AttributeError):
            _madvise = False
    if not _madvise:
        return 0
    done = 0
    deadline = time.perf_counter() + budget_s
    for i, p in enumerate(sorted(pages)):
        if time.perf_counter() > deadline:
            break
        if _madvise(p * HUGE, HUGE, MADV_COLLAPSE) == 0:
            done += HUGE
        elif i == 0 and ctypes.get_errno() == 22:  # EINVAL at once: the kernel lacks MADV_COLLAPSE
            return 0
    return done
