"""A GGUF cut short or not a GGUF at all: a clear reason before any reader touches it
(export/gguf_check.py), and `specrt export` says it without a traceback."""

from __future__ import annotations

import struct
import subprocess
import sys

import pytest
from tiny_gguf import write_tiny_gguf

from specrt.export.errors import SourceError
from specrt.export.gguf_check import gguf_problem
from specrt.export.sources import check_gguf, peek_source, resolve_source


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_tiny_gguf(path)
    return path


def _cut(src, dst, n):
    dst.write_bytes(src.read_bytes()[:n])
    return dst


def _header_end(path) -> int:
    from gguf import GGUFReader

    return GGUFReader(str(path)).data_offset


def test_a_whole_file_passes(tiny):
    assert gguf_problem(tiny) is None
    check_gguf(resolve_source(str(tiny)))


@pytest.mark.parametrize("where", [26, 40, 200, 2000, -1])  # in the first key, a value, the vocabulary, the tensor table
def test_cut_inside_the_header(tiny, tmp_path, where):
    n = where if where > 0 else _header_end(tiny) - 40
    problem = gguf_problem(_cut(tiny, tmp_path / "cut.gguf", n))
    assert problem is not None and "ends inside its header" in problem and f"the file has {n}" in problem


@pytest.mark.parametrize("share", [0.5, 0.999])
def test_cut_inside_the_tensors(tiny, tmp_path, share):
    size = tiny.stat().st_size
    start = _header_end(tiny)
    n = start + int((size - start) * share)
    problem = gguf_problem(_cut(tiny, tmp_path / "cut.gguf", n))
    assert problem is not None and "it is truncated" in problem and f"the file has {n} bytes" in problem
    assert "tensor '" in problem


def test_the_last_byte_missing(tiny, tmp_path):
    n = tiny.stat().st_size - 1
    assert "truncated" in gguf_problem(_cut(tiny, tmp_path / "cut.gguf", n))


def test_not_a_gguf(tiny, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"PK\x03\x04" + tiny.read_bytes()[4:])
    assert "magic" in gguf_problem(bad)
    tiny_file = tmp_path / "short.gguf"
    tiny_file.write_bytes(b"GGUF")
    assert "fewer than" in gguf_problem(tiny_file)
    v9 = tmp_path / "v9.gguf"
    v9.write_bytes(b"GGUF" + struct.pack("<I", 9) + tiny.read_bytes()[8:])
    assert "version 9" in gguf_problem(v9)


def test_a_source_is_refused_with_the_reason(tiny, tmp_path):
    cut = _cut(tiny, tmp_path / "cut.gguf", tiny.stat().st_size - 100)
    with pytest.raises(SourceError, match="not a usable GGUF file: tensor .* truncated.*fetch it again"):
        check_gguf(resolve_source(str(cut)))
    folder = tmp_path / "folder"  # a folder holding one .gguf resolves to it, and is checked alike
    folder.mkdir()
    _cut(tiny, folder / "m.gguf", 500)
    with pytest.raises(SourceError, match="ends inside its header"):
        peek_source(resolve_source(str(folder)))


def test_export_says_it_without_a_traceback(tiny, tmp_path):
    cut = _cut(tiny, tmp_path / "cut.gguf", 3000)
    r = subprocess.run([sys.executable, "-m", "specrt.cli", "export", "--target", str(cut), "--draft", "none",
                        "--precision", "gguf", "--out", str(tmp_path / "b")], capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    assert "not a usable GGUF file" in r.stderr and "ends inside its header" in r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    assert not (tmp_path / "b").exists()
