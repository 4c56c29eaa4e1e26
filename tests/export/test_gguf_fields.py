"""The fast metadata parser (export/gguf_fields.py) builds gguf-py's own `fields`: every part the
same dtype, shape and bytes, the same data indices and types, for every value type a GGUF holds."""

import numpy as np
import pytest
from gguf import GGUFValueType, GGUFWriter
from gguf.gguf_reader import GGUFReader
from tiny_gguf import write_tiny_gguf

from specrt.export.gguf_fields import FastGGUFReader


def _same_fields(path) -> int:
    a, b = GGUFReader(path), FastGGUFReader(path)
    assert list(a.fields) == list(b.fields)
    n = 0
    for name, fa in a.fields.items():
        fb = b.fields[name]
        assert (fa.offset, fa.name, fa.data, fa.types) == (fb.offset, fb.name, fb.data, fb.types), name
        assert len(fa.parts) == len(fb.parts), name
        for x, y in zip(fa.parts, fb.parts, strict=True):
            assert (x.dtype, x.shape, x.tobytes()) == (y.dtype, y.shape, y.tobytes()), name
        assert fa.contents() == fb.contents(), name
        n += len(fa.parts)
    assert a.data_offset == b.data_offset
    assert [(t.name, t.data_offset, t.data.tobytes()) for t in a.tensors] == \
        [(t.name, t.data_offset, t.data.tobytes()) for t in b.tensors]
    return n


def test_tiny_model(tmp_path):
    assert _same_fields(write_tiny_gguf(tmp_path / "tiny.gguf")) > 500


def test_every_value_type(tmp_path):
    path = tmp_path / "kinds.gguf"
    w = GGUFWriter(str(path), "llama")
    w.add_string("s.one", "héllo")
    w.add_array("s.empty", [])
    w.add_array("s.strings", ["", "a", "ünïcode", "x" * 1000])
    w.add_array("s.bools", [True, False, True])
    w.add_array("s.floats", [0.5, -1.25, 3.0])
    w.add_array("s.ints", [1, -2, 3])
    w.add_array("s.nested", [[1, 2], [3]])  # gguf-py's own path
    for vt, vals in [(GGUFValueType.UINT8, [1, 255]), (GGUFValueType.INT16, [-3, 7]),
                     (GGUFValueType.UINT64, [2**40, 5]), (GGUFValueType.FLOAT64, [0.1, 2.5]),
                     (GGUFValueType.INT64, [-(2**40)])]:
        w.add_key_value(f"s.{vt.name.lower()}", vals, GGUFValueType.ARRAY, sub_type=vt)
    w.add_uint32("s.u32", 7)
    w.add_tensor("t", np.arange(12, dtype=np.float32).reshape(3, 4))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert _same_fields(path) > 20


@pytest.mark.parametrize("mutant", ["index", "length"])
def test_catches_a_wrong_parse(tmp_path, monkeypatch, mutant):
    """The comparison above fails for a parser that is off by one anywhere (it can fail)."""
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    orig = FastGGUFReader._get_field_parts

    def wrong(self, offs, raw_type):
        size, parts, idxs, types = orig(self, offs, raw_type)
        if len(idxs) > 100:
            if mutant == "index":
                idxs = idxs[:-1] + [idxs[-1] - 1]
            else:
                parts = parts[:-1] + [parts[-1][:-1]]
        return size, parts, idxs, types

    monkeypatch.setattr(FastGGUFReader, "_get_field_parts", wrong)
    with pytest.raises(AssertionError):
        _same_fields(path)
