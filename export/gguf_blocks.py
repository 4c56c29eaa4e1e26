"""GGUF tensor blocks -> MatMulNBits inputs, without re-rounding (pure NumPy).

Every supported type stores w = scale * (q - zp) + min per block, with q an unsigned code:

  type   codes    MatMulNBits        block  zero point  scale    min
  Q2_K   2 bits   4-bit              16     0           d·sc     -dmin·m
  Q3_K   3 bits   4-bit              16     4           d·sc     -
  Q4_0   4 bits   4-bit              32     8           d        -
  Q4_1   4 bits   4-bit              32     0           d        m
  Q4_K   4 bits   4-bit              32     0           d·sc     -dmin·m
  Q5_0   5 bits   8-bit              32     16          d        -
  Q5_1   5 bits   8-bit              32     0           d        m
  Q5_K   5 bits   8-bit              32     0           d·sc     -dmin·m
  Q6_K   6 bits   8-bit              16     32          d·sc     -
  Q8_0   int8     8-bit (q + 128)    32     128         d        -

d, m, dmin are fp16 and sc, m small integers, so every scale and min is an exact fp32 product and
`QuantWeight.dequantize` reproduces `gguf.quants.dequantize` bit for bit (tests/export/
test_gguf_blocks.py). Other types (the IQ and TQ families, MXFP4, ...) have no form
here: `import_tensor` returns None for them and the caller falls back (docs/design.md).
"""

from __future__ import annotations

import numpy as np

from .quantize import QuantWeight

QK_K = 256


def _f16(b: np.ndarray) -> np.ndarray:
    """[n, 2] uint8 -> [n, 1] fp32."""
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def _nibbles_split(qs: np.ndarray, half: int) -> np.ndarray:
    """ggml's layout: byte j holds element j (low nibble) and element j + half (high nibble),
    per group of `half` bytes. [n, g * half] -> [n, g * 2 * half] codes in element order."""
    n = qs.shape[0]
    q = qs.reshape(n, -1, 1, half) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    return (q & 0x0F).reshape(n, -1)


def _high_bits(qh: np.ndarray, n_elems: int) -> np.ndarray:
    """Q5_0/Q5_1: bit i of a little-endian uint32 is element i's fifth bit. [n, 4] -> [n, 32]."""
    bits = np.ascontiguousarray(qh).view(np.uint32).reshape(-1, 1) >> np.arange(n_elems, dtype=np.uint32)
    return (bits & 1).astype(np.uint8)


