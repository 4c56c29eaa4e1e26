"""QMatMul4's weight layout, and its numbers in NumPy.

A weight w[n, k] = scale[n, b] * code[n, k] + min[n, b] (b = k // 32, codes 0..15) is packed as
  codes [N/16, K/32, 256] uint8: for column tile t and block b, 4 chunks of 64 bytes; chunk j
      holds, for column c of the tile, 4 bytes whose low nibbles are codes k = 32b + 4j + i and
      high nibbles k = 32b + 4(j + 4) + i (i = 0..3): the AVX-512 VNNI / AMX operand order;
  scale, min [N/16, K/32, 16] float32: one vector per tile and block.
"""

from __future__ import annotations

import numpy as np

BLOCK = 32
TILE = 16


def pack(codes: np.ndarray, scale: np.ndarray, mins: np.ndarray | None = None):
    """codes [N, K] (0..15), scale / mins [N, K/32] -> QMatMul4's (codes, scale, min)."""
    n, k = codes.shape
    if n % TILE or k % BLOCK:
        raise ValueError(f"QMatMul4 needs N a multiple of {TILE} and K of {BLOCK}, got N={n}, K={k}")
    if codes.max(initial=0) > 15:
        raise ValueError("QMatMul4 codes are 4-bit (0..15)")
    nb = k // BLOCK
    # [t, c, b, half, j, i] -> [t, b, j, c, i] with half 0 in the low nibble
    c = codes.astype(np.uint8).reshape(n // TILE, TILE, nb, 2, 4, 4)
    c = c.transpose(0, 2, 3, 4, 1, 5)  # [t, b, half, j, c, i]
    packed = c[:, :, 0] | (c[:, :, 1] << 4)
    return (np.ascontiguousarray(packed.reshape(n // TILE, nb, 256)), _tiles(scale, n, nb),
            None if mins is None else _tiles(mins, n, nb))


def _tiles(v: np.ndarray, n: int, nb: int) -> np.ndarray:
    return np.ascontiguousarray(v.astype(np.float32).reshape(n // TILE, TILE, nb).transpose(0, 2, 1))


def quantize(x: np.ndarray):
    """x [M, K] -> (q int8 [M, K], sa [M, K/32]): the kernel's activations, bit for bit."""
    m, k = x.shape
    xb = x.astype(np.float32).reshape(m, k // BLOCK, BLOCK)
    amax = np.abs(xb).max(-1)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint(xb * inv[..., None]).astype(np.int8).reshape(m, k)
    return q, (amax / np.float32(127)).astype(np.float32)


def reference(x, codes, scale, mins=None, bias=None) -> np.ndarray:
    """QMatMul4's result in float64 over the same quantized activations: the kernel differs from
    it only by float32 rounding."""
    m, k = x.shape
    q, sa = quantize(x)
    deq = np.repeat(sa.astype(np.float64), BLOCK, axis=1) * q          # activations as the kernel sees them
    w = np.repeat(scale.astype(np.float64), BLOCK, axis=1) * codes
    if mins is not None:
        w += np.repeat(mins.astype(np.float64), BLOCK, axis=1)
    y = deq @ w.T
    return y if bias is None else y + bias
