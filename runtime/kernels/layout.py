"""The weight layout of specrt's QMatMul4 / QMatMul8 (native/qmatmul.h), and their numbers in NumPy.

A weight w[n, k] = scale[n, b] * code[n, k] + min[n, b] (b = k // block) is packed as
  codes [N/16, K/block, 16 * block * bits / 8] uint8: for column tile t and block b, chunks of
      64 bytes; chunk j holds, for column c of the tile, 4 bytes of codes k = block*b + 4j + i
      (i = 0..3): the AVX-512 VNNI / AMX operand order. 8 bits: block/4 chunks, one code a byte.
      4 bits (block 32): 4 chunks whose low nibbles are codes k = 32b + 4j + i and high nibbles
      k = 32b + 4(j + 4) + i;
  scale, min [N/16, K/block, 16] float32: one vector per tile and block.
"""

from __future__ import annotations

import numpy as np

QBLOCK = 32  # activations: values per int8 quantization block
TILE = 16
FORMS = {(4, 32): "QMatMul4", (8, 16): "QMatMul8", (8, 32): "QMatMul8"}  # (bits, block) -> operator


def pack(codes: np.ndarray, scale: np.ndarray, mins: np.ndarray | None = None, bits: int = 4, block: int = 32):
    """codes [N, K] (unsigned, < 2**bits), scale / mins [N, K/block] -> the operator's (codes,
    scale, min)."""
    n, k = codes.shape
    if (bits, block) not in FORMS:
        raise ValueError(f"specrt's kernels take 4-bit codes in blocks of 32 or 8-bit in blocks of 16 or 32, "
                         f"not {bits}-bit in blocks of {block}")
    if n % TILE or k % QBLOCK:
        raise ValueError(f"specrt's kernels need N a multiple of {TILE} and K of {QBLOCK}, got N={n}, K={k}")
    if codes.max(initial=0) >= 1 << bits:
        raise ValueError(f"codes must be {bits}-bit")
    nb = k // block
    c = codes.astype(np.uint8).reshape(n // TILE, TILE, nb, block // 4, 4)  # [t, c, b, j, i]
    c = c.transpose(0, 2, 3, 1, 4)  # [t, b, j, c, i]
    if bits == 4:
        c = c[:, :, :4] | (c[:, :, 4:] << 4)
    return (np.ascontiguousarray(c.reshape(n // TILE, nb, -1)), _tiles(scale, n, nb),
            None if mins is None else _tiles(mins, n, nb))


def _tiles(v: np.ndarray, n: int, nb: int) -> np.ndarray:
    return np.ascontiguousarray(v.astype(np.float32).reshape(n // TILE, TILE, nb).transpose(0, 2, 1))


def quantize(x: np.ndarray):
    """x [M, K] -> (q int8 [M, K], sa [M, K/32]): the kernels' activations, bit for bit."""
    m, k = x.shape
    xb = x.astype(np.float32).reshape(m, k // QBLOCK, QBLOCK)
    amax = np.abs(xb).max(-1)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint(xb * inv[..., None]).astype(np.int8).reshape(m, k)
    return q, (amax / np.float32(127)).astype(np.float32)


def reference(x, codes, scale, mins=None, bias=None, block: int = 32) -> np.ndarray:
    """The operators' result in float64: the dequantized weights against the quantized
    activations. The kernels differ from it only by float32 rounding."""
    q, sa = quantize(x)
    deq = np.repeat(sa.astype(np.float64), QBLOCK, axis=1) * q  # activations as the kernels see them
    w = np.repeat(scale.astype(np.float64), block, axis=1) * codes
    if mins is not None:
        w += np.repeat(mins.astype(np.float64), block, axis=1)
    y = deq @ w.T
    return y if bias is None else y + bias
