"""Weight-only quantization in the layout of onnxruntime's MatMulNBits (4 or 8 bits).

Recipe: symmetric round-to-nearest, one fp scale per block of `block_size` input features, the
default of onnxruntime-genai's builder, so drafts compare like for like with its models. Each
block's scale (rounded to 11 significant bits, `_short_mantissa`) maps its largest-magnitude
weight (sign included) to -2^(bits-1), giving codes
0..2^bits-1 around an implicit zero point of 2^(bits-1) (MatMulNBits' default when no
zero_points input is given).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

RTN_SLAB_ROWS = 4096  # rows quantized at a time


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
    if n > RTN_SLAB_ROWS:  # rows are independent: a slab at a time, the same bytes (a 151k-row head's
        #                    fp32 temporaries were 4 copies of its table at once)
        packed = np.empty((n, n_blocks, block_size * bits // 8), np.uint8)
        scales = np.empty((n, n_blocks), np.float32)
        for r0 in range(0, n, RTN_SLAB_ROWS):
            packed[r0:r0 + RTN_SLAB_ROWS], scales[r0:r0 + RTN_SLAB_ROWS] = quantize_rtn_sym(
                w[r0:r0 + RTN_SLAB_ROWS], block_size, bits)
        return packed, scales
    pad = n_blocks * block_size - k
    wb = np.pad(w.astype(np.float32), ((0, 0), (0, pad))).reshape(n, n_blocks, block_size)
    idx = np.abs(wb).argmax(axis=-1)[..., None]
    vmax = np.take_along_axis(wb, idx, axis=-1)  # [N, nb, 1], signed
    zero = 1 << (bits - 1)
    scale = _short_mantissa(vmax / -float(zero))
    inv = np.divide(1.0, scale, out=np.zeros_like(scale), where=scale != 0)
    q = np.clip(np.rint(wb * inv) + zero, 0, 2 * zero - 1).astype(np.uint8)
    packed = q if bits == 8 else q[..., 0::2] | (q[..., 1::2] << 4)
    return np.ascontiguousarray(packed), scale[..., 0].astype(np.float32)


def _short_mantissa(x: np.ndarray) -> np.ndarray:
    """fp32 rounded to 11 significant bits (fp16's precision, fp32's exponent range). Every
    (code - zero point) * scale is then an exact fp32 product, so onnxruntime's kernels, which
    dequantize in their own order (q * s - zp * s, per-block sums times s), compute with exactly
    the weights `dequantize` gives, and a parity check against them is tight (docs/design.md)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def dequantize(packed: np.ndarray, scales: np.ndarray, k: int, bits: int = 4) -> np.ndarray:
    """Inverse of `quantize_rtn_sym` (reference for tests): returns [N, K] fp32."""
    if bits == 8:
        q = packed
    else:
        lo, hi = packed & 0x0F, packed >> 4
        q = np.stack([lo, hi], axis=-1).reshape(packed.shape[0], packed.shape[1], -1)
    w = (q.astype(np.float32) - float(1 << (bits - 1))) * scales[..., None]
    return w.reshape(packed.shape[0], -1)[:, :k]


@dataclass(frozen=True)
class Source:
    """A GGUF tensor a weight's rows come from: its name, block type and row count, and the
    order its rows take (transformers' row permutation, e.g. llama's q/k), None as they are."""

    tensor: str
    type: str
    rows: int
    order: tuple[int, ...] | None = None

    def as_dict(self) -> dict:
        return {"tensor": self.tensor, "type": self.type, "rows": self.rows,
                "order": None if self.order is None else list(self.order)}


