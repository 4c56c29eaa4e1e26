"""Weight-only quantized projections: which form each weight takes, and its MatMulNBits nodes.

A weight reaches the graph as fp32 NumPy (HF layout [out, in]) or as a `QuantWeight` (imported
from GGUF blocks, export/gguf_blocks.py). `resolve` decides its form:
  - precision int4 / int8: fp32 weights get the RTN recipe (export/quantize.py);
  - precision gguf: imported weights keep their own form; the rest (no exact form) stay float;
  - precision fp32 (an LM head kept float under a quantized body): float, exact values;
  - an 8-bit form at accuracy_level 0 becomes a float MatMul over its exact dequantized values:
    onnxruntime 1.32 has no fp32-compute 8-bit kernel (it dequantizes all of B on every call,
    ~20x slower than the fp32 MatMul), so the same weights run faster as float.
`emit` writes one MatMulNBits (+ the block-sum correction for per-block mins); `gather`, the rows
of a block-quantized embedding (GatherBlockQuantized + the same mins).
"""

from __future__ import annotations

import json

import numpy as np

from .quantize import QuantWeight, rtn

MS = "com.microsoft"
QUANTIZED = {"int4": 4, "int8": 8}  # RTN precisions -> MatMulNBits bits
WEIGHT_ONLY = (*QUANTIZED, "gguf")  # precisions whose activations stay fp32


def resolve(W: np.ndarray | QuantWeight, precision: str, block: int, level: int) -> np.ndarray | QuantWeight:
    """-> the form `W` takes in a graph of `precision` at `accuracy_level` `level`."""
    if isinstance(W, np.ndarray):
        if precision not in QUANTIZED:
            return W
        W = rtn(W, block, QUANTIZED[precision])
    return W.dequantize() if runs_as_float(W, precision, level) else W


def runs_as_float(W: QuantWeight, precision: str, level: int) -> bool:
    """Whether `resolve` turns this block-quantized weight into a float MatMul over its exact
    values: asked to stay float (an LM head at fp32/fp16), or 8-bit at accuracy_level < 4."""
    return precision in ("fp32", "fp16") or (W.bits == 8 and level < 4)


def emit(g, x: str, hint: str, qw: QuantWeight, bias: np.ndarray | None, level: int, sums: dict) -> str:
    """x [B, T, K] @ W.T (+ bias) for a MatMulNBits weight. `sums`: per (x, block) the block sums
    of x [B, T, K / block], shared by every projection of the same input."""
    n, k = qw.shape
    zp = qw.packed_zero_points()
    ins = [x, g.const(hint + f"_q{qw.bits}", qw.packed), g.const(hint + "_scales", qw.scales),
           g.const(hint + "_zp", zp) if zp is not None else ""]
    if bias is not None:
        ins += ["", g.const(hint + "_bias", bias.astype(np.float32))]
    while ins[-1] == "":
        ins.pop()
    y = g.op("MatMulNBits", ins, hint, domain=MS, K=k, N=n, bits=qw.bits, block_size=qw.block,
             accuracy_level=level, doc_string=source_note(qw))
    if qw.mins is None:
        return y
    # w = scale * (q - zp) + min: the min part is sum_b (sum of x over block b) * min[n, b]
    key = (x, qw.block)
    if key not in sums:
        blocks = g.op("Reshape", [x, g.i64(0, 0, k // qw.block, qw.block)], hint + "_blocks")
        sums[key] = g.op("ReduceSum", [blocks, g.i64(-1)], hint + "_blocksum", keepdims=0)
    corr = g.op("MatMul", [sums[key], g.const(hint + "_minsT", np.ascontiguousarray(qw.mins.T))], hint + "_mins")
    return g.op("Add", [y, corr], hint + "_min")


def source_note(qw: QuantWeight) -> str | None:
    """The GGUF tensors a weight's rows are, as JSON for its node's doc_string ({"gguf": [...]},
    export/quantize.py `Source`): export/kernel_graph.py reads their blocks from the file."""
    return json.dumps({"gguf": [s.as_dict() for s in qw.source]}) if qw.source else None


def gather(g, ids: str, hint: str, qw: QuantWeight) -> str:
    """Rows `ids` [B, T] of a block-quantized table [N, K] -> [B, T, K] fp32: GatherBlockQuantized
    computes scale * (code - zero point) per block (bit for bit NumPy's product), then the
    per-block min is added: gguf-py's order, so the rows are the dequantized table's values
    without holding that table (an embedding; docs/design.md, "Quantized targets")."""
    n, nb = qw.scales.shape
    ins = [g.const(hint + f"_q{qw.bits}", qw.packed.reshape(n, -1)), ids, g.const(hint + "_scales", qw.scales),
           g.const(hint + "_zp", qw.packed_zero_points(explicit=True))]
    y = g.op("GatherBlockQuantized", ins, hint, domain=MS, bits=qw.bits, block_size=qw.block, gather_axis=0,
             quantize_axis=1)
    if qw.mins is None:
        return y
    mins = g.op("Gather", [g.const(hint + "_mins", qw.mins), ids], hint + "_mins")  # [B, T, nb]
    blocks = g.op("Reshape", [y, g.i64(0, 0, nb, qw.block)], hint + "_blocks")
    y = g.op("Add", [blocks, g.op("Unsqueeze", [mins, g.i64(-1)])], hint + "_min")
    return g.op("Reshape", [y, g.i64(0, 0, nb * qw.block)], hint + "_rows")
