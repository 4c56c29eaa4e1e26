"""2 MiB pages for session memory (runtime/bundle/hugepages.py)."""

import json
import mmap
import subprocess
import sys

import numpy as np
import pytest

from specrt.runtime.bundle import hugepages


def _fresh_buffer(n: int) -> np.ndarray:
    """n bytes in a mapping of their own, touched. (np.ones may land in memory the process freed
    earlier and still maps: glibc raises its mmap threshold after large frees, so the pages
    would not be new.)"""
    buf = np.frombuffer(mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS), dtype=np.uint8)
    buf[:] = 1
    return buf


def test_hugepages_collapse_new_anonymous_memory():

    before = hugepages.anonymous_pages()
    buf = _fresh_buffer(16 << 20)  # 16 MiB, touched: at least 7 whole 2 MiB pages
    new = hugepages.anonymous_pages() - before
    lo, hi = buf.ctypes.data, buf.ctypes.data + buf.nbytes
    assert {p for p in new if lo <= p * hugepages.HUGE and (p + 1) * hugepages.HUGE <= hi}, "buffer pages not found"
    done = hugepages.collapse(new)
    if done == 0:
        pytest.skip("this kernel cannot collapse to 2 MiB pages (MADV_COLLAPSE needs Linux >= 6.1 with THP)")
    assert done >= 6 * hugepages.HUGE
    assert (buf == 1).all()  # contents survive the move


def test_collapse_stops_at_its_time_budget():
    before = hugepages.anonymous_pages()
    buf = _fresh_buffer(16 << 20)
    new = sorted(hugepages.anonymous_pages() - before)
    half = len(new) // 2
    if hugepages.collapse(new[:half]) == 0:  # a positive budget moves pages where the kernel can
        pytest.skip("this kernel cannot collapse to 2 MiB pages (MADV_COLLAPSE needs Linux >= 6.1 with THP)")
    assert hugepages.collapse(new[half:], budget_s=-1.0) == 0  # past the deadline before the first page
    assert (buf == 1).all()


PIPELINES = """
import json, sys
import specrt
from specrt.runtime.bundle import loader

collapsed = []  # bytes the loader moved onto 2 MiB pages, per pipeline
real = loader.collapse
loader.collapse = lambda pages, *a, **kw: collapsed.append(real(pages, *a, **kw)) or collapsed[-1]
prompt = [1, 5, 9, 33, 7]
huge = specrt.load(sys.argv[1], max_batch=48)  # hugepages: the library default (services)
plain = specrt.load(sys.argv[1], hugepages=False, max_batch=48)
out = {p.hugepages: [t for c in p.stream_ids(prompt, max_new_tokens=24) for t in c] for p in (huge, plain)}
print(json.dumps({"collapsed": collapsed, "huge": out[True], "plain": out[False]}))
"""


def test_pipeline_on_hugepages_is_the_same_model(tiny_bundles):
    """The library default moves the sessions' memory onto 2 MiB pages (at least one page, else
    the test skips saying so) and generates what a pipeline on 4 KiB pages does. In a process of
    its own: in a long test process the allocator hands out memory it mapped before (glibc
    raises its mmap threshold after large frees), so a pipeline's buffers are no new pages."""
    r = subprocess.run([sys.executable, "-c", PIPELINES, str(tiny_bundles["int8"])], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(out["collapsed"]) == 1  # asked for by the hugepages pipeline only
    if out["collapsed"][0] == 0:
        pytest.skip("no page of the pipeline's memory could be collapsed to 2 MiB (MADV_COLLAPSE needs Linux >= 6.1 "
                    "with THP; a fragmented machine may have no free 2 MiB page): nothing to compare")
    assert out["collapsed"][0] >= hugepages.HUGE  # 48 slots: ~6 MiB of KV, more than the tiny sessions
    assert out["huge"] == out["plain"] and len(out["huge"]) > 0
