"""A GGUF tensor's blocks -> QMatMulGGML's records (native/qmatmul_ggml.h): the same bits per
weight, rows interleaved 16 at a time in the AVX-512 VNNI operand order (pure NumPy).

A record holds 16 rows' blocks at one block index, 16 * type_size bytes: their fp16 fields side by
side, their scale bytes as ggml stores them (grouped so one 64-byte load holds a group for all 16
rows), and their codes in qmatmul.h's chunk order. Only Q8_0 changes a byte's value (int8 + 128,
so vpdpbusd takes it unsigned), and Q6_K / Q5_K move their high bits next to the low nibbles of
the same 32-block. Rows go in slabs: the largest temporary is a slab's codes, one byte a weight.
"""

from __future__ import annotations

import numpy as np

from .gguf_blocks import FORMS as DECODERS

OP = "QMatMulGGML"
TILE = 16
# type -> (elements of one row per block, bytes of one row's block)
TYPES = {"Q4_0": (32, 18), "Q8_0": (32, 34), "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210)}
SLAB = 2048  # rows repacked at a time


def record_bytes(type_name: str) -> int:
    return TILE * TYPES[type_name][1]


def _tiles(a: np.ndarray) -> np.ndarray:
    """[rows, s, ..., w] -> [rows/16, s, ..., 16, w]: the 16 rows of a tile side by side, innermost
    but for the w bytes each row keeps together."""
    t = a.reshape(a.shape[0] // TILE, TILE, *a.shape[1:])
    return np.moveaxis(t, 1, -2)


def _flat(a: np.ndarray) -> np.ndarray:
    return a.reshape(a.shape[0], a.shape[1], -1)


def _nibbles(codes: np.ndarray) -> np.ndarray:
    """4-bit codes [rows, s, B, 32] -> [rows, s, B, 4, 4]: byte (j, i) holds k = 4j + i in its low
    nibble and k = 4(j + 4) + i in its high nibble (4 bits of larger codes)."""
    c = (codes & 15).reshape(*codes.shape[:-1], 8, 4)
    return c[..., :4, :] | (c[..., 4:, :] << 4)


def _high_bits(codes: np.ndarray, shift: int, width: int) -> np.ndarray:
    """Bits above the nibble of codes [rows, s, B, 32] -> [rows, s, B, 32 // (8 // width) // 4, 4]:
    `width` bits of code k = 4v + i at bit width * (v % (8 // width)) of byte (v // (8 // width), i)."""
    return _pack(codes >> shift, width)


def _pack(h: np.ndarray, width: int) -> np.ndarray:
    """`width`-bit values h [..., 32] -> [..., 32 // (8 // width) // 4, 4] (`_high_bits`' bytes)."""
    per = 8 // width
    h = h.reshape(*h.shape[:-1], 8 // per, per, 4)
    out = h[..., 0, :].copy()
    for v in range(1, per):
        out |= h[..., v, :] << np.uint8(v * width)
    return out


def _pairs(lo: np.ndarray) -> np.ndarray:
    """4-bit codes [..., 32] in element order -> `_nibbles`' bytes [..., 4, 4]."""
    return (lo[..., :16] | (lo[..., 16:] << np.uint8(4))).reshape(*lo.shape[:-1], 4, 4)


def _q4_k_parts(b: np.ndarray) -> list[np.ndarray]:
    """Q4_K blocks [rows, s, 144] -> [`_nibbles` of the codes], straight from ggml's bytes: 32-block
    2j + h is the (h ? high : low) nibbles of qs[32j : 32j + 32], in element order."""
    qs = b[..., 16:144].reshape(*b.shape[:2], 4, 1, 32)
    lo = np.concatenate([qs & np.uint8(15), qs >> np.uint8(4)], axis=-2)  # [rows, s, j, h, 32]
    return [_pairs(lo.reshape(*b.shape[:2], 8, 32))]


def _q6_k_parts(b: np.ndarray) -> list[np.ndarray]:
    """Q6_K blocks [rows, s, 210] -> [`_nibbles`, `_high_bits(codes, 4, 2)`] of the codes, straight
    from ggml's bytes: 32-block 4n + 2t + p of half n has its low 4 bits in the (t ? high : low)
    nibbles of ql[64n + 32p : + 32] and its top 2 bits at bit 2(2t + p) of qh[32n : 32n + 32]."""
    rows, s = b.shape[:2]
    ql = b[..., :128].reshape(rows, s, 2, 1, 2, 32)  # [n, t, p, l]
    lo = np.concatenate([ql & np.uint8(15), ql >> np.uint8(4)], axis=3).reshape(rows, s, 8, 32)
    qh = b[..., 128:192].reshape(rows, s, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(4, 1)
    return [_pairs(lo), _pack(qh & np.uint8(3), 2).reshape(rows, s, 8, 2, 4)]


# types whose record parts are made from the blocks' bytes without decoding a code a byte
PARTS = {"Q4_K": _q4_k_parts, "Q6_K": _q6_k_parts}


def _codes(blocks: np.ndarray, type_name: str, rows: int, s: int) -> np.ndarray:
    """-> the codes part of each record, [rows/16, s, bytes]."""
    if type_name in PARTS:
        parts = PARTS[type_name](blocks.reshape(rows, s, -1))
        per_block = (rows // TILE, s, parts[0].shape[2], -1)
        return np.concatenate([_tiles(p).reshape(per_block) for p in parts], axis=-1).reshape(rows // TILE, s, -1)
    decode = DECODERS[type_name][0]
    codes = decode(blocks)[0].reshape(rows, s, -1, 32)  # element order, one code a byte
    if type_name == "Q8_0":
        return _flat(_tiles(codes.reshape(rows, s, 1, 8, 4)))
    per_block = (rows // TILE, s, codes.shape[2], -1)  # each part: bytes per 32-block
    parts = [_tiles(_nibbles(codes)).reshape(per_block)]
    if type_name in ("Q5_K", "Q6_K"):
        parts.append(_tiles(_high_bits(codes, 4, 1 if type_name == "Q5_K" else 2)).reshape(per_block))
    return np.concatenate(parts, axis=-1).reshape(rows // TILE, s, -1)


def _head(b: np.ndarray, type_name: str) -> list[np.ndarray]:
    """b: blocks [rows, s, type_size] -> the records' fields before the codes, each [rows/16, s, bytes]."""
    if type_name in ("Q4_0", "Q8_0"):
        return [_flat(_tiles(b[..., 0:2]))]
    if type_name == "Q6_K":
        return [_flat(_tiles(b[..., 208:210])), _flat(_tiles(b[..., 192:208, None]))]
    scales = b[..., 4:16].reshape(*b.shape[:2], 3, 4)  # Q4_K / Q5_K: 3 groups of 4 scale bytes
    return [_flat(_tiles(b[..., 0:2])), _flat(_tiles(b[..., 2:4])), _flat(_tiles(scales))]


def _slab(raw: np.ndarray, type_name: str, k: int) -> np.ndarray:
    per_block, type_size = TYPES[type_name]
    rows, s = raw.shape[0], k // per_block
    b = np.ascontiguousarray(raw, dtype=np.uint8).reshape(rows, s, type_size)
    return np.concatenate([*_head(b, type_name), _codes(b.reshape(-1, type_size), type_name, rows, s)], axis=-1)


def repack(raw: np.ndarray, type_name: str, n: int, k: int, order: np.ndarray | None = None) -> np.ndarray:
    """raw: a tensor's bytes as GGUFReader gives them (uint8, n rows of k elements each); order:
    the rows to take, in that order (transformers' row permutation), else all as they are.
    -> QMatMulGGML's blocks input, uint8 [n/16, k/super, 16 * type_size]."""
    if type_name not in TYPES:
        raise ValueError(f"QMatMulGGML reads {', '.join(TYPES)}, not {type_name}")
    per_block, type_size = TYPES[type_name]
    if n % TILE or k % per_block:
        raise ValueError(f"QMatMulGGML needs rows in multiples of {TILE} and {type_name} rows of a multiple of "
                         f"{per_block} elements, got {n} x {k}")
    raw = np.asarray(raw, dtype=np.uint8).reshape(n, k // per_block * type_size)
    out = np.empty((n // TILE, k // per_block, record_bytes(type_name)), np.uint8)
    for r0 in range(0, n, SLAB):
        rows = np.arange(r0, min(r0 + SLAB, n))
        slab = raw[rows if order is None else order[rows]]
        out[r0 // TILE:(r0 + len(rows)) // TILE] = _slab(slab, type_name, k)
    return out
