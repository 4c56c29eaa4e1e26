"""Is a .gguf file whole? A walk over its header (metadata and tensor table) that checks every
length against the file's size, before any reader touches it.

gguf-py and transformers read a GGUF through a memory map and trust its lengths: a file cut short
(an interrupted download or copy) fails deep inside them, as `struct.error: unpack_from requires
a buffer of ...` or `cannot reshape array of size ...`. `gguf_problem` says instead where the file
ends and what should have been there (docs/design.md, "A GGUF is checked whole before export").
"""

from __future__ import annotations

import mmap
import struct
from functools import lru_cache
from pathlib import Path

MAGIC = b"GGUF"
# GGUF metadata value types (gguf-py's GGUFValueType): scalar sizes; 8 = string, 9 = array
_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
_ALIGNMENT = "general.alignment"


class _Short(Exception):
    """The header needs bytes past the end of the file."""


class _Reader:
    def __init__(self, buf):
        self.buf, self.pos, self.size = buf, 0, len(buf)

    def take(self, n: int, what: str) -> int:
        start = self.pos
        if n < 0 or start + n > self.size:
            raise _Short(f"{what} at byte {start} needs {n} bytes")
        self.pos = start + n
        return start

    def u32(self, what: str) -> int:
        return struct.unpack_from("<I", self.buf, self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack_from("<Q", self.buf, self.take(8, what))[0]

    def string(self, what: str) -> str:
        n = self.u64(what)
        start = self.take(n, what)
        return bytes(self.buf[start:start + n]).decode("utf-8", "replace")

    def value(self, vtype: int, what: str):
        if vtype == _STRING:
            return self.string(what)
        if vtype == _ARRAY:
            itype, n = self.u32(what), self.u64(what)
            if itype in _SCALAR:
                self.take(n * _SCALAR[itype], what)
            else:
                for _ in range(n):
                    self.value(itype, what)
            return None
        if vtype not in _SCALAR:
            raise ValueError(f"{what} has value type {vtype}, which no GGUF version defines")
        start = self.take(_SCALAR[vtype], what)
        return int.from_bytes(self.buf[start:start + _SCALAR[vtype]], "little") if vtype in (4, 5) else None


def gguf_problem(path: Path) -> str | None:
    """None if `path` holds a whole GGUF (v2/v3, little-endian): its header parses within the
    file and every tensor's bytes lie inside it; else what is wrong, in words."""
    size = path.stat().st_size
    if size < 24:
        return f"it holds {size} bytes, fewer than a GGUF header's first 24"
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        if buf[:4] != MAGIC:
            return f"it does not start with the GGUF magic bytes (it starts with {bytes(buf[:4])!r})"
        r = _Reader(buf)
        r.take(4, "the magic")
        version = r.u32("the version")
        if version not in (2, 3):
            return f"it is GGUF version {version}; versions 2 and 3 are supported"
        try:
            data, tensors = _header(r)
        except _Short as e:
            return f"the file ends inside its header ({e}, the file has {size}): it is truncated"
        except ValueError as e:
            return str(e)
    return _tensors_problem(data, tensors, size)


def _header(r: _Reader) -> tuple[int, list]:
    """-> (where the tensor data starts, [(name, dims, ggml type, offset)]) from the counts on."""
    n_tensors, n_kv = r.u64("the tensor count"), r.u64("the metadata count")
    alignment = 32
    for i in range(n_kv):
        key = r.string(f"metadata key {i}")
        got = r.value(r.u32(f"metadata {key!r}"), f"metadata {key!r}")
        if key == _ALIGNMENT and isinstance(got, int) and got > 0:
            alignment = got
    tensors = []
    for i in range(n_tensors):
        name = r.string(f"tensor name {i}")
        dims = [r.u64(f"tensor {name!r}") for _ in range(r.u32(f"tensor {name!r}"))]
        tensors.append((name, dims, r.u32(f"tensor {name!r}"), r.u64(f"tensor {name!r}")))
    return -(-r.pos // alignment) * alignment, tensors


def _tensors_problem(data: int, tensors: list, size: int) -> str | None:
    """Whether every tensor's bytes (from `data` + its offset) lie within `size` bytes."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    ends = []
    for name, dims, qtype, offset in tensors:
        try:
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
        except (ValueError, KeyError):
            return f"tensor {name!r} has ggml type {qtype}, which the installed gguf package does not know"
        elements = 1
        for d in dims:
            elements *= d
        ends.append((data + offset + elements // block * type_size, name))
    if ends and max(ends)[0] > size:
        end, name = min(e for e in ends if e[0] > size)
        return (f"tensor {name!r} ends at byte {end}, but the file has {size} bytes: it is truncated "
                f"(it holds {size / max(ends)[0]:.1%} of the {max(ends)[0]} bytes its tensor table names)")
    return None


@lru_cache(maxsize=8)
def gguf_problem_cached(path: str, size: int, mtime_ns: int) -> str | None:
    """gguf_problem, once per file version (an export reads its target for the vocabulary check,
    then to load it)."""
    return gguf_problem(Path(path))
