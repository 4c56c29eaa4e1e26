"""A packed graph on specrt's own kernels (runtime/kernels, docs/design.md "Our own kernel"):
its block-quantized projections here, its attention in export/kernel_attention.py.

Every MatMulNBits at accuracy level 4 (int8 activations) of 4 bits in blocks of 32 (a GGUF's Q4_K,
Q4_0, Q4_1) or 8 bits in blocks of 16 or 32 (Q6_K, Q5_K, Q8_0, ...; export/nbits.py), with its
per-block-min correction where it has one (Reshape -> ReduceSum -> MatMul(minsT) -> Add),
becomes one QMatMul4 / QMatMul8 over the same codes, scales and mins (zero points folded into
the mins: scale * (q - zp) + min) -- or, where it was imported from GGUF tensors of one type
QMatMulGGML reads (Q4_0, Q8_0, Q4_K, Q5_K, Q6_K) and that file is given, one QMatMulGGML over
those tensors' own blocks, copied from the file tensor by tensor (export/kernel_blocks.py; a
call then streams the GGUF's bits per weight). Other nodes and initializers stay as they are, external data
references included; the new initializers go into one data file (`kernels.onnx.data`) that every
rewritten graph of the model shares. The graphs sit beside the packed ones (`packed{lanes}.kernels.onnx`):
a runtime without the kernel library runs those.

    python -m specrt.export.kernel_graph BUNDLE [TARGET_GGUF]
        adds them to a bundle that has packed graphs (its target's and its draft model's); with
        the GGUF its target was exported from, the target's projections read that file's blocks
"""

from __future__ import annotations

import json
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from specrt.runtime.bundle.manifest import load_manifest
from specrt.runtime.kernels import DOMAIN
from specrt.runtime.kernels.layout import FORMS, QBLOCK, TILE, pack

from .gguf_stream import drop_pages
from .kernel_attention import fuse_attention
from .kernel_blocks import OP as BLOCK_OP
from .kernel_blocks import TYPES as BLOCK_TYPES
from .kernel_blocks import record_bytes, repack

DATA = "kernels.onnx.data"

# Operators whose output rows are each computed the same way at any call width, one row included:
# specrt's (native/: the same bits for any M, tested) and onnxruntime's per-row and elementwise
# ones. Not here: MatMul / Gemm / MatMulNBits (MLAS takes other kernels at M = 1) and
# GroupQueryAttention (its one-token decode path): a graph with one needs a filler after a lone
# token (docs/design.md "One-token calls of int8-activation graphs").
ROW_EXACT = {"QMatMul4", "QMatMul8", BLOCK_OP, "PackedAttention", "SkipSimplifiedLayerNormalization",
             "SimplifiedLayerNormalization", "Mul", "Add", "Sigmoid", "Split", "Concat", "Gather",
             "GatherBlockQuantized", "Reshape", "Shape", "Unsqueeze", "Identity", "Expand", "Slice",
             "ScatterElements", "Cast"}


def one_row(model: onnx.ModelProto) -> bool:
    """Whether every node of `model` is one of ROW_EXACT's: then a one-token call computes its
    row as any wider call does, and a lone token runs as one row."""
    return all(n.op_type in ROW_EXACT for n in model.graph.node)


def _attrs(n) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in n.attribute}


def _nibbles(b: np.ndarray) -> np.ndarray:
    """MatMulNBits bytes (element 2i in the low nibble, 2i + 1 in the high) -> one code per byte."""
    return np.stack([b & 15, b >> 4], axis=-1).reshape(*b.shape[:-1], -1)


class _Graph:
    """A graph's nodes indexed for the rewrite, its initializers' values read on demand."""

    def __init__(self, g: onnx.GraphProto, base: Path):
        self.g, self.base = g, base
        self.inits = {t.name: t for t in g.initializer}
        self.producer = {o: n for n in g.node for o in n.output}
        self.consumers: dict[str, list] = {}
        for n in g.node:
            for i in n.input:
                self.consumers.setdefault(i, []).append(n)

    def value(self, name: str) -> np.ndarray:
        return numpy_helper.to_array(self.inits[name], base_dir=str(self.base))

    def mins_correction(self, n):
        """-> (Add, MatMul) of the per-block mins' correction that follows MatMulNBits `n`, or None."""
        add = self.consumers.get(n.output[0], [])
        if len(add) != 1 or add[0].op_type != "Add" or add[0].input[0] != n.output[0]:
            return None
        mm = self.producer.get(add[0].input[1])
        return (add[0], mm) if mm is not None and mm.op_type == "MatMul" and mm.input[1] in self.inits else None


