"""The CUDA runtime through cuda-python (extra `trt`), imported lazily: the TensorRT backend's
buffers and device-to-device copies of KV rows (prefix reuse on a GPU pool)."""

from __future__ import annotations


def cudart():
    try:
        from cuda.bindings import runtime
    except ImportError as e:
        raise RuntimeError(f"CUDA device buffers need cuda-python (pip install 'specrt[trt]'): {e}") from None
    return runtime


def ck(result):
    """cuda-python returns (err, *values); raise on error, return the values."""
    err, *vals = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise RuntimeError(f"CUDA error {err}")
    return vals[0] if len(vals) == 1 else vals


def synchronize() -> None:
    """Wait for the device's queued work (device-to-device copies may return before they land)."""
    cu = cudart()
    ck(cu.cudaDeviceSynchronize())


def copy_device_rows(dst: int, src: int, *, pitch: int, width: int, height: int) -> None:
    """`height` runs of `width` bytes, `pitch` bytes apart, from device address src to dst: rows
    [0, n) of one slot's [Hkv, S_max, D] buffer are Hkv runs of n·D elements, S_max·D apart."""
    cu = cudart()
    ck(cu.cudaMemcpy2D(dst, pitch, src, pitch, width, height, cu.cudaMemcpyKind.cudaMemcpyDeviceToDevice))
