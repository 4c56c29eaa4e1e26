"""specrt's own onnxruntime operators (native/, built by `make kernels`; docs/design.md "Our own kernel").

The library registers domain "specrt" with QMatMul4 and QMatMul8, 4-bit and 8-bit block matmuls
whose activations are quantized per row and 32-block to int8 (a block's dot product is an exact
integer), and PackedAttention, attention over every lane of a packed call with fixed softmax
chunks. Every output takes the same float steps whatever the call's rows, threads or instruction
set (AMX, AVX-512 VNNI, AVX2 with or without AVX-VNNI; NEON with or without sdot on ARM64; or
portable C++).
`runtime/kernels/layout.py` packs weights into its layout.
"""

from __future__ import annotations

import ctypes
import os
from functools import cache
from pathlib import Path

DOMAIN = "specrt"
LIBRARY = Path(__file__).with_name("libspecrt_kernels.so")


# what a CPU needs for a fast form (native/ort_ops.cc best_isa)
NEEDS = "x86-64 with AVX2, FMA and F16C (AVX-VNNI, AVX-512 VNNI or AMX faster); ARM64 NEON"


class KernelsMissing(RuntimeError):
    """The kernel library was not built (or SPECRT_KERNELS names no file)."""


def library_path() -> Path:
    """The library to load: $SPECRT_KERNELS, else the one `make kernels` builds beside this file."""
    path = Path(os.environ.get("SPECRT_KERNELS") or LIBRARY)
    if not path.is_file():
        raise KernelsMissing(f"specrt's kernel library is not at {path}: run `make kernels` "
                             "(or set SPECRT_KERNELS to the built libspecrt_kernels.so)")
    return path


def available() -> bool:
    try:
        library_path()
    except KernelsMissing:
        return False
    return True


def fast() -> bool:
    """Whether the library is built and this CPU runs it in a fast form (AMX, AVX-512 VNNI,
    AVX-VNNI, AVX2, NEON): the portable C++ form is the kernels' definition, far slower than onnxruntime's
    MatMulNBits, so a load does not choose it."""
    return available() and isa() != "ref"


def form_for(bundle_has_graphs: bool, wanted: bool = True) -> tuple[str, str]:
    """The form a CPU load of a bundle runs these operators in, and why not where it runs none:
    (a fast form's name, "") or ("none", reason naming what runs instead). The loader's
    choice (runtime/bundle/loader.py)."""
    if not bundle_has_graphs:
        return "none", "the bundle has no kernel graphs (python -m specrt.export.kernel_graph BUNDLE adds them)"
    if not wanted:
        return "none", "--no-kernels"
    try:
        library_path()
    except KernelsMissing as e:  # its message names where it looked and how to build it
        return "none", str(e)
    form = isa()
    if form == "ref":
        instead = "the packed graphs on onnxruntime's MatMulNBits and GroupQueryAttention run instead"
        if os.environ.get("SPECRT_KERNELS_ISA") == "ref":
            return "none", f"SPECRT_KERNELS_ISA=ref (the portable form, far slower): {instead}"
        return "none", f"this CPU has no fast form of specrt's operators ({NEEDS}): {instead}"
    return form, ""


def register(options) -> None:
    """Adds the library's operators to an onnxruntime.SessionOptions."""
    options.register_custom_ops_library(str(library_path()))


@cache
def _lib(path: str) -> ctypes.CDLL:
    lib = ctypes.CDLL(path)
    lib.specrt_kernels_isa.restype = ctypes.c_char_p
    return lib


def isa() -> str:
    """The instruction set the operators run with on this CPU: "amx", "vnni", "avxvnni", "avx2"
    (x86-64), "dotprod", "neon" (ARM64) or "ref", lowered by SPECRT_KERNELS_ISA=<the name of a
    lower form this CPU runs> (read when a session creates its kernels). "avxvnni" is the AVX2
    form with 256-bit vpdpbusd: taken where the CPU has AVX-VNNI and no AVX-512; an AVX-512 host
    runs it, when asked, in vpdpbusd's EVEX encoding (the same results)."""
    return _lib(str(library_path())).specrt_kernels_isa().decode()
