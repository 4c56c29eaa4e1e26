"""A GGUF file's own blocks -> the graph's weights (precision gguf), checked against transformers.

transformers loads a GGUF by dequantizing every block to fp32 (gguf.quants), with a per-architecture
processor that may reorder rows (llama's q/k permutation). This module finds, for each HF weight,
the GGUF tensor behind it (transformers' own name map), imports its blocks (export/gguf_blocks.py),
applies the same row order, and accepts the import only if it dequantizes to exactly the fp32
weights transformers holds: the exported target then computes with the GGUF's weights, and the
transformers model on those weights stays its parity reference.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import numpy as np

from .gguf_blocks import import_blocks
from .gguf_stream import drop_pages, processor_for
from .nbits import resolve
from .quantize import QuantWeight, Source

FALLBACK = "float MatMul over the dequantized weights (exact; no MatMulNBits form for this type)"


def _row_order(processor, name: str, n: int) -> np.ndarray | None:
    """The row permutation transformers' processor applies to tensor `name` ([n, K]), found by
    running it on row indices; None if it does anything but reorder rows."""
    idx = np.arange(n, dtype=np.float64)[:, None]
    out = processor.process(weights=idx, name=name, tensor_key_mapping={}, parsed_parameters={}).weights
    order = np.asarray(out).reshape(-1)
    if out.shape != idx.shape or not np.array_equal(np.sort(order), idx[:, 0]):
        return None
    return order.astype(np.int64)


class LazyImports(Mapping):
    """HF weight name -> its imported form, imported from the memory-mapped file on access
    (a streamed export holds one weight's blocks at a time; the last one is kept, as the
    embedding is read twice in a row)."""

    def __init__(self):
        self.plan: dict[str, tuple] = {}  # name -> (tensor, type, rows, cols, row order | None)
        self._last: tuple[str, QuantWeight] | None = None

    def __getitem__(self, name: str) -> QuantWeight:
        if self._last is not None and self._last[0] == name:
            return self._last[1]
        t, kind, n, k, order = self.plan[name]
        qw = replace(import_blocks(t.data, kind, n, k), source=(Source(t.name, kind, n),))
        qw = qw if order is None else qw.rows(order)
        drop_pages(t.data)
        self._last = (name, qw)
        return qw

    def __contains__(self, name) -> bool:  # (Mapping's own would import the tensor)
        return name in self.plan

    def __iter__(self):
        return iter(self.plan)

    def __len__(self) -> int:
        return len(self.plan)


SPOT_ROWS = 16  # rows of each tensor a streamed import checks against gguf-py's dequantization


def import_gguf(path: Path, model, weights, accuracy_level: int) -> tuple[Mapping[str, QuantWeight], dict]:
    """-> (HF weight name -> imported form, for every 2-D weight that has an exact one; the
    manifest's record of what was done per GGUF tensor type). weights: the model's fp32 weights
    (each import must dequantize to exactly them), or a streamed model's (export/gguf_stream.py
    GGUFWeights: the forms are then imported on access, `LazyImports`, and each tensor's first
    and last rows checked against gguf-py's dequantization, the values transformers loads)."""
    from transformers.modeling_gguf_pytorch_utils import get_gguf_hf_weights_map

    from .gguf_stream import GGUFWeights, gguf_reader

    streamed = isinstance(weights, GGUFWeights)
    reader = weights.reader if streamed else gguf_reader(path)
    processor = weights.processor if streamed else processor_for(reader, model.config)
    to_hf = weights.to_hf if streamed else get_gguf_hf_weights_map(model, processor)
    imported: dict[str, QuantWeight] | LazyImports = LazyImports() if streamed else {}
    counts, fallback, forms = Counter(), {}, {}
    for t in reader.tensors:
        hf = to_hf.get(t.name)
        kind = t.tensor_type.name
        shape = weights.shape(hf) if streamed and hf in weights else getattr(weights.get(hf), "shape", None)
        if shape is None or len(shape) != 2:  # norms, biases, rotary tables: read as fp32 by the graph
            counts[kind] += 1
            forms.setdefault(kind, "float (1-D tensors: norms, biases)")
            continue
        if streamed:
            qw, why = _plan_one(t, kind, shape, processor, imported, hf)
        else:
            qw, why = _import_one(t, kind, weights[hf], processor)
        counts[kind] += 1
        if qw is None:
            fallback.setdefault(kind, {"reason": why, "tensors": []})["tensors"].append(t.name)
            continue
        if not streamed:
            imported[hf] = qw
        forms[kind] = describe(qw, accuracy_level)
    types = {k: {"tensors": n, "form": forms.get(k, FALLBACK)} for k, n in sorted(counts.items())}
    report = {"method": "gguf", "accuracy_level": accuracy_level, "types": types, "fallback": fallback,
              "embedding": "Gather over the fp32 dequantized table (exact)"}
    return imported, report


EMBED = "model.embed_tokens.weight"
EMBED_TENSOR = "token_embd.weight"  # the token table's name in every llama.cpp GGUF


def import_embedding(path: Path, model, weights) -> Mapping[str, QuantWeight]:
    """{EMBED: the file's token table as its own blocks}, for a graph whose projections take
    another precision (int4 / int8 RTN) to gather its embedding from (emitter.embedding_form);
    {} where the table has no exact form. The same checks as `import_gguf`'s: a streamed model's
    (GGUFWeights) first and last rows against gguf-py's values, imported when the graph reads it;
    a loaded model's whole table against the fp32 one transformers holds."""
    from .gguf_stream import GGUFWeights, gguf_reader

    if EMBED not in weights:
        return {}
    if isinstance(weights, GGUFWeights):
        t, plan = weights.tensor(EMBED), LazyImports()
        qw, _ = _plan_one(t, t.tensor_type.name, weights.shape(EMBED), weights.processor, plan, EMBED)
        return plan if qw is not None else {}
    reader = gguf_reader(path)
    t = next((t for t in reader.tensors if t.name == EMBED_TENSOR), None)
    if t is None:
        return {}
    qw, _ = _import_one(t, t.tensor_type.name, weights[EMBED], processor_for(reader, model.config))
    return {EMBED: qw} if qw is not None else {}


def _import_one(t, kind: str, w: np.ndarray, processor) -> tuple[QuantWeight | None, str]:
    n, k = w.shape
    qw = import_blocks(t.data, kind, n, k)
    if qw is None:
        return None, f"{kind} has no exact MatMulNBits form"
    qw = replace(qw, source=(Source(t.name, kind, n),))
    order = _row_order(processor, t.name, n)
    if order is None:
        return None, "transformers changes its values on load"
    if not np.array_equal(order, np.arange(n)):
        qw = qw.rows(order)
    if not np.array_equal(qw.dequantize(), w):
        return None, "its blocks do not dequantize to the weights transformers loaded"
    return qw, ""


def _plan_one(t, kind: str, shape, processor, plan: LazyImports, hf: str) -> tuple[QuantWeight | None, str]:
    """A streamed tensor: its form planned (imported later, on access), its first and last
    SPOT_ROWS rows imported now and checked against gguf-py's dequantization. -> (the sample's
    form, for the manifest's words, or None; why not)."""
    from gguf import dequantize

    n, k = shape
    raw = np.asarray(t.data).reshape(n, -1)
    for rows in (raw[:SPOT_ROWS], raw[-SPOT_ROWS:]):
        qw = import_blocks(rows, kind, len(rows), k)
        if qw is None:
            return None, f"{kind} has no exact MatMulNBits form"
        if not np.array_equal(qw.dequantize(), dequantize(rows, t.tensor_type).reshape(len(rows), k)):
            return None, "its blocks do not dequantize to gguf-py's values"
    order = _row_order(processor, t.name, n)
    if order is None:
        return None, "transformers changes its values on load"
    plan.plan[hf] = (t, kind, n, k, None if np.array_equal(order, np.arange(n)) else order)
    return qw, ""


def describe(qw: QuantWeight, level: int) -> str:
    """What a weight of this form becomes in a graph at `level` (the manifest's words)."""
    if isinstance(resolve(qw, "gguf", qw.block, level), np.ndarray):
        return f"float MatMul over the exact dequantized weights ({qw.bits}-bit MatMulNBits needs accuracy_level 4)"
    zp = int(qw.zero_points.flat[0])
    mins = ", per-block mins as (block sums of x) @ mins" if qw.mins is not None else ""
    return f"MatMulNBits {qw.bits}-bit, block {qw.block}, zero point {zp}{mins} (exact weights)"


def fallback_message(report: dict) -> str:
    """One line per GGUF type with no exact form ("" if none)."""
    lines = [f"{kind}: {len(v['tensors'])} tensor(s) ({', '.join(v['tensors'][:3])}{', ...' if len(v['tensors']) > 3 else ''}) "
             f"kept as {FALLBACK}: {v['reason']}" for kind, v in report.get("fallback", {}).items()]
    return "\n".join(lines)
