"""Atomic bundle writes: build in a hidden temporary folder beside the target, validate, rename.

An interrupted or failed export leaves at most a `.<name>.tmp-*` folder (no manifest until the
very end, so it never loads) and never touches the previous bundle until the final swap.
"""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path

import onnx


def save_graph(model: onnx.ModelProto, folder: Path) -> tuple[str, str]:
    """Write model.onnx + model.onnx.data into folder; returns their names."""
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save_model(
        model,
        str(folder / "model.onnx"),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="model.onnx.data",
        size_threshold=1024,
    )
    # onnx writes the weights file with mode 0600 whatever the umask; a service running as
    # another user must be able to read a bundle a deploy user built: the umask decides, as for
    # every other file of the bundle
    os.chmod(folder / "model.onnx.data", 0o666 & ~_umask())
    return "model.onnx", "model.onnx.data"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def staging(out: Path):
    """Yields a fresh temporary folder; on success swaps it into `out` atomically."""
    out = Path(out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    for stale in out.parent.glob(f".{out.name}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = out.parent / f".{out.name}.old-{os.getpid()}"
    if out.exists():
        os.replace(out, old)
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)