@dataclass(frozen=True)
class QuantWeight:
    """One [N, K] weight in MatMulNBits form: w[n, k] = scale * (code - zero_point) + min, per block
    of `block` input features (b = k // block). The optional per-block `mins` are what uint8 zero
    points cannot hold (GGUF's Q4_1 / Q*_K minimums); the graph adds them as a correction term,
    (block sums of x) @ mins.T, beside the MatMulNBits call.

    packed: uint8 [N, n_blocks, block * bits // 8] (4 bits: element 2j in the low nibble of byte j)
    scales: fp32 [N, n_blocks]; zero_points: uint8 [N, n_blocks] (unpacked); mins: fp32 [N, n_blocks] | None
    kind: where it came from ("rtn" or the GGUF tensor type, e.g. "Q4_K").
    source: the GGUF tensors its rows are, in order (an imported weight; () otherwise): what
    export/kernel_graph.py copies their blocks from."""

    bits: int
    block: int
    packed: np.ndarray
    scales: np.ndarray
    zero_points: np.ndarray
    mins: np.ndarray | None
    kind: str
    source: tuple[Source, ...] = ()

    @property
    def shape(self) -> tuple[int, int]:
        return self.scales.shape[0], self.scales.shape[1] * self.block

    def codes(self) -> np.ndarray:
        """uint8 [N, n_blocks, block]."""
        if self.bits == 8:
            return self.packed
        return np.stack([self.packed & 0x0F, self.packed >> 4], axis=-1).reshape(*self.scales.shape, self.block)

    def dequantize(self) -> np.ndarray:
        """[N, K] fp32, in gguf-py's order of operations (scale * (q - zp), then + min), so an
        imported tensor reproduces `gguf.quants.dequantize` bit for bit."""
        q = self.codes().astype(np.float32) - self.zero_points[..., None].astype(np.float32)
        w = self.scales[..., None] * q
        if self.mins is not None:
            w = w + self.mins[..., None]
        return w.reshape(self.shape)

    def packed_zero_points(self, explicit: bool = False) -> np.ndarray | None:
        """MatMulNBits' (and GatherBlockQuantized's) zero_points input (uint8 [N, ceil(n_blocks *
        bits / 8)], two per byte at 4 bits, low nibble first), or None where every one is the
        default 2^(bits-1) and not `explicit`."""
        zp = self.zero_points
        if not explicit and (zp == 1 << (self.bits - 1)).all():
            return None
        if self.bits == 8:
            return np.ascontiguousarray(zp)
        n, nb = zp.shape
        out = np.zeros((n, (nb + 1) // 2), np.uint8)
        out |= zp[:, 0::2]
        out[:, : nb // 2] |= zp[:, 1::2] << 4
        return out

    def rows(self, order: np.ndarray) -> QuantWeight:
        """The same weight with its output rows reordered (GGUF's permuted q/k rows)."""
        mins = None if self.mins is None else self.mins[order]
        source = ()
        if len(self.source) == 1:  # the tensor's rows, taken in the new order
            src = self.source[0]
            old = np.arange(src.rows) if src.order is None else np.asarray(src.order)
            source = (replace(src, order=tuple(int(i) for i in old[order])),)
        return replace(self, packed=self.packed[order], scales=self.scales[order],
                       zero_points=self.zero_points[order], mins=mins, source=source)


def fuse(parts: list[QuantWeight]) -> QuantWeight | None:
    """Several weights of one input stacked along N as one MatMulNBits weight, or None where
    their forms differ (bits or block); a part without mins gets zero mins (exact)."""
    first = parts[0]
    if any(p.bits != first.bits or p.block != first.block for p in parts):
        return None
    mins = None
    if any(p.mins is not None for p in parts):
        mins = np.concatenate([p.mins if p.mins is not None else np.zeros_like(p.scales) for p in parts])
    kinds = "+".join(sorted({p.kind for p in parts}))
    source = sum((p.source for p in parts), ()) if all(p.source for p in parts) else ()
    return QuantWeight(first.bits, first.block, np.concatenate([p.packed for p in parts]),
                       np.concatenate([p.scales for p in parts]), np.concatenate([p.zero_points for p in parts]),
                       mins, kinds, source)


def rtn_rows(read, n: int, k: int, block_size: int = 32, bits: int = 4) -> QuantWeight:
    """`rtn` of an [n, k] weight read a slab of rows at a time (`read(slice)` -> fp32 rows): the
    same bytes as `rtn` of the whole (rows are independent), without the whole fp32 weight."""
    n_blocks = -(-k // block_size)
    packed = np.empty((n, n_blocks, block_size * bits // 8), np.uint8)
    scales = np.empty((n, n_blocks), np.float32)
    for r0 in range(0, n, RTN_SLAB_ROWS):
        sl = slice(r0, min(n, r0 + RTN_SLAB_ROWS))
        packed[sl], scales[sl] = quantize_rtn_sym(read(sl), block_size, bits)
    zp = np.full(scales.shape, 1 << (bits - 1), np.uint8)
    return QuantWeight(bits, block_size, packed, scales, zp, None, "rtn")


def rtn(w: np.ndarray, block_size: int = 32, bits: int = 4) -> QuantWeight:
    """`quantize_rtn_sym` as a QuantWeight (implicit zero point 2^(bits-1), no mins)."""
    packed, scales = quantize_rtn_sym(w, block_size, bits)
    zp = np.full(scales.shape, 1 << (bits - 1), np.uint8)
    return QuantWeight(bits, block_size, packed, scales, zp, None, "rtn")
