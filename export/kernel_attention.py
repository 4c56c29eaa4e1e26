"""A packed graph's attention on specrt's own operator (native/attention*.cc, docs/design.md
"Our own kernel"): each layer's per-lane GroupQueryAttention nodes (export/packed.py: a Gather of
the lane's tokens, GQA over the lane's buffer, the lanes' outputs concatenated and put back in
token order) become one PackedAttention over every lane. The operator writes each lane's new K/V
rows in place and computes every token's attention over its own lane's rows, one unit of work
per lane, KV head and 16 tokens, with nothing per lane that a lane the call does not use pays.

Applies to the form the ort lowering emits with an fp32 KV cache: packed QKV, non-interleaved
rotary over the whole head, heads of a multiple of 16, no sliding window, no softcap. Other layers keep their GQA nodes.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from specrt.runtime.bundle.manifest import PackedIO
from specrt.runtime.kernels import DOMAIN

# GQA attributes the operator computes as GQA does (anything else keeps the GQA nodes)
PLAIN = {"do_rotary": 1, "rotary_interleaved": 0, "local_window_size": -1, "softcap": 0.0, "smooth_softmax": 0}


def _attrs(n) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in n.attribute}


def _plain(gr, gqa, fp32: set[str], head_dim: int) -> bool:
    a = _attrs(gqa)
    ins = list(gqa.input)
    cos = gr.inits.get(ins[7]) if len(ins) == 9 else None
    return (cos is not None and not ins[1] and not ins[2] and ins[3] in fp32
            and head_dim % 16 == 0 and len(cos.dims) == 2 and 2 * cos.dims[1] == head_dim  # rotary over the whole head
            and all(a.get(k, v) == v for k, v in PLAIN.items()) and set(a) <= set(PLAIN) | {"num_heads", "kv_num_heads", "scale"})


def _layer(gr, concat, io: PackedIO, fp32: set[str], head_dim: int):
    """The per-lane nodes of one layer's attention, ending in `concat` -> (their nodes, the fused
    node), or None where the pattern or the attributes differ."""
    gqas = [gr.producer.get(i) for i in concat.input]
    if not gqas or any(g is None or g.op_type != "GroupQueryAttention" or not _plain(gr, g, fp32, head_dim)
                       for g in gqas):
        return None
    after = gr.consumers.get(concat.output[0], [])
    if len(after) != 1 or after[0].op_type != "Gather" or after[0].input[1] != io.unpack_index:
        return None
    gathers = [gr.producer.get(g.input[0]) for g in gqas]
    x = gathers[0].input[0] if gathers[0] is not None else None
    for r, ga in enumerate(gathers):
        if ga is None or ga.op_type != "Gather" or list(ga.input) != [x, io.lane_index.format(r=r)]:
            return None
    a = _attrs(gqas[0])
    kv = [t for g in gqas for t in g.input[3:5]]
    fused = helper.make_node(
        "PackedAttention", [x, gqas[0].input[7], gqas[0].input[8], io.lane_seqlens, "lane_tokens", "lane_widths",
                            io.unpack_index, *kv],
        [after[0].output[0]] + [t for g in gqas for t in g.output[1:3]], name=gqas[0].name.rsplit("_lane", 1)[0] + "_packed",
        domain=DOMAIN, num_heads=a["num_heads"], kv_num_heads=a["kv_num_heads"], scale=float(a.get("scale", 0.0)))
    return [*gqas, *gathers, concat, after[0]], fused


def _lane_inputs(lanes: int, io: PackedIO) -> list:
    """lane_tokens (the lanes' indices, lane after lane) and lane_widths (their lengths)."""
    idx = [io.lane_index.format(r=r) for r in range(lanes)]
    nodes = [helper.make_node("Concat", idx, ["lane_tokens"], axis=0)]
    nodes += [helper.make_node("Shape", [i], [f"lane_width{r}"]) for r, i in enumerate(idx)]
    nodes.append(helper.make_node("Concat", [f"lane_width{r}" for r in range(lanes)], ["lane_widths"], axis=0))
    return nodes


def fuse_attention(nodes: list, graph: onnx.GraphProto, gr, head_dim: int) -> tuple[list, int]:
    """`nodes` (the graph's, in order) with every plain layer's lane attention fused. `gr`
    indexes producers, consumers and initializers (export/kernel_graph.py `_Graph`); head_dim:
    the model's (a multiple of 16). -> (nodes, layers fused)."""
    io = PackedIO()
    fp32 = {i.name for i in graph.input if i.type.tensor_type.elem_type == TensorProto.FLOAT}
    drop, put, lanes = set(), {}, 0
    for n in nodes:
        if n.op_type != "Concat":
            continue
        got = _layer(gr, n, io, fp32, head_dim)
        if got is None:
            continue
        old, fused = got
        drop.update(id(o) for o in old)
        put[id(old[-1])] = fused  # where the unpack Gather was: its inputs are all computed by then
        lanes = len(old) // 2 - 1
    if not put:
        return nodes, 0
    out = _lane_inputs(lanes, io)
    out += [put.get(id(n), n) for n in nodes if id(n) not in drop or id(n) in put]
    return out, len(put)