def _form(n) -> tuple[int, int] | None:
    """(bits, block) where `n` is a MatMulNBits the operators take, else None."""
    a = _attrs(n)
    if n.op_type != "MatMulNBits" or (a.get("bits"), a.get("block_size")) not in FORMS:
        return None
    if a.get("accuracy_level") != 4 or a["K"] % QBLOCK or a["N"] % TILE:  # level 0 computes in fp32
        return None
    return a["bits"], a["block_size"]


def _convert(gr: _Graph, n, bits: int, block: int, mm) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """MatMulNBits `n`'s weights (and its correction MatMul `mm`'s mins) -> the operator's."""
    a = _attrs(n)
    K, N = a["K"], a["N"]
    nb = K // block
    unpack = _nibbles if bits == 4 else (lambda b: b)
    codes = unpack(gr.value(n.input[1]).reshape(N, nb, block * bits // 8)).reshape(N, K)
    scale = gr.value(n.input[2]).reshape(N, nb).astype(np.float32)
    if len(n.input) > 3 and n.input[3]:
        zp = unpack(gr.value(n.input[3]).reshape(N, -1))[:, :nb].astype(np.float32)
    else:  # MatMulNBits' default zero point: the middle of the codes
        zp = np.full((N, nb), 1 << (bits - 1), np.float32)
    mins = np.ascontiguousarray(gr.value(mm.input[1]).T).astype(np.float32) if mm is not None else 0
    return pack(codes, scale, (mins - scale * zp).astype(np.float32), bits, block)


def _gguf_parts(n, tensors: dict | None) -> list[dict] | None:
    """The GGUF tensors MatMulNBits `n` was imported from (its doc_string, export/nbits.py
    `source_note`) where QMatMulGGML reads them: all of one block type it takes, rows in tiles
    of 16, and the file's tensors at hand. Else None (the node gets QMatMul4 / QMatMul8)."""
    if tensors is None or not n.doc_string:
        return None
    try:
        parts = json.loads(n.doc_string).get("gguf")
    except (ValueError, AttributeError):
        return None
    if not parts or len({p["type"] for p in parts}) != 1 or parts[0]["type"] not in BLOCK_TYPES:
        return None
    a = _attrs(n)
    if a["K"] % BLOCK_TYPES[parts[0]["type"]][0] or sum(p["rows"] for p in parts) != a["N"]:
        return None
    if any(p["rows"] % TILE or p["tensor"] not in tensors for p in parts):
        return None
    return parts


class _Blocks:
    """QMatMulGGML's blocks input for GGUF tensors `parts` (stacked, rows in the graph's order),
    repacked from the memory-mapped file only when `write_data` writes it: the export holds one
    tensor's blocks at a time. Shape, dtype and size are known beforehand (the data's layout)."""

    dtype = np.dtype(np.uint8)

    def __init__(self, tensors: dict, parts: list[dict], k: int):
        self.tensors, self.parts, self.k = tensors, parts, k
        per_block, _ = BLOCK_TYPES[parts[0]["type"]]
        rows = sum(p["rows"] for p in parts)
        self.shape = (rows // TILE, k // per_block, record_bytes(parts[0]["type"]))
        self.nbytes = int(np.prod(self.shape))

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = np.concatenate([repack(self.tensors[p["tensor"]].data, p["type"], p["rows"], self.k,
                                     None if p["order"] is None else np.asarray(p["order"])) for p in self.parts])
        for p in self.parts:  # the file's pages read so far leave this process's resident memory
            drop_pages(self.tensors[p["tensor"]].data)
        return out


def _q4_0_weight(gr: _Graph, n, form: tuple[int, int], corr) -> np.ndarray | None:
    """MatMulNBits `n`'s weights as ggml Q4_0 blocks ([N, K/32, 18]: fp16 d, then byte j holding
    codes j and j + 16) where they are exactly those: 4 bits in blocks of 32, the default zero
    point (8), no mins, every scale an fp16 (export/quantize.py's RTN scales have fp16's mantissa;
    one below fp16's normal range is not). Else None. d * (q - 8) is then the same weight as
    scale * q + min, in 4.5 bits instead of QMatMul4's 6."""
    a = _attrs(n)
    if form != (4, 32) or corr is not None or (len(n.input) > 3 and n.input[3]):
        return None
    N, K = a["N"], a["K"]
    scale = gr.value(n.input[2]).reshape(N, K // 32).astype(np.float32)
    d = scale.astype(np.float16)
    if not np.array_equal(d.astype(np.float32), scale):
        return None
    codes = _nibbles(gr.value(n.input[1]).reshape(N, K // 32, 16))  # [N, nb, 32], element order
    qs = codes[..., :16] | (codes[..., 16:] << np.uint8(4))
    return np.concatenate([d[..., None].view(np.uint8), qs], axis=-1)


def _prune(nodes: list, outputs: set[str]) -> list:
    """Drop what only removed nodes read: the block sums (Reshape -> ReduceSum) of the mins'
    corrections, the lanes' GQA scalars (Slice -> Add -> Squeeze of lane_seqlens)."""
    while True:
        used = {i for n in nodes for i in n.input} | outputs
        dead = {id(n) for n in nodes if not any(o in used for o in n.output)}
        if not dead:
            return nodes
        nodes = [n for n in nodes if id(n) not in dead]


def _operator(gr: _Graph, n, form: tuple[int, int], corr, arrays: dict, tensors: dict | None, q4_0: bool):
    """The specrt operator in place of MatMulNBits `n` (and its mins' correction `corr`), its
    new initializers put in `arrays`: QMatMulGGML over the GGUF's own blocks where `_gguf_parts`
    finds them, over Q4_0 blocks of its own codes where `q4_0` and `_q4_0_weight` allow, else
    QMatMul4 / QMatMul8 over its converted codes, scales and mins."""
    key, a = n.input[1], _attrs(n)
    out = (corr[0] if corr else n).output[0]
    bias = [n.input[5]] if len(n.input) > 5 and n.input[5] else []
    parts = _gguf_parts(n, tensors)
    if parts is not None:
        if key + "_gg" not in arrays:
            arrays[key + "_gg"] = _Blocks(tensors, parts, a["K"])
        return helper.make_node(BLOCK_OP, [n.input[0], key + "_gg", *bias], [out], name=n.name + "_g",
                                doc_string=n.doc_string, domain=DOMAIN, K=a["K"], N=a["N"], type=parts[0]["type"])
    if q4_0 and key + "_qm" not in arrays:
        if key + "_g0" not in arrays:
            raw = _q4_0_weight(gr, n, form, corr)
            if raw is not None:
                arrays[key + "_g0"] = repack(raw, "Q4_0", a["N"], a["K"])
        if key + "_g0" in arrays:
            return helper.make_node(BLOCK_OP, [n.input[0], key + "_g0", *bias], [out], name=n.name + "_g",
                                    domain=DOMAIN, K=a["K"], N=a["N"], type="Q4_0")
    if key + "_qm" not in arrays:
        arrays[key + "_qm"], arrays[key + "_qm_scale"], arrays[key + "_qm_min"] = _convert(
            gr, n, *form, corr[1] if corr else None)
    attrs = dict(block_size=form[1]) if form[0] == 8 else {}
    return helper.make_node(FORMS[form], [n.input[0], key + "_qm", key + "_qm_scale", key + "_qm_min", *bias], [out],
                            name=n.name + "_q", domain=DOMAIN, K=a["K"], N=a["N"], **attrs)


def rewrite(model: onnx.ModelProto, base: Path, arrays: dict[str, np.ndarray], head_dim: int = 0,
            tensors: dict | None = None, q4_0: bool = False) -> onnx.ModelProto:
    """-> `model` with its block-quantized projections and attention on specrt's operators. `base`: the folder
    its external data is relative to. `arrays` collects the new initializers (name -> array),
    shared across calls for graphs of the same weights: each weight is converted once.
    head_dim: the model's, for the attention (0: the attention is left as it is). tensors: the
    GGUF's tensors by name (GGUFReader's), for the projections imported from it (`_gguf_parts`).
    q4_0: symmetric 4-bit weights become QMatMulGGML over Q4_0 blocks (`_q4_0_weight`; a draft's)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    gr = _Graph(g, base)
    drop, replace = set(), {}
    for n in g.node:
        form = _form(n)
        if form is None:
            continue
        corr = gr.mins_correction(n)
        replace[id(corr[0] if corr else n)] = _operator(gr, n, form, corr, arrays, tensors, q4_0)
        if corr:
            drop.update({id(n), id(corr[1])})
    nodes = [replace.get(id(n), n) for n in g.node if id(n) not in drop]
    if head_dim:
        nodes, _ = fuse_attention(nodes, g, gr, head_dim)
    nodes = _prune(nodes, {o.name for o in g.output})
    used = {i for n in nodes for i in n.input} | {o.name for o in g.output}
    del g.node[:]
    g.node.extend(nodes)
    kept = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(kept)
    ours = {*FORMS.values(), BLOCK_OP}
    for name in sorted({i for n in nodes if n.op_type in ours for i in n.input[1:4 if n.op_type != BLOCK_OP else 2]}):
        g.initializer.append(TensorProto(name=name, dims=arrays[name].shape, data_type=(
            TensorProto.UINT8 if arrays[name].dtype == np.uint8 else TensorProto.FLOAT)))  # data placed by `place`
    if not any(o.domain == DOMAIN for o in m.opset_import):
        m.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    return m


def data_layout(arrays: dict[str, np.ndarray]) -> dict[str, tuple[int, int]]:
    """Where `write_data` puts each new initializer: name -> (offset, length), 64-byte aligned."""
    where, off = {}, 0
    for name, arr in arrays.items():
        off += -off % 64
        where[name] = (off, arr.nbytes)
        off += arr.nbytes
    return where


AHEAD = 2  # arrays made (a GGUF tensor's blocks repacked) ahead of the one being written


def write_data(folder: Path, arrays: dict[str, np.ndarray]) -> dict[str, tuple[int, int]]:
    """The new initializers into `folder/DATA` (`data_layout`) -> name: (offset, length). The
    arrays are made by AHEAD threads ahead of the writes, in order (a `_Blocks`' repack is NumPy
    copies and shifts that run outside the GIL, and the writes are system calls): the same
    bytes, with up to AHEAD + 1 tensors' records in memory instead of one."""
    where = data_layout(arrays)
    with open(folder / DATA, "wb") as f, ThreadPoolExecutor(AHEAD) as pool:
        pending: deque = deque()
        for name, arr in arrays.items():
            pending.append((name, pool.submit(np.ascontiguousarray, arr)))
            if len(pending) > AHEAD:
                _write_at(f, where, *pending.popleft())
        while pending:
            _write_at(f, where, *pending.popleft())
    return where


def _write_at(f, where: dict[str, tuple[int, int]], name: str, made) -> None:
    arr = made.result()
    f.write(b"\0" * (where[name][0] - f.tell()))
    f.write(memoryview(arr).cast("B"))  # the array's own bytes, no copy of them


def place(model: onnx.ModelProto, where: dict[str, tuple[int, int]]) -> None:
    for t in model.graph.initializer:
        if t.name in where and not t.HasField("raw_data") and not t.external_data:
            off, n = where[t.name]
            t.data_location = TensorProto.EXTERNAL
            for k, v in (("location", DATA), ("offset", str(off)), ("length", str(n))):
                t.external_data.add(key=k, value=v)


GRAPH = "packed{lanes}.kernels.onnx"


def gguf_tensors(path: Path | str | None) -> dict | None:
    """A GGUF file's tensors by name (memory-mapped: a tensor's bytes are read when repacked)."""
    if path is None:
        return None
    from .gguf_stream import gguf_reader

    return {t.name: t for t in gguf_reader(path).tensors}


def add_kernel_graphs(folder: Path, entry, gguf: Path | str | None = None, draft: bool = False) -> list[Path]:
    """Write the kernel form of `entry`'s packed graphs (export/packed.py) and record it in the
    entry (`packed.kernels`, `packed.kernel_data`; the caller saves the manifest). Nothing is
    written where neither a projection nor the attention has the form (an fp16 KV cache at
    accuracy level 0). gguf: the file the entry's weights were imported from, whose blocks
    QMatMulGGML then reads (else QMatMul4 / QMatMul8 over the packed graphs' weights). draft: the
    entry is a draft, whose symmetric int4 weights QMatMulGGML reads as Q4_0 blocks (docs/design.md
    "A draft's int4 in Q4_0 blocks"). -> the graphs' paths."""
    if not entry.packed.graph:
        return []
    graph = folder / entry.packed.graph
    base = graph.parent
    arrays: dict[str, np.ndarray] = {}
    tensors = gguf_tensors(gguf)
    models = {n: rewrite(onnx.load(str(folder / entry.packed.file(n)), load_external_data=False), base, arrays,
                         entry.kv.head_dim, tensors, draft) for n in entry.packed.lanes}
    if not any(n.domain == DOMAIN for m in models.values() for n in m.graph.node):
        return []
    where = write_data(base, arrays)
    out = []
    for n, m in models.items():
        place(m, where)
        path = base / GRAPH.format(lanes=n)
        tmp = path.with_suffix(".tmp")
        onnx.save(m, str(tmp))
        tmp.replace(path)
        out.append(path)
    entry.packed.kernels = str((base / GRAPH).relative_to(folder))
    entry.packed.kernel_data = str((base / DATA).relative_to(folder))
    entry.packed.one_row = all(one_row(m) for m in models.values())
    return out


if __name__ == "__main__":  # python -m specrt.export.kernel_graph BUNDLE [TARGET_GGUF]
    import sys

    folder = Path(sys.argv[1])
    man = load_manifest(folder)
    gguf = sys.argv[2] if len(sys.argv) > 2 else None
    for entry, src in ((man.target, gguf), (man.draft, None)):
        for p in add_kernel_graphs(folder, entry, src, entry is man.draft) if entry is not None else []:
            print(p)
    man.save(folder)
    if gguf and not any(n.op_type == BLOCK_OP for n in onnx.load(str(folder / man.target.packed.kernel_file(
            man.target.packed.lanes[0])), load_external_data=False).graph.node):
        print(f"no projection of {folder} reads {gguf}'s blocks: its graphs do not name their GGUF tensors "
              "(exported before they did) or none is of a type QMatMulGGML reads; re-export from the GGUF",
              file=sys.stderr)
