"""Atomic bundle writes: build in a hidden temporary folder beside the target, validate, rename.

An interrupted or failed export leaves at most a `.<name>.tmp-*` folder (no manifest until the
very end, so it never loads) and never touches the previous bundle until the final swap.
"""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

GRAPH, DATA = "model.onnx", "model.onnx.data"
EXTERNAL_MIN_BYTES = 1024  # smaller initializers stay inside model.onnx
ALIGN = 4096  # offsets in the data file: page-aligned, so onnxruntime may map them directly


class ExternalData:
    """Streams initializers into `folder/model.onnx.data` as the graph is built: each array is
    written once and only a TensorProto pointing at (offset, length) is kept, so a graph never
    holds a second copy of its weights in memory. Used as `build_graph(..., sink=...)`; close()
    before the graph is saved."""

    def __init__(self, folder: Path):
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / DATA
        self._f = open(self.path, "wb")

    def __call__(self, name: str, arr: np.ndarray) -> TensorProto | None:
        """-> an external TensorProto for `arr`, or None for a small one (kept inline)."""
        if arr.nbytes < EXTERNAL_MIN_BYTES:
            return None
        arr = np.ascontiguousarray(arr)
        offset = -(-self._f.tell() // ALIGN) * ALIGN
        self._f.seek(offset)
        self._f.write(memoryview(arr).cast("B"))
        t = TensorProto(name=name, dims=arr.shape, data_type=helper.np_dtype_to_tensor_dtype(arr.dtype),
                        data_location=TensorProto.EXTERNAL)
        for key, value in (("location", DATA), ("offset", str(offset)), ("length", str(arr.nbytes))):
            t.external_data.add(key=key, value=value)
        return t

    def close(self):
        self._f.close()


def save_graph(model: onnx.ModelProto, folder: Path) -> tuple[str, str]:
    """Write model.onnx + model.onnx.data into folder; returns their names. Initializers already
    streamed by an `ExternalData` sink of this folder stay where they are."""
    folder.mkdir(parents=True, exist_ok=True)
    if (folder / DATA).is_file():  # streamed: the proto holds only small tensors and references
        onnx.save_model(model, str(folder / GRAPH))
    else:
        onnx.save_model(model, str(folder / GRAPH), save_as_external_data=True,
                        all_tensors_to_one_file=True, location=DATA, size_threshold=EXTERNAL_MIN_BYTES)
    # onnx writes the weights file with mode 0600 whatever the umask; a service running as
    # another user must be able to read a bundle a deploy user built: the umask decides, as for
    # every other file of the bundle
    os.chmod(folder / DATA, 0o666 & ~_umask())
    return GRAPH, DATA


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
