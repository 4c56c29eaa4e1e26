"""Weight-only quantization in the layout of onnxruntime's MatMulNBits (4 or 8 bits).

Recipe: symmetric round-to-nearest, one fp scale per block of `block_size` input features, the
default of onnxruntime-genai's builder, so drafts compare like for like with its models. Each
block's scale maps its largest-magnitude weight (sign included) to -2^(bits-1), giving codes
0..2^bits-1 around an implicit zero point of 2^(bits-1) (MatMulNBits' default when no
zero_points input is given).
"""

from __future__ import annotations

import numpy as np


def quantize_rtn_sym(w: np.ndarray, block_size: int = 32, bits: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """w: [N, K] (HF linear layout, out x in), fp32.

    Returns (packed uint8 [N, n_blocks, block_size * bits // 8], scales fp32 [N, n_blocks]).
    4 bits: two codes per byte, element 2j in the low nibble and 2j+1 in the high one.
    8 bits: one code per byte.
    """
    if bits not in (4, 8):
        raise ValueError(f"bits must be 4 or 8, got {bits}")
    n, k = w.shape
    n_blocks = -(-k // block_size)
    pad = n_blocks * block_size - k
    wb = np.pad(w.astype(np.float32), ((0, 0), (0, pad))).reshape(n, n_blocks, block_size)
    idx = np.abs(wb).argmax(axis=-1)[..., None]
    vmax = np.take_along_axis(wb, idx, axis=-1)  # [N, nb, 1], signed
    zero = 1 << (bits - 1)
    scale = vmax / -float(zero)
    inv = np.divide(1.0, scale, out=np.zeros_like(scale), where=scale != 0)
    q = np.clip(np.rint(wb * inv) + zero, 0, 2 * zero - 1).astype(np.uint8)
    packed = q if bits == 8 else q[..., 0::2] | (q[..., 1::2] << 4)
    return np.ascontiguousarray(packed), scale[..., 0].astype(np.float32)


def dequantize(packed: np.ndarray, scales: np.ndarray, k: int, bits: int = 4) -> np.ndarray:
    """Inverse of `quantize_rtn_sym` (reference for tests): returns [N, K] fp32."""
    if bits == 8:
        q = packed
    else:
        lo, hi = packed & 0x0F, packed >> 4
        q = np.stack([lo, hi], axis=-1).reshape(packed.shape[0], packed.shape[1], -1)
    w = (q.astype(np.float32) - float(1 << (bits - 1))) * scales[..., None]
    return w.reshape(packed.shape[0], -1)[:, :k]
