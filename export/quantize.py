"""Int4 weight-only quantization in the layout of onnxruntime's MatMulNBits.

Recipe: symmetric round-to-nearest, one fp scale per block of `block_size` input features, the
default of onnxruntime-genai's builder, so drafts compare like for like with its int4 models.
Each block's scale maps its largest-magnitude weight (sign included) to -8, giving codes 0..15
around an implicit zero point of 8 (MatMulNBits' default when no zero_points input is given).
"""

from __future__ import annotations

import numpy as np


def quantize_rtn_sym(w: np.ndarray, block_size: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """w: [N, K] (HF linear layout, out x in), fp32.

    Returns (packed uint8 [N, n_blocks, block_size // 2], scales fp32 [N, n_blocks]); two codes
    per byte, element 2j in the low nibble and 2j+1 in the high one.
    """
    n, k = w.shape
    n_blocks = -(-k // block_size)
    pad = n_blocks * block_size - k
    wb = np.pad(w.astype(np.float32), ((0, 0), (0, pad))).reshape(n, n_blocks, block_size)
    idx = np.abs(wb).argmax(axis=-1)[..., None]
    vmax = np.take_along_axis(wb, idx, axis=-1)  # [N, nb, 1], signed
    scale = vmax / -8.0
    inv = np.divide(1.0, scale, out=np.zeros_like(scale), where=scale != 0)
    q = np.clip(np.rint(wb * inv) + 8, 0, 15).astype(np.uint8)
    packed = q[..., 0::2] | (q[..., 1::2] << 4)
    return packed, scale[..., 0].astype(np.float32)


def dequantize(packed: np.ndarray, scales: np.ndarray, k: int) -> np.ndarray:
    """Inverse of `quantize_rtn_sym` (reference for tests): returns [N, K] fp32."""
    lo = (packed & 0x0F).astype(np.int8)
    hi = (packed >> 4).astype(np.int8)
    q = np.stack([lo, hi], axis=-1).reshape(packed.shape[0], packed.shape[1], -1)
    w = (q.astype(np.float32) - 8.0) * scales[..., None]
    return w.reshape(packed.shape[0], -1)[:, :k]
