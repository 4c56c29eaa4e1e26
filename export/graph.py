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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from specrt.runtime.bundle.manifest import KV_DTYPE, IONames

from . import nbits, quantize
from .arch import Arch
from .nbits import MS, WEIGHT_ONLY
from .quantize import QuantWeight

OPSET = {"ort": 21, "standard": 24}
FEATURES = "hidden_states"  # the target's final-norm hidden states: its output and an EAGLE draft's input
EAGLE_FEATURES_OUT = "next_hidden_states"  # an EAGLE draft's predicted features (its next step's input)
LOGITS_KEEP = "num_logits_to_keep"  # ort lowering: int64 [1], an input with a default (all positions)
KEEP_ALL = 1 << 30  # the default: Slice clamps -KEEP_ALL to the first position


@dataclass(frozen=True)
class GraphOptions:
    lowering: str = "ort"  # "ort" | "standard"
    precision: str = "fp32"  # "fp32" | "fp16" | "int4" | "int8" | "gguf" (MatMulNBits, ort lowering only;
    #                           gguf: each weight in its imported GGUF form, see export/nbits.py)
    max_seq_len: int = 2048  # S_max of the KV buffers and rotary tables
    int4_block_size: int = 32
    int4_accuracy_level: int = 4  # MatMulNBits compute type on CPU: 4 = int8 activations, 0 = fp32
    lm_head_precision: str = ""  # the LM head's own precision ("": the graph's), e.g. int8 under int4
    hidden_out: str = ""  # also output the final-norm hidden states [B, T, H] under this name
    eagle: bool = False  # EAGLE draft: input `hidden_states` [B, T, H] (target features) mixed
    #                      into the embedding by `eagle.fc.*` (docs/design.md, "EAGLE draft")


class _G:
    """Tiny builder: nodes + initializers with unique names."""

    def __init__(self, dtype, sink=None):
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.dtype = dtype  # numpy float dtype of activations and weights
        self.sink = sink  # (name, array) -> external TensorProto | None (bundle.ExternalData)
        self._n = 0

    def name(self, hint: str) -> str:
        self._n += 1
        return f"{hint}_{self._n}"

    def const(self, name: str, arr: np.ndarray) -> str:
        t = self.sink(name, arr) if self.sink else None
        self.inits.append(t if t is not None else numpy_helper.from_array(np.ascontiguousarray(arr), name))
        return name

    def weight(self, name: str, arr: np.ndarray) -> str:
        return self.const(name, arr.astype(self.dtype))

    def op(self, op_type, inputs, hint=None, outputs=1, domain="", **attrs):
        hint = hint or op_type.lower()
        outs = [self.name(hint) for _ in range(outputs)] if isinstance(outputs, int) else outputs
        self.nodes.append(
            helper.make_node(op_type, list(inputs), outs, name=self.name(op_type), domain=domain, **attrs)
        )
        return outs[0] if len(outs) == 1 else outs

    def i64(self, *vals) -> str:
        return self.const(self.name("c"), np.array(vals, dtype=np.int64))


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
    dtype = np.dtype(KV_DTYPE[opts.precision])  # activations and KV; int4/int8/gguf are weight-only
    g = _G(dtype.type, sink)
    em = _Emitter(g, arch, w, opts, qw or {})
    em.build()
    io = em.io
    onnx_dtype = helper.np_dtype_to_tensor_dtype(dtype)
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


EMBED = "model.embed_tokens.weight"


def head_key(arch: Arch, w: dict) -> str:
    """The checkpoint weight the LM head multiplies by."""
    return EMBED if "lm_head.weight" not in w or arch.tie_embeddings else "lm_head.weight"


def embedding_form(arch: Arch, w: dict, qw: dict, opts: GraphOptions) -> QuantWeight | None:
    """The GGUF blocks a gguf target gathers its embedding from (`nbits.gather`), or None for
    the fp32 table: other precisions, the standard lowering (no contrib ops), an embedding with
    no exact form, or an LM head that multiplies by the fp32 table itself (tied, float head: the
    Gemm shares the Gather's initializer)."""
    q = qw.get(EMBED) if opts.precision == "gguf" and opts.lowering == "ort" else None
    if q is None or q.bits not in (4, 8):
        return None
    if head_key(arch, w) == EMBED and nbits.runs_as_float(q, opts.lm_head_precision or opts.precision,
                                                           opts.int4_accuracy_level):
        return None
    return q