def _k_scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K's 12 bytes of 6-bit (scale, min) pairs for 8 sub-blocks -> two [n, 8] uint8."""
    n = scales.shape[0]
    d, m, m_d = np.split(scales.reshape(n, 3, 4), 3, axis=-2)
    sc = np.concatenate([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc.reshape(n, 8), mn.reshape(n, 8)


# Each decoder: blocks uint8 [n, type_size] -> (codes uint8 [n, sub, sub_size], scales fp32
# [n, sub], mins fp32 [n, sub] | None) with w = scale * (code - ZERO[type]) + min.
def _q4_0(b):
    return _nibbles_split(b[:, 2:], 16)[:, None], _f16(b[:, :2]), None


def _q4_1(b):
    return _nibbles_split(b[:, 4:], 16)[:, None], _f16(b[:, :2]), _f16(b[:, 2:4])


def _q5_0(b):
    q = _nibbles_split(b[:, 6:], 16) | (_high_bits(b[:, 2:6], 32) << 4)
    return q[:, None], _f16(b[:, :2]), None


def _q5_1(b):
    q = _nibbles_split(b[:, 8:], 16) | (_high_bits(b[:, 4:8], 32) << 4)
    return q[:, None], _f16(b[:, :2]), _f16(b[:, 2:4])


def _q8_0(b):
    return (b[:, 2:] ^ 0x80)[:, None], _f16(b[:, :2]), None  # int8 x -> uint8 x + 128


def _k_scales(b):
    """Q4_K / Q5_K: d·sc and -(dmin·m) per 32-element sub-block, each [n, 8]."""
    sc, mn = _k_scale_min(b[:, 4:16])
    return _f16(b[:, :2]) * sc.astype(np.float32), -(_f16(b[:, 2:4]) * mn.astype(np.float32))


def _q4_k(b):
    scales, mins = _k_scales(b)
    return _nibbles_split(b[:, 16:144], 32).reshape(-1, 8, 32), scales, mins


def _q5_k(b):
    scales, mins = _k_scales(b)
    qh = b[:, 16:48].reshape(-1, 1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)
    q = _nibbles_split(b[:, 48:176], 32) | ((qh & 1).reshape(-1, QK_K) << 4)
    return q.reshape(-1, 8, 32), scales, mins


def _q6_k(b):
    n = b.shape[0]
    ql = _nibbles_split(b[:, :128], 64).reshape(n, -1, 32)
    qh = b[:, 128:192].reshape(n, -1, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    q = ql | ((qh & 0x03).reshape(n, -1, 32) << 4)
    sc = np.ascontiguousarray(b[:, 192:208]).view(np.int8).astype(np.float32)
    return q.reshape(n, 16, 16), _f16(b[:, 208:210]) * sc, None


def _q2_k(b):
    n = b.shape[0]
    sc = b[:, :16]
    q = (b[:, 16:80].reshape(n, -1, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 3
    d, dmin = _f16(b[:, 80:82]), _f16(b[:, 82:84])
    return q.reshape(n, 16, 16), d * (sc & 0x0F).astype(np.float32), -(dmin * (sc >> 4).astype(np.float32))


def _q3_k(b):
    n = b.shape[0]
    lo = (b[:, 96:104].reshape(n, 1, 8) >> np.array([0, 4], np.uint8).reshape(1, 2, 1)).reshape(n, 16)
    hi = (b[:, 104:108].reshape(n, 1, 4) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 4, 1)).reshape(n, 16)
    sc = (((lo & 0x0F) | ((hi & 0x03) << 4)).astype(np.int8) - np.int8(32)).astype(np.float32)
    ql = (b[:, 32:96].reshape(n, -1, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 3
    qh = (b[:, :32].reshape(n, -1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)) & 1
    # ggml: q = ql - 4 where the mask bit is 0, so code = q + 4 = ql + 4 * bit (0..7), zero point 4
    q = ql.reshape(n, 16, 16) + (qh.reshape(n, 16, 16) << 2)
    return q, _f16(b[:, 108:110]) * sc, None


# type name -> (decoder, bytes per block, elements per block, MatMulNBits bits, zero point)
FORMS = {
    "Q4_0": (_q4_0, 18, 32, 4, 8),
    "Q4_1": (_q4_1, 20, 32, 4, 0),
    "Q2_K": (_q2_k, 84, QK_K, 4, 0),
    "Q3_K": (_q3_k, 110, QK_K, 4, 4),
    "Q4_K": (_q4_k, 144, QK_K, 4, 0),
    "Q5_0": (_q5_0, 22, 32, 8, 16),
    "Q5_1": (_q5_1, 24, 32, 8, 0),
    "Q5_K": (_q5_k, 176, QK_K, 8, 0),
    "Q6_K": (_q6_k, 210, QK_K, 8, 32),
    "Q8_0": (_q8_0, 34, 32, 8, 128),
}


SLAB_WEIGHTS = 1 << 22  # weights decoded at a time (whole rows)


def import_blocks(raw: np.ndarray, type_name: str, n: int, k: int) -> QuantWeight | None:
    """raw: the tensor's bytes as GGUFReader gives them (uint8, n rows of k elements each, rows
    in HF's [out, in] order). -> its exact MatMulNBits form, or None for a type with none."""
    form = FORMS.get(type_name)
    if form is None:
        return None
    decode, type_size, per_block, bits, zp = form
    rows = np.ascontiguousarray(raw, dtype=np.uint8).reshape(n, (k // per_block) * type_size)
    step = max(1, SLAB_WEIGHTS // k)  # the decoders' temporaries take up to 4 bytes a weight
    packed = scales = mins = None
    for r0 in range(0, n, step):
        m = min(step, n - r0)
        codes, sc, mn = decode(rows[r0:r0 + m].reshape(m * (k // per_block), type_size))
        sub = codes.shape[-1]  # MatMulNBits block: the sub-block that owns one scale
        codes = codes.reshape(m, k // sub, sub)
        pk = codes if bits == 8 else codes[..., 0::2] | (codes[..., 1::2] << 4)
        if packed is None:
            packed = np.empty((n, *pk.shape[1:]), np.uint8)
            scales = np.empty((n, k // sub), np.float32)
            mins = None if mn is None else np.empty((n, k // sub), np.float32)
        packed[r0:r0 + m] = pk
        scales[r0:r0 + m] = sc.reshape(m, k // sub)
        if mins is not None:
            mins[r0:r0 + m] = mn.reshape(m, k // sub)
    zps = np.full(scales.shape, zp, np.uint8)
    return QuantWeight(bits, packed.shape[-1] * 8 // bits, packed, scales, zps, mins, type_name)
