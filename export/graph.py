"""Emit a decoder ONNX graph directly from weights, in one of two lowerings.

Graph contract (docs/bundle.md):
  inputs   input_ids            int64 [B, T]           T = 1 .. max_tokens_per_call
           attention_mask       int64 [B, P + T]       all ones; its length tells the graph
                                                        the committed length P (write position)
           past_key_values.{i}.key / .value   [B, Hkv, S_max, D]
           num_logits_to_keep   int64 [1]              optional (ort lowering), n >= 1: logits for the
                                                        last n positions only; default (not fed): all T
  outputs  logits               float32 [B, n, V]      n = min(num_logits_to_keep, T); verification
                                                        needs all T, a prompt chunk only its last
           present.{i}.key / .value           [B, Hkv, S_max, D]
The runtime binds past_key_values.{i}.* and present.{i}.* to the *same* buffer: the graph
writes the T new rows at [P, P+T) in place and attends over [0, P+T). Rows past P+T are stale
and masked, so rolling back is just a shorter attention_mask on the next call.

Lowerings
  ort       onnxruntime contrib ops: GroupQueryAttention (fused rotary, shared past/present),
            SimplifiedLayerNormalization / SkipSimplifiedLayerNormalization, MatMulNBits (int4).
  standard  standard ONNX ops only (opset 24): TensorScatter writes the new rows, Attention
            with an explicit boolean mask reads them; RMSNorm and rotary as plain arithmetic.
            Meant for TensorRT; also runs on onnxruntime CPU, where its numerics are tested.
One class per lowering (export/lowering_ort.py, export/lowering_standard.py) over the layers
both share (export/emitter.py); `build_graph` picks the class and wraps its nodes in the
graph's inputs and outputs.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from specrt.runtime.bundle.manifest import KV_DTYPE, IONames

from .arch import Arch
from .emitter import GraphBuilder, GraphOptions, kv_buffer_dtype
from .lowering_ort import OrtEmitter
from .lowering_standard import StandardEmitter
from .nbits import MS, WEIGHT_ONLY
from .quantize import QuantWeight

OPSET = {"ort": 21, "standard": 24}
EMITTERS = {"ort": OrtEmitter, "standard": StandardEmitter}  # lowering -> the class that emits it
FEATURES = "hidden_states"  # the target's final-norm hidden states: its output and an EAGLE draft's input
EAGLE_FEATURES_OUT = "next_hidden_states"  # an EAGLE draft's predicted features (its next step's input)
LOGITS_KEEP = "num_logits_to_keep"  # ort lowering: int64 [1], an input with a default (all positions)


def graph_io(opts: GraphOptions) -> IONames:
    """The IO names a graph built with `opts` has: IONames' fixed names (the manifest's one home
    for them) plus the optional inputs and outputs `opts` asks for."""
    return IONames(hidden_out=opts.hidden_out, hidden_in=FEATURES if opts.eagle else "",
                   logits_to_keep=LOGITS_KEEP if opts.lowering == "ort" else "")


def build_graph(arch: Arch, w: dict[str, np.ndarray], opts: GraphOptions,
                qw: dict[str, QuantWeight] | None = None, sink=None) -> onnx.ModelProto:
    """w: HF state dict as fp32 NumPy arrays; qw: HF name -> imported GGUF form (precision gguf).
    Returns a ModelProto with the names of `graph_io(opts)`; its initializers inline, or streamed
    to `sink` (bundle.ExternalData)."""
    if opts.precision in WEIGHT_ONLY and opts.lowering != "ort":
        raise ValueError(f"{opts.precision} (MatMulNBits) exists only in the 'ort' lowering")
    dtype = np.dtype(KV_DTYPE[opts.precision])  # activations; int4/int8/gguf are weight-only
    g, io = GraphBuilder(dtype.type, sink), graph_io(opts)
    EMITTERS[opts.lowering](g, arch, w, opts, qw or {}, io).build()
    onnx_dtype = helper.np_dtype_to_tensor_dtype(kv_buffer_dtype(opts))
    kv_shape = ["batch", arch.kv_heads, "max_seq_len", arch.head_dim]
    inputs = [
        helper.make_tensor_value_info(io.input_ids, TensorProto.INT64, ["batch", "sequence_length"]),
        helper.make_tensor_value_info(io.attention_mask, TensorProto.INT64, ["batch", "total_sequence_length"]),
    ]
    out_len = "logits_length" if io.logits_to_keep else "sequence_length"
    outputs = [helper.make_tensor_value_info(io.logits, TensorProto.FLOAT, ["batch", out_len, arch.vocab])]
    if io.hidden_in:
        inputs.insert(1, helper.make_tensor_value_info(io.hidden_in, TensorProto.FLOAT, ["batch", "sequence_length", arch.hidden]))
    if io.hidden_out:
        outputs.append(helper.make_tensor_value_info(io.hidden_out, TensorProto.FLOAT, ["batch", "sequence_length", arch.hidden]))
    if io.logits_to_keep:
        # an initializer that is also a graph input is overridable: callers that do not feed it
        # (onnxruntime-genai, plain InferenceSession users) get every position, as before
        inputs.append(helper.make_tensor_value_info(io.logits_to_keep, TensorProto.INT64, [1]))
    for i in range(arch.layers):
        for past, present in ((io.past_key, io.present_key), (io.past_value, io.present_value)):
            inputs.append(helper.make_tensor_value_info(past.format(i=i), onnx_dtype, kv_shape))
            outputs.append(helper.make_tensor_value_info(present.format(i=i), onnx_dtype, kv_shape))
    graph = helper.make_graph(g.nodes, "specrt_decoder", inputs, outputs, initializer=g.inits)
    opsets = [helper.make_opsetid("", OPSET[opts.lowering])]
    if opts.lowering == "ort":
        opsets.append(helper.make_opsetid(MS, 1))
    model = helper.make_model(graph, opset_imports=opsets, producer_name="specrt")
    model.ir_version = 10
    return model
