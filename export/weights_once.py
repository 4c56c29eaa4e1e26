"""A model's weights stored once (docs/design.md "Weights stored once"): where a model has kernel
graphs (export/kernel_graph.py), its portable graphs (`model.onnx`, `packed{lanes}.onnx`: the
same model on onnxruntime's own operators, MatMulNBits' codes, fp32 scales and mins) are a second
copy of its projections' weights. An export with `portable = false` drops them here: the kernel
graphs keep what they read of `model.onnx.data` (the embedding, the norms, the weights no
operator of ours takes) in a compacted file of the same name, and the entry says
`portable: false`. export/portable.py adds them back.
"""

from __future__ import annotations

import os
from pathlib import Path

import onnx

from specrt.runtime.bundle import genai
from specrt.runtime.bundle.manifest import Manifest, ModelEntry

from .bundle import ALIGN

CHUNK = 64 << 20  # bytes copied at a time


def external_of(t) -> dict:
    """An initializer's external-data fields (location, offset, length) as a dict."""
    return {kv.key: kv.value for kv in t.external_data}


def drop_portable(folder: Path, entry: ModelEntry) -> int:
    """Remove `entry`'s portable graphs from the bundle at `folder` (the manifest is the caller's
    to save): its data file keeps only what the kernel graphs read, compacted, and their
    references move with it. -> bytes the bundle no longer holds. Nothing changes for an entry
    without kernel graphs (it keeps its portable graphs: they are its only ones)."""
    if not entry.packed.kernels or not entry.data:
        return 0
    data = folder / entry.data
    graphs = [folder / entry.packed.kernel_file(n) for n in entry.packed.lanes]
    models = [onnx.load(str(g), load_external_data=False) for g in graphs]
    before = sum(p.stat().st_size for p in [data, folder / entry.graph, *(folder / entry.packed.file(n)
                                                                       for n in entry.packed.lanes)])
    tmp = data.with_name(data.name + ".tmp")
    ranges = _compact(data, tmp, models)
    for m, g in zip(models, graphs, strict=True):
        _move_references(m, data.name, ranges)
        g_tmp = g.with_suffix(".tmp")
        onnx.save(m, str(g_tmp))
        g_tmp.replace(g)
    os.chmod(tmp, data.stat().st_mode & 0o777)
    tmp.replace(data)
    for rel in [entry.graph, *(entry.packed.file(n) for n in entry.packed.lanes)]:
        (folder / rel).unlink()
    entry.portable = False
    return before - data.stat().st_size


def _external_in(m, name: str):
    """The initializers of graph `m` whose data is in the file `name`."""
    for t in m.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL and external_of(t).get("location") == name:
            yield t


def _compact(data: Path, tmp: Path, models) -> dict[tuple[int, int], int]:
    """Copy into `tmp` the ranges of `data` that `models` read, aligned. -> (offset, length) in
    the old file -> offset in the new."""
    ranges: dict[tuple[int, int], int] = {}
    for m in models:
        for t in _external_in(m, data.name):
            ext = external_of(t)
            ranges.setdefault((int(ext.get("offset", 0)), int(ext["length"])), 0)
    with open(data, "rb") as src, open(tmp, "wb") as dst:
        for off, length in sorted(ranges):
            ranges[off, length] = new = -(-dst.tell() // ALIGN) * ALIGN
            dst.seek(new)
            src.seek(off)
            for start in range(0, length, CHUNK):
                dst.write(src.read(min(CHUNK, length - start)))
    return ranges


def _move_references(m, name: str, ranges: dict[tuple[int, int], int]) -> None:
    """Point graph `m`'s initializers in file `name` at their offsets in the compacted file."""
    for t in _external_in(m, name):
        ext = external_of(t)
        new = ranges[int(ext.get("offset", 0)), int(ext["length"])]
        for kv in t.external_data:
            if kv.key == "offset":
                kv.value = str(new)
        if "offset" not in ext:
            t.external_data.add(key="offset", value=str(new))


def drop_bundle(folder: Path, man: Manifest, echo=None) -> None:
    """Every entry of `man` with kernel graphs without its portable graphs; the genai files go
    with the target's (onnxruntime-genai reads the portable graphs); the manifest is saved."""
    for role, entry in (("target", man.target), ("draft", man.draft)):
        if entry is None:
            continue
        saved = drop_portable(folder, entry)
        if echo and saved:
            echo(f"{role}: kernel graphs only, {saved / 2**20:.0f} MiB of portable graphs not stored")
        elif echo and entry.portable:
            echo(f"{role}: no kernel graphs, so its portable graphs stay (portable = false applies to kernel graphs)")
    if man.target.portable_missing:
        for name in (genai.CONFIG, genai.SPECULATIVE):
            (folder / name).unlink(missing_ok=True)
    elif man.draft is not None and man.draft.portable_missing:
        (folder / genai.SPECULATIVE).unlink(missing_ok=True)
    man.save(folder)


def recipe(args: dict) -> dict:
    """export_bundle's arguments as the manifest records them: a source that is a local path made
    absolute (`eagle:` heads too), so the recipe runs again from anywhere."""
    out = dict(args)
    for key in ("target", "draft"):
        v = out.get(key)
        if not isinstance(v, str):
            continue
        prefix, path = ("eagle:", v[6:]) if v.startswith("eagle:") else ("", v)
        if path and os.path.exists(path):
            out[key] = prefix + str(Path(path).resolve())
    return out