class _Emitter:
    def __init__(self, g: _G, arch: Arch, w: dict[str, np.ndarray], opts: GraphOptions, qw: dict):
        self.g, self.a, self.w, self.o, self.qw = g, arch, w, opts, qw
        self.block_sums: dict = {}  # (input, block) -> its block sums, for weights with mins
        self.ort = opts.lowering == "ort"
        self.io = graph_io(opts)
        # num_logits_to_keep input (the standard lowering stays TensorRT-plain)
        self.keep = bool(self.io.logits_to_keep)

    # ---- shared pieces -------------------------------------------------------------------
    def norm_weight(self, key: str) -> np.ndarray:
        return self.w[key] + self.a.family.norm_offset

    def linear(self, x: str, key: str) -> str:
        """x [B, T, in] @ W.T for the checkpoint weight `key` (HF layout [out, in])."""
        return self.project(x, key.replace("model.", "").replace(".weight", "").replace(".", "_"), self.weight(key))

    def project(self, x: str, hint: str, W, b: np.ndarray | None = None) -> str:
        """x [B, T, in] @ W.T (+ b); W: fp32 [out, in] or a QuantWeight, in the form
        `nbits.resolve` gives it for this graph."""
        g, level = self.g, self.o.int4_accuracy_level
        W = nbits.resolve(W, self.o.precision, self.o.int4_block_size, level)
        if isinstance(W, QuantWeight):
            return nbits.emit(g, x, hint, W, b, level, self.block_sums)
        y = g.op("MatMul", [x, g.weight(hint + "_wT", W.T)], hint)
        if b is not None:
            y = g.op("Add", [y, g.weight(hint + "_b", b)], hint + "_bias")
        return y

    def weight(self, key: str):
        """The checkpoint weight `key` as the graph's source holds it: its imported GGUF form
        where there is one (precision gguf), else fp32."""
        return self.qw.get(key, self.w[key]) if self.o.precision == "gguf" else self.w[key]

    def rms(self, x: str, key: str, skip: str | None = None):
        """RMSNorm over the last axis; with `skip`, normalizes x + skip and also returns the sum."""
        g, eps = self.g, self.a.eps
        gamma = g.weight(key.replace(".", "_"), self.norm_weight(key))
        if self.ort:
            if skip is None:
                return g.op("SimplifiedLayerNormalization", [x, gamma], "norm", axis=-1, epsilon=eps)
            out, _, _, total = g.op(
                "SkipSimplifiedLayerNormalization", [x, skip, gamma], "skipnorm",
                outputs=4, domain=MS, epsilon=eps,
            )
            return out, total
        total = g.op("Add", [x, skip], "resid") if skip is not None else x
        out = self._rms_plain(total, gamma)
        return (out, total) if skip is not None else out

    def _rms_plain(self, x: str, gamma: str) -> str:
        g = self.g
        xf = g.op("Cast", [x], "norm_f32", to=TensorProto.FLOAT) if g.dtype == np.float16 else x
        ms = g.op("ReduceMean", [g.op("Mul", [xf, xf]), g.i64(-1)], keepdims=1)
        eps = g.const(g.name("eps"), np.array(self.a.eps, dtype=np.float32))
        inv = g.op("Reciprocal", [g.op("Sqrt", [g.op("Add", [ms, eps])])])
        y = g.op("Mul", [xf, inv])
        if g.dtype == np.float16:
            y = g.op("Cast", [y], to=TensorProto.FLOAT16)
        return g.op("Mul", [y, gamma], "norm")

    def head_norm(self, x: str, key: str, heads: int) -> str:
        """Per-head RMSNorm on [B, T, heads*D] (Qwen3 / Gemma 3 q_norm, k_norm)."""
        g, D = self.g, self.a.head_dim
        x4 = g.op("Reshape", [x, g.i64(0, 0, heads, D)])
        y = self.rms(x4, key)
        return g.op("Reshape", [y, g.i64(0, 0, heads * D)])

    def fused(self, x: str, keys: list[str], bias_keys: list[str | None], hint: str, split: bool = True):
        """Several projections of the same input as one MatMul ([out1+out2+..., in] weights);
        split back on the last axis unless `split` is False. Weights whose quantized forms differ
        (a GGUF's Q4_K q/k beside a Q6_K v) run as separate projections, concatenated."""
        sizes = [self.w[k].shape[0] for k in keys]
        biases = [self.w[bk] if bk else np.zeros(n, np.float32) for bk, n in zip(bias_keys, sizes, strict=True)]
        b = np.concatenate(biases) if any(bias_keys) else None
        name = keys[0].replace("model.", "").rsplit(".", 2)[0].replace(".", "_") + "_" + hint
        parts = [nbits.resolve(self.weight(k), self.o.precision, self.o.int4_block_size, self.o.int4_accuracy_level)
                 for k in keys]
        if all(isinstance(p, np.ndarray) for p in parts):
            y = self.project(x, name, np.concatenate(parts, axis=0), b)
        elif all(isinstance(p, QuantWeight) for p in parts) and (one := quantize.fuse(parts)) is not None:
            y = self.project(x, name, one, b)
        else:
            ys = [self.project(x, f"{name}{j}", p, bb if any(bias_keys) else None)
                  for j, (p, bb) in enumerate(zip(parts, biases, strict=True))]
            y = self.g.op("Concat", ys, name, axis=-1)
        if not split:
            return y
        return self.g.op("Split", [y, self.g.i64(*sizes)], hint, outputs=len(keys), axis=-1)

    def mlp(self, x: str, p: str) -> str:
        g = self.g
        # gate and up as one [H, 2I] projection
        gate, up = self.fused(x, [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"], [None, None], "gate_up")
        if self.a.family.activation == "silu":
            act = g.op("Mul", [gate, g.op("Sigmoid", [gate])], "silu")
        else:
            act = g.op("Gelu", [gate], "gelu", approximate="tanh")
        return self.linear(g.op("Mul", [act, up], "gated"), p + "mlp.down_proj.weight")

    # ---- graph ---------------------------------------------------------------------------
    def build(self):
        g, a = self.g, self.a
        self.prepare_positions()
        qe = embedding_form(self.a, self.w, self.qw, self.o)
        if qe is not None:  # the GGUF's own blocks (nbits.gather)
            h = nbits.gather(g, self.io.input_ids, "embed_tokens", qe)
        else:
            emb = g.weight("embed_tokens", self.w[EMBED])
            h = g.op("Gather", [emb, self.io.input_ids], "embed")  # [B, T, H]
        if a.family.embed_scale:
            scale = np.array(np.sqrt(a.hidden), dtype=g.dtype)
            h = g.op("Mul", [h, g.const("embed_scale", scale)])
        if self.o.eagle:  # h = fc([embed(x_{p+1}), f_p])
            f_in = self.io.hidden_in
            f = g.op("Cast", [f_in], to=TensorProto.FLOAT16) if g.dtype == np.float16 else f_in
            h = self.project(g.op("Concat", [h, f], "eagle_in", axis=-1), "eagle_fc",
                             self.w["eagle.fc.weight"], self.w.get("eagle.fc.bias"))
        resid = h
        x = self.rms(h, "model.layers.0.input_layernorm.weight")
        fam = a.family
        for i in range(a.layers):
            p = f"model.layers.{i}."
            att = self.attention(x, i, p)
            if fam.attn_out_norm:
                att = self.rms(att, p + fam.attn_out_norm + ".weight")
            x, resid = self.rms(att, p + fam.mlp_norm + ".weight", skip=resid)
            m = self.mlp(x, p)
            if fam.mlp_out_norm:
                m = self.rms(m, p + fam.mlp_out_norm + ".weight")
            nxt = f"model.layers.{i + 1}.input_layernorm.weight" if i + 1 < a.layers else "model.norm.weight"
            x, resid = self.rms(m, nxt, skip=resid)
        self.lm_head(x)
        if self.o.hidden_out:
            to32 = g.dtype != np.float32
            g.op("Cast" if to32 else "Identity", [x], outputs=[self.o.hidden_out], **({"to": TensorProto.FLOAT} if to32 else {}))

    def lm_head(self, x: str):
        g = self.g
        if self.keep:  # only the last num_logits_to_keep positions go through the LM head
            keep = self.io.logits_to_keep
            g.const(keep, np.array([KEEP_ALL], dtype=np.int64))
            x = g.op("Slice", [x, g.op("Neg", [keep]), g.i64(np.iinfo(np.int64).max), g.i64(1)], "keep")
        key = head_key(self.a, self.w)
        o = self.o
        head = nbits.resolve(self.weight(key), o.lm_head_precision or o.precision, o.int4_block_size, o.int4_accuracy_level)
        # float and equal to the embedding (a gguf import's weights are the fp32 ones, checked on import)
        if isinstance(head, np.ndarray) and self.a.tie_embeddings and (head is self.w[key] or o.precision == "gguf"):
            # Share the embedding initializer: Gemm(transB=1) on [B*T, H] avoids a transposed copy.
            x2 = g.op("Reshape", [x, g.i64(-1, self.a.hidden)])
            y2 = g.op("Gemm", [x2, "embed_tokens"], "lm_head", transB=1)
            # [B, n] (the standard lowering has no Slice: its graph stays as TensorRT has run it)
            shape = g.op("Shape", [x], end=2) if self.keep else g.op("Shape", [self.io.input_ids])
            out_shape = g.op("Concat", [shape, g.i64(self.a.vocab)], axis=0)
            logits = g.op("Reshape", [y2, out_shape])
        else:
            logits = self.project(x, "lm_head", head)
        if g.dtype != np.float32:
            g.op("Cast", [logits], outputs=[self.io.logits], to=TensorProto.FLOAT)
        else:
            g.op("Identity", [logits], outputs=[self.io.logits])

    def prepare_positions(self):
        """Scalars derived once from input shapes: P (committed length) and T."""
        g = self.g
        total = g.op("Gather", [g.op("Shape", [self.io.attention_mask]), g.i64(1)], "total")  # [1]
        if self.ort:
            # GQA wants seqlens_k = total - 1 per batch row (int32) and total as int32 scalar.
            mask_sum = g.op("ReduceSum", [self.io.attention_mask, g.i64(1)], keepdims=0)
            self.seqlens_k = g.op("Cast", [g.op("Sub", [mask_sum, g.i64(1)])], "seqlens_k", to=TensorProto.INT32)
            self.total_len = g.op("Cast", [g.op("Squeeze", [total])], "total_len", to=TensorProto.INT32)
            self.rope_caches = {}
            for kind, (cos, sin) in self.a.rope.items():
                half = self.a.head_dim // 2  # GQA takes the half tables (rotate_half layout)
                self.rope_caches[kind] = (
                    g.weight(f"cos_cache_{kind}", cos[:, :half]),
                    g.weight(f"sin_cache_{kind}", sin[:, :half]),
                )
            return
        T = g.op("Gather", [g.op("Shape", [self.io.input_ids]), g.i64(1)], "T")  # [1]
        P = g.op("Sub", [total, T], "P")  # [1] write index
        batch = g.op("Gather", [g.op("Shape", [self.io.input_ids]), g.i64(0)], "B")
        self.write_idx = g.op("Expand", [P, batch], "write_idx")  # [B]
        zero = g.const("zero_i64", np.array(0, dtype=np.int64))
        one = g.const("one_i64", np.array(1, dtype=np.int64))
        Ts, Ps = g.op("Squeeze", [T]), g.op("Squeeze", [P])
        qpos = g.op("Add", [g.op("Range", [zero, Ts, one]), Ps], "qpos")  # [T] absolute positions
        self.rope_tables = {}
        for kind, (cos, sin) in self.a.rope.items():
            c = g.op("Gather", [g.weight(f"cos_{kind}", cos), qpos], "cos")  # [T, D]
            s = g.op("Gather", [g.weight(f"sin_{kind}", sin), qpos], "sin")
            self.rope_tables[kind] = (c, s)
        smax = g.op("Squeeze", [g.op("Gather", [g.op("Shape", [self.io.past_key.format(i=0)]), g.i64(2)])])
        kpos = g.op("Unsqueeze", [g.op("Range", [zero, smax, one]), g.i64(0)], "kpos")  # [1, S]
        q2 = g.op("Unsqueeze", [qpos, g.i64(1)], "qpos2")  # [T, 1]
        causal = g.op("LessOrEqual", [kpos, q2], "causal")  # [T, S]
        self.masks = {0: causal}
        for win in set(self.a.windows) - {0}:
            lo = g.op("Sub", [q2, g.i64(win)])
            self.masks[win] = g.op("And", [causal, g.op("Greater", [kpos, lo])], "window")

    def attention(self, x: str, i: int, p: str) -> str:
        g, a, fam = self.g, self.a, self.a.family
        bias = (lambda n: p + f"self_attn.{n}.bias") if fam.qkv_bias else (lambda n: None)
        names = ("q_proj", "k_proj", "v_proj")
        keys = [p + f"self_attn.{n}.weight" for n in names]
        biases = [bias(n) for n in names]
        # one [H, (Hq+2Hkv)D] projection; GQA takes it packed (key/value inputs left empty)
        if self.ort and not fam.qk_norm:
            q, k, v = self.fused(x, keys, biases, "qkv", split=False), "", ""
        else:
            q, k, v = self.fused(x, keys, biases, "qkv")
        if fam.qk_norm:
            q = self.head_norm(q, p + "self_attn.q_norm.weight", a.heads)
            k = self.head_norm(k, p + "self_attn.k_norm.weight", a.kv_heads)
        io = self.io
        past_k, past_v = io.past_key.format(i=i), io.past_value.format(i=i)
        pres_k, pres_v = io.present_key.format(i=i), io.present_value.format(i=i)
        kind = a.rope_kind[i]
        if self.ort:
            cos, sin = self.rope_caches[kind]
            out = g.op(
                "GroupQueryAttention",
                [q, k, v, past_k, past_v, self.seqlens_k, self.total_len, cos, sin],
                f"attn{i}", outputs=[g.name(f"attn{i}"), pres_k, pres_v], domain=MS,
                num_heads=a.heads, kv_num_heads=a.kv_heads, scale=a.attn_scale,
                do_rotary=1, rotary_interleaved=0, local_window_size=a.windows[i] or -1,
            )[0]
        else:
            cos, sin = self.rope_tables[kind]
            q4 = self._heads_first(q, a.heads)
            k4 = self._heads_first(k, a.kv_heads)
            v4 = self._heads_first(v, a.kv_heads)
            q4, k4 = self._rope(q4, cos, sin), self._rope(k4, cos, sin)
            g.op("TensorScatter", [past_k, k4, self.write_idx], outputs=[pres_k], axis=2)
            g.op("TensorScatter", [past_v, v4, self.write_idx], outputs=[pres_v], axis=2)
            o4 = g.op("Attention", [q4, pres_k, pres_v, self.masks[a.windows[i]]], f"attn{i}", scale=a.attn_scale)
            out = g.op("Reshape", [g.op("Transpose", [o4], perm=[0, 2, 1, 3]), g.i64(0, 0, a.heads * a.head_dim)])
        return self.linear(out, p + "self_attn.o_proj.weight")

    def _heads_first(self, x: str, heads: int) -> str:
        g = self.g  # [B, T, H*D] -> [B, H, T, D]
        return g.op("Transpose", [g.op("Reshape", [x, g.i64(0, 0, heads, self.a.head_dim)])], perm=[0, 2, 1, 3])

    def _rope(self, x: str, cos: str, sin: str) -> str:
        """HF rotate_half rotary on [B, H, T, D] with cos/sin [T, D]."""
        g, half = self.g, self.a.head_dim // 2
        x1, x2 = g.op("Split", [x, g.i64(half, half)], "half", outputs=2, axis=-1)
        rot = g.op("Concat", [g.op("Neg", [x2]), x1], axis=-1)
        return g.op("Add", [g.op("Mul", [x, cos]), g.op("Mul", [rot, sin])], "rope")
