"""2 MiB pages for session memory (runtime/hugepages.py)."""

import mmap

import numpy as np
import pytest

import specrt
from specrt.runtime import hugepages


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


def test_pipeline_on_hugepages_is_the_same_model(tiny_bundles):
    prompt = [1, 5, 9, 33, 7]
    plain = specrt.load(tiny_bundles["int8"], hugepages=False)
    huge = specrt.load(tiny_bundles["int8"])  # the library default: services
    assert huge.hugepages and not plain.hugepages
    want = [t for c in plain.stream_ids(prompt, max_new_tokens=24) for t in c]
    assert [t for c in huge.stream_ids(prompt, max_new_tokens=24) for t in c] == want
