"""The packed form of an `ort` target graph: one call carries the tokens of many sequences.

The bundle's graph (`target/model.onnx`, docs/bundle.md) runs B rows of T tokens, and
GroupQueryAttention refuses B > 1 with T > 1 and a past, so every verifying sequence took a call
of its own, each streaming all the weights. The packed graph (`target/packed.onnx`, the same
weights file) puts the tokens of up to `lanes` sequences on one token axis: embedding, norms,
projections, MLP and LM head run over all N tokens at once; each layer's attention runs once per
*lane*: a GroupQueryAttention of batch 1 over that lane's own KV buffer (bound to its slot's
rows), fed the lane's tokens by a Gather. A lane always holds at least two tokens (the runtime
adds a filler after a lone token): at B = 1 and T >= 2 a row's attention computes the same bits
whatever the call's width or the lane's context (docs/design.md, "Packed calls"), and MatMul /
MatMulNBits rows do not depend on how many rows the call has (M >= 2, which the filler also
ensures). So a sequence's logits are the same whether it runs alone or beside others.

Inputs (N packed tokens, R = lanes, lane r holding T_r >= 2 entries):
  input_ids        int64 [1, N]     the tokens, any order
  lane_index.{r}   int64 [T_r]      lane r's tokens as indices into the N (in position order;
                                    fillers repeat an index: their K/V lands past the lane's rows)
  lane_seqlens     int32 [R]        per lane: its total length - 1 (past + T_r - 1); GQA reads
                                    each lane's write position from it (rotary included)
  unpack_index     int64 [N]        token i's row in the lanes' outputs concatenated in lane order
  logits_index     int64 [n]        the tokens that get logits (n <= N)
  past_key_values.{i}.key.lane{r} / .value.lane{r}   [1, Hkv, S, D], bound with the matching
  present.{i}.key.lane{r} / .value.lane{r}           output to the same buffer (in place)
Outputs: logits float32 [1, n, V]; the presents. A lane the call does not use is bound to a
two-row scratch buffer with lane_seqlens 1 and any two indices.

Built by rewriting the emitted graph (its attention nodes, the mask arithmetic and the LM head's
Slice), so it holds the same weights, kernels and numbers per token; `pack_bundle` adds them to a
bundle that already exists (the rewrite takes seconds; no weights are read).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from specrt.runtime.bundle.manifest import PackedIO, load_manifest

from .kernel_graph import add_kernel_graphs

GRAPH = "packed{lanes}.onnx"  # next to the target's model.onnx, sharing its external data file
# one graph per lane count: every lane costs a call its attention nodes (~17 us per layer on the
# default pair), so a load runs the fewest lanes that hold its slots (docs/benchmarks.md §19)
LANES = (1, 2, 4, 8, 16)


def _drop_mask_nodes(g: onnx.GraphProto, mask: str) -> None:
    """Remove every node that depends on `mask` (GQA's seqlens_k / total arithmetic)."""
    tainted = {mask}
    keep = []
    for n in g.node:
        if n.op_type != "GroupQueryAttention" and any(i in tainted for i in n.input):
            tainted.update(n.output)
        else:
            keep.append(n)
    del g.node[:]
    g.node.extend(keep)


def _lane_scalars(nodes: list, lanes: int) -> list[tuple[str, str]]:
    """Per lane: (seqlens_k [1] int32, total scalar int32) from the lane_seqlens input."""
    out = []
    for r in range(lanes):
        seq, tot = f"lane{r}_seqlens_k", f"lane{r}_total"
        nodes.append(helper.make_node("Slice", [PackedIO.lane_seqlens, f"lane_c{r}", f"lane_c{r + 1}"], [seq]))
        nodes.append(helper.make_node("Add", [seq, "lane_one_i32"], [f"lane{r}_total1"]))
        nodes.append(helper.make_node("Squeeze", [f"lane{r}_total1"], [tot]))
        out.append((seq, tot))
    return out


def _split_attention(n: onnx.NodeProto, layer: int, lanes: int, scalars, io: PackedIO, names) -> list:
    """One GQA node over [1, N] -> a Gather + GQA per lane, their outputs concatenated and put
    back in token order."""
    q, k, v, past_k, past_v, _, _, cos, sin = n.input
    attn, pres_k, pres_v = n.output
    nodes, outs = [], []
    for r, (seq, tot) in enumerate(scalars):
        idx = io.lane_index.format(r=r)
        ins = []
        for x in (q, k, v):
            if x:
                nodes.append(helper.make_node("Gather", [x, idx], [f"{x}_lane{r}"], axis=1))
            ins.append(f"{x}_lane{r}" if x else "")
        out = f"{attn}_lane{r}"
        lane_kv = [s.format(i=layer, r=r) for s in names]
        nodes.append(helper.make_node(
            "GroupQueryAttention", [*ins, lane_kv[0], lane_kv[1], seq, tot, cos, sin],
            [out, lane_kv[2], lane_kv[3]], name=f"{n.name}_lane{r}", domain=n.domain))
        nodes[-1].attribute.extend(n.attribute)
        outs.append(out)
    nodes.append(helper.make_node("Concat", outs, [f"{attn}_lanes"], axis=1))
    nodes.append(helper.make_node("Gather", [f"{attn}_lanes", io.unpack_index], [attn], axis=1))
    return nodes


def packable(entry) -> bool:
    """Whether `entry`'s graph has a packed form: the `ort` lowering, with num_logits_to_keep,
    without EAGLE feature IO."""
    return entry.lowering == "ort" and bool(entry.io.logits_to_keep) and not entry.io.hidden_in and not entry.io.hidden_out


def pack_graph(model: onnx.ModelProto, entry, lanes: int) -> onnx.ModelProto:
    """The packed form (module docstring) of an `ort` graph emitted by export/graph.py for
    `entry` (its ModelEntry: IO names, KV layout). Initializers stay where they are (external
    data references included), so the result shares the original's weights file."""
    src, io = entry.io, PackedIO()
    if not packable(entry):
        raise ValueError("only ort graphs with num_logits_to_keep and no EAGLE features have a packed form")
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    _drop_mask_nodes(g, src.attention_mask)
    names = (io.past_key, io.past_value, io.present_key, io.present_value)
    consts = [helper.make_tensor(f"lane_c{r}", TensorProto.INT64, [1], [r]) for r in range(lanes + 1)]
    consts.append(helper.make_tensor("lane_one_i32", TensorProto.INT32, [1], [1]))
    nodes: list = []
    scalars = _lane_scalars(nodes, lanes)
    neg = next(n.output[0] for n in g.node if n.op_type == "Neg" and n.input[0] == src.logits_to_keep)
    layer = 0
    for n in g.node:
        if n.op_type == "GroupQueryAttention":
            nodes.extend(_split_attention(n, layer, lanes, scalars, io, names))
            layer += 1
        elif n.output[0] == neg:
            continue
        elif n.op_type == "Slice" and n.input[1] == neg:  # the LM head's Slice by -num_logits_to_keep
            nodes.append(helper.make_node("Gather", [n.input[0], io.logits_index], [n.output[0]], axis=1))
        else:
            nodes.append(n)
    if layer != entry.kv.layers:
        raise ValueError(f"found {layer} attention nodes, the entry has {entry.kv.layers} layers")
    del g.node[:]
    g.node.extend(nodes)
    g.initializer.extend(consts)
    kept = [t for t in g.initializer if t.name != src.logits_to_keep]
    del g.initializer[:]
    g.initializer.extend(kept)
    _rewrite_io(g, entry, src, io, lanes)
    return m


def _rewrite_io(g: onnx.GraphProto, entry, src, io: PackedIO, lanes: int) -> None:
    kv = entry.kv
    dtype = helper.np_dtype_to_tensor_dtype(np.dtype(kv.dtype))
    shape = [1, kv.kv_heads, "max_seq_len", kv.head_dim]
    inputs = [helper.make_tensor_value_info(src.input_ids, TensorProto.INT64, [1, "tokens"])]
    inputs += [helper.make_tensor_value_info(io.lane_index.format(r=r), TensorProto.INT64, [f"lane{r}_tokens"])
               for r in range(lanes)]
    inputs += [helper.make_tensor_value_info(io.lane_seqlens, TensorProto.INT32, [lanes]),
               helper.make_tensor_value_info(io.unpack_index, TensorProto.INT64, ["tokens"]),
               helper.make_tensor_value_info(io.logits_index, TensorProto.INT64, ["logits_length"])]
    outputs = [helper.make_tensor_value_info(src.logits, TensorProto.FLOAT, [1, "logits_length", entry.vocab_size])]
    for i in range(kv.layers):
        for r in range(lanes):
            for past, present in ((io.past_key, io.present_key), (io.past_value, io.present_value)):
                inputs.append(helper.make_tensor_value_info(past.format(i=i, r=r), dtype, shape))
                outputs.append(helper.make_tensor_value_info(present.format(i=i, r=r), dtype, shape))
    del g.input[:]
    g.input.extend(inputs)
    del g.output[:]
    g.output.extend(outputs)
    del g.value_info[:]


def pack_bundle(folder: str | Path, lanes=LANES, gguf: str | Path | None = None, skip_packed: bool = False) -> list[Path]:
    """Write the packed graphs (`<model>/packed{lanes}.onnx`, one per lane count) of a bundle's
    target, and of its draft model where it has one of the same form, and record them in the
    manifest (`packed` of each entry). A draft's packed calls batch its catch-up reads of several
    tokens with the one-token steps of other rows. gguf: the file the target was imported from,
    whose blocks its kernel graphs read (export/kernel_graph.py). skip_packed: leave an entry
    that has them (the export packs its target before its checks). -> the graphs' paths."""
    folder = Path(folder)
    man = load_manifest(folder)
    out = []
    for entry in (man.target, man.draft):
        if entry is None or not packable(entry) or (entry.packed.graph and skip_packed):
            continue
        out += pack_entry(folder, entry, lanes, gguf if entry is man.target else None, entry is man.draft)
    man.save(folder)
    return out


def pack_entry(folder: Path, entry, lanes=LANES, gguf: str | Path | None = None, draft: bool = False) -> list[Path]:
    """`entry`'s packed graphs and their kernel form (export/kernel_graph.py; `draft`: the entry is
    a draft), recorded in the entry (the caller saves the manifest). -> the graphs' paths."""
    graph = folder / entry.graph
    model = onnx.load(str(graph), load_external_data=False)
    out = []
    for n in lanes:
        path = graph.with_name(GRAPH.format(lanes=n))
        tmp = path.with_suffix(".tmp")
        onnx.save(pack_graph(model, entry, n), str(tmp))
        tmp.replace(path)
        out.append(path)
    entry.packed.graph = str(graph.with_name(GRAPH).relative_to(folder))
    entry.packed.lanes = list(lanes)
    # the same graphs on specrt's own kernels, where they apply
    return out + add_kernel_graphs(folder, entry, gguf, draft)


if __name__ == "__main__":  # python -m specrt.export.packed BUNDLE: add the packed graphs to a bundle
    import sys

    for p in pack_bundle(sys.argv[1]):
        print(p)
