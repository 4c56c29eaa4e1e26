"""What one call of a bundle's target streams from memory, by weight form (docs/benchmarks.md §23).

A decode step reads every projection's weights once, whatever its width: at one token that read
is the step's floor. For each MatMulNBits this counts its codes, its fp32 scales, and the fp32
per-block sum onnxruntime's int8 path (accuracy_level 4) keeps beside every block in its packed
form (MLAS `BlkSum`: one float per block, written at prepacking from the scales and zero
points); for a Q4_K weight also its fp32 mins ([K / 32, N], `export/nbits.py`); for a float
MatMul its fp32 matrix. Embedding tables are gathered row by row, so they are listed apart and
not counted. A GGUF file's own bits per weight are given beside it for comparison.

With --kernels, the kernel graph a load runs on an AVX-512 CPU (export/kernel_graph.py): QMatMul4 /
QMatMul8 count their codes and fp32 scales and mins, QMatMulGGML the GGUF blocks it reads.

    python tools/weight_bytes.py engines/coder [--model draft] [--kernels]
"""

from __future__ import annotations

import argparse
import collections
import math
from pathlib import Path

import onnx
from onnx import helper

from specrt.runtime.bundle.manifest import load_manifest

# the GGUF block type each exact MatMulNBits form comes from (export/gguf_blocks.py)
GGUF_OF = {"MatMulNBits 4-bit, block 32": "Q4_K", "MatMulNBits 8-bit, block 16": "Q6_K", "MatMulNBits 8-bit, block 32": "Q8_0"}
GGUF_OF |= {"QMatMul4 (4-bit, block 32)": "Q4_K", "QMatMul8 (8-bit, block 16)": "Q6_K",
            "QMatMul8 (8-bit, block 32)": "Q8_0"}
GGUF_BITS = {"Q4_K": 4.5, "Q6_K": 6.5625, "Q8_0": 8.5, "Q4_0": 4.5, "Q4_1": 5.0, "Q5_0": 5.5, "Q5_1": 6.0, "Q5_K": 5.5,
             "Q2_K": 2.625, "Q3_K": 3.4375, "F32": 32.0}
GGUF_OF |= {f"QMatMulGGML {t}": t for t in ("Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K")}


def nbytes(t: onnx.TensorProto) -> int:
    """An initializer's size from its header (its data may be external and unread)."""
    return math.prod(t.dims) * helper.tensor_dtype_to_np_dtype(t.data_type).itemsize


def _kernel_op(node, inits: dict, forms) -> None:
    """specrt's operators (native/): their initializers are what they stream."""
    a = {x.name: helper.get_attribute_value(x) for x in node.attribute}
    n, k = a["N"], a["K"]
    if node.op_type == "QMatMulGGML":
        f = forms[f"QMatMulGGML {a['type'].decode()}"]
        f["blocks (the GGUF's own)"] += nbytes(inits[node.input[1]])
    else:
        bits = 4 if node.op_type == "QMatMul4" else 8
        f = forms[f"{node.op_type} ({bits}-bit, block {a.get('block_size', 32)})"]
        for part, name in zip(("codes", "scales (fp32)", "mins (fp32)"), node.input[1:4], strict=False):
            if name in inits:
                f[part] += nbytes(inits[name])
    f["weights"] += n * k


def account(graph_path: Path) -> tuple[dict[str, dict[str, float]], dict[str, int]]:
    """-> (form -> {"weights": count, part: bytes, ...} streamed per call, gathered tables' bytes)."""
    m = onnx.load(str(graph_path), load_external_data=False)
    inits = {i.name: i for i in m.graph.initializer}
    forms: dict[str, dict[str, float]] = collections.defaultdict(lambda: collections.defaultdict(float))
    gathered: dict[str, int] = collections.Counter()
    last = ""  # the MatMulNBits a mins MatMul corrects (emitted right after it)
    for node in m.graph.node:
        if node.op_type == "MatMulNBits":
            bits, block, n, k = (helper.get_node_attr_value(node, a) for a in ("bits", "block_size", "N", "K"))
            last = f"MatMulNBits {bits}-bit, block {block}"
            f = forms[last]
            f["weights"] += n * k
            f["codes"] += n * k * bits / 8
            f["scales (fp32)"] += 4 * n * k / block
            if helper.get_node_attr_value(node, "accuracy_level") == 4:
                f["block sums (fp32, packed)"] += 4 * n * k / block
        elif node.op_type in ("QMatMul4", "QMatMul8", "QMatMulGGML"):
            _kernel_op(node, inits, forms)
        elif node.op_type in ("MatMul", "Gemm"):  # Gemm: a float LM head over the tied embedding table
            for name in node.input:
                if name in inits and "mins" in name:
                    forms[last]["mins (fp32)"] += nbytes(inits[name])
                elif name in inits and len(inits[name].dims) == 2:
                    forms["float MatMul"]["fp32 matrix"] += nbytes(inits[name])
                    forms["float MatMul"]["weights"] += nbytes(inits[name]) / 4
        elif node.op_type in ("Gather", "GatherBlockQuantized"):
            for name in node.input:
                if name in inits:
                    gathered[node.op_type] += nbytes(inits[name])
    return forms, dict(gathered)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--model", choices=("target", "draft"), default="target")
    ap.add_argument("--kernels", action="store_true", help="the kernel graph (specrt's operators)")
    a = ap.parse_args()
    manifest = load_manifest(a.bundle)
    e = getattr(manifest, a.model)
    if e is None:
        raise SystemExit(f"{a.bundle} has no {a.model} model")
    if a.kernels and not e.packed.kernels:
        raise SystemExit(f"{a.bundle}'s {a.model} has no kernel graphs (python -m specrt.export.kernel_graph)")
    if not a.kernels and e.portable_missing:
        raise SystemExit(f"{a.bundle}'s {a.model} holds only its kernel graphs: pass --kernels (or add the portable "
                         f"graphs: python -m specrt.export.portable {a.bundle})")
    graph = e.packed.kernel_file(max(e.packed.lanes)) if a.kernels else e.graph
    forms, gathered = account(a.bundle / graph)
    mib = 2 ** 20
    total = weights = 0.0
    print(f"{a.bundle} {a.model} ({e.precision}, {graph}): bytes one call streams\n")
    print("| form | weights (M) | part | MiB | bits per weight |")
    print("| --- | --- | --- | --- | --- |")
    for form, parts in forms.items():
        w = parts.get("weights", 0.0)
        weights += w
        for part, b in parts.items():
            if part == "weights":
                continue
            total += b
            per = f"{8 * b / w:.2f}" if w else "-"
            print(f"| {form} | {w / 1e6:.0f} | {part} | {b / mib:.1f} | {per} |")
    print(f"| **all** | {weights / 1e6:.0f} | | **{total / mib:.1f}** | {8 * total / max(weights, 1):.2f} |")
    for op, b in gathered.items():
        print(f"\n({op} table: {b / mib:.1f} MiB, a row per token; counted above only where an LM head multiplies by it)")
    q = (e.quantization or {}).get("types", {})
    if q:
        own = sum(parts.get("weights", 0.0) * GGUF_BITS[GGUF_OF[f]] / 8 for f, parts in forms.items() if f in GGUF_OF)
        print(f"\nThe same weights in the GGUF file's own blocks: {own / mib:.1f} MiB (a call here streams {total / own:.2f}x that)")
        print("The GGUF file's own types: " + ", ".join(f"{t} ({v['tensors']} tensors) {GGUF_BITS.get(t, '?')} bits "
                                                      f"per weight" for t, v in q.items()))


if __name__ == "__main__":
    main()
