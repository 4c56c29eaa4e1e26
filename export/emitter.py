"""What both lowerings of a decoder graph share: the options, the node builder, and the layers
(embedding, projections, MLP, the decoder stack, the LM head). A lowering subclasses `Emitter`
with the three things it emits its own way (export/graph.py picks the class, the way
onnxruntime-genai's builder picks its attention op in `make_attention_op`):

  prepare_positions()          what the attention ops read, derived once from the input shapes
  rms_op(x, gamma, skip)       RMSNorm, optionally of x + skip (then also returns the sum)
  attention_op(q, k, v, layer) write the new K/V rows into the shared buffers, attend over them
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from specrt.runtime.bundle.manifest import KV_DTYPE, IONames

from . import nbits, quantize
from .arch import Arch
from .gguf_stream import weight_shape
from .quantize import QuantWeight

EMBED = "model.embed_tokens.weight"
KV_DTYPES = ("auto", "fp16")  # GraphOptions.kv_dtype: "auto" = the activations' dtype (KV_DTYPE)
KEEP_ALL = 1 << 30  # num_logits_to_keep's default: Slice clamps -KEEP_ALL to the first position


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
    kv_dtype: str = "auto"  # KV_DTYPES: "fp16" = float16 K/V buffers under float32 activations
    #                         (ort lowering: GroupQueryAttention then runs on float16, see kv_buffer_dtype())


def kv_buffer_dtype(opts: GraphOptions) -> np.dtype:
    """The dtype of `opts`' KV buffers: the activations' ("auto"), or float16. An fp16 cache under
    fp32 activations exists only in the `ort` lowering: GroupQueryAttention takes one type for
    q, k, v, past and its rotary tables, so the graph casts the projections to float16 before
    it and its output back after (docs/design.md, "fp16 KV")."""
    if opts.kv_dtype not in KV_DTYPES:
        raise ValueError(f"kv_dtype must be one of {KV_DTYPES}, got {opts.kv_dtype!r}")
    dtype = np.dtype(KV_DTYPE[opts.precision] if opts.kv_dtype == "auto" else "float16")
    if opts.lowering != "ort" and dtype != np.dtype(KV_DTYPE[opts.precision]):
        raise ValueError(f"kv_dtype {opts.kv_dtype} under {opts.precision} activations exists only in the 'ort' lowering")
    return dtype


class GraphBuilder:
    """Nodes + initializers with unique names."""

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


def head_key(arch: Arch, w: dict) -> str:
    """The checkpoint weight the LM head multiplies by."""
    return EMBED if "lm_head.weight" not in w or arch.tie_embeddings else "lm_head.weight"


def embedding_form(arch: Arch, w: dict, qw: dict, opts: GraphOptions) -> QuantWeight | None:
    """The GGUF blocks a weight-only graph (gguf, int4, int8) gathers its embedding from
    (`nbits.gather`; `qw[EMBED]`: the source file's token table, imported), or None for the fp32
    table: fp32 / fp16 graphs, the standard lowering (no contrib ops), a source with no GGUF
    blocks or none of an exact form, or an LM head that multiplies by the fp32 table itself (tied,
    float head: the Gemm shares the Gather's initializer). An int4 / int8 graph's tied head is
    quantized from the fp32 table (`Emitter.weight`), which the gather leaves it."""
    q = qw.get(EMBED) if opts.precision in nbits.WEIGHT_ONLY and opts.lowering == "ort" else None
    if q is None or q.bits not in (4, 8):
        return None
    head = opts.lm_head_precision or opts.precision
    shares = (nbits.runs_as_float(q, head, opts.int4_accuracy_level) if opts.precision == "gguf"
              else head in ("fp32", "fp16"))
    return None if head_key(arch, w) == EMBED and shares else q


class Emitter:
    """Emits one decoder graph into `graph`. weights: HF state dict as fp32 NumPy arrays;
    imported: HF name -> its imported GGUF form (precision gguf); io: the graph's IO names."""

    PACKED_QKV = False  # the attention op takes q, k and v as one packed [B, T, (Hq+2Hkv)D] input

    def __init__(self, graph: GraphBuilder, arch: Arch, weights: dict[str, np.ndarray], opts: GraphOptions,
                 imported: dict[str, QuantWeight], io: IONames):
        self.graph, self.arch, self.weights, self.opts, self.imported, self.io = graph, arch, weights, opts, imported, io
        self.kv_dtype = kv_buffer_dtype(opts)  # the KV buffers' (and the attention op's) numpy dtype
        self.block_sums: dict = {}  # (input, block) -> its block sums, for weights with mins

    # ---- what a lowering emits its own way -------------------------------------------------
    def prepare_positions(self) -> None:
        raise NotImplementedError

    def rms_op(self, x: str, gamma: str, skip: str | None):
        raise NotImplementedError

    def attention_op(self, q: str, k: str, v: str, layer: int) -> str:
        raise NotImplementedError

    # ---- shared layers -------------------------------------------------------------------
    def kv_names(self, layer: int) -> tuple[str, str, str, str]:
        """-> (past key, past value, present key, present value) of `layer`."""
        io = self.io
        return (io.past_key.format(i=layer), io.past_value.format(i=layer),
                io.present_key.format(i=layer), io.present_value.format(i=layer))

    def norm_weight(self, key: str) -> np.ndarray:
        return self.weights[key] + self.arch.family.norm_offset

    def linear(self, x: str, key: str) -> str:
        """x [B, T, in] @ W.T for the checkpoint weight `key` (HF layout [out, in])."""
        return self.project(x, key.replace("model.", "").replace(".weight", "").replace(".", "_"), self.weight(key))

    def project(self, x: str, hint: str, W, b: np.ndarray | None = None) -> str:
        """x [B, T, in] @ W.T (+ b); W: fp32 [out, in] or a QuantWeight, in the form
        `nbits.resolve` gives it for this graph."""
        g, level = self.graph, self.opts.int4_accuracy_level
        W = nbits.resolve(W, self.opts.precision, self.opts.int4_block_size, level)
        if isinstance(W, QuantWeight):
            return nbits.emit(g, x, hint, W, b, level, self.block_sums)
        y = g.op("MatMul", [x, g.weight(hint + "_wT", W.T)], hint)
        if b is not None:
            y = g.op("Add", [y, g.weight(hint + "_b", b)], hint + "_bias")
        return y

    def weight(self, key: str):
        """The checkpoint weight `key` as the graph's source holds it: its imported GGUF form
        where there is one (precision gguf), else fp32."""
        q = self.imported.get(key) if self.opts.precision == "gguf" else None
        return q if q is not None else self.weights[key]  # (a streamed model's weights are read on access)

    def head_source(self, key: str):
        """The LM head's weight as `weight` gives it; an RTN head (int4 / int8) of a streamed
        model quantized from row slabs of the file (`quantize.rtn_rows`: the same bytes), never
        its whole fp32 table (a 151k-token head: 0.5-0.9 GB)."""
        o = self.opts
        bits = nbits.QUANTIZED.get(o.lm_head_precision or o.precision)
        rows = getattr(self.weights, "rows", None)
        if o.precision == "gguf" or bits is None or rows is None:
            return self.weight(key)
        n, k = weight_shape(self.weights, key)
        return quantize.rtn_rows(lambda sl: rows(key, sl), n, k, o.int4_block_size, bits)

    def rms(self, x: str, key: str, skip: str | None = None):
        """RMSNorm over the last axis; with `skip`, normalizes x + skip and also returns the sum."""
        gamma = self.graph.weight(key.replace(".", "_"), self.norm_weight(key))
        return self.rms_op(x, gamma, skip)

    def head_norm(self, x: str, key: str, heads: int) -> str:
        """Per-head RMSNorm on [B, T, heads*D] (Qwen3 / Gemma 3 q_norm, k_norm)."""
        g, D = self.graph, self.arch.head_dim
        x4 = g.op("Reshape", [x, g.i64(0, 0, heads, D)])
        y = self.rms(x4, key)
        return g.op("Reshape", [y, g.i64(0, 0, heads * D)])

    def fused(self, x: str, keys: list[str], bias_keys: list[str | None], hint: str, split: bool = True):
        """Several projections of the same input as one MatMul ([out1+out2+..., in] weights);
        split back on the last axis unless `split` is False. Weights whose quantized forms differ
        (a GGUF's Q4_K q/k beside a Q6_K v) run as separate projections, concatenated."""
        o = self.opts
        sizes = [weight_shape(self.weights, k)[0] for k in keys]
        biases = [self.weights[bk] if bk else np.zeros(n, np.float32) for bk, n in zip(bias_keys, sizes, strict=True)]
        b = np.concatenate(biases) if any(bias_keys) else None
        name = keys[0].replace("model.", "").rsplit(".", 2)[0].replace(".", "_") + "_" + hint
        parts = [nbits.resolve(self.weight(k), o.precision, o.int4_block_size, o.int4_accuracy_level) for k in keys]
        if all(isinstance(p, np.ndarray) for p in parts):
            y = self.project(x, name, np.concatenate(parts, axis=0), b)
        elif all(isinstance(p, QuantWeight) for p in parts) and (one := quantize.fuse(parts)) is not None:
            y = self.project(x, name, one, b)
        else:
            ys = [self.project(x, f"{name}{j}", p, bb if any(bias_keys) else None)
                  for j, (p, bb) in enumerate(zip(parts, biases, strict=True))]
            y = self.graph.op("Concat", ys, name, axis=-1)
        if not split:
            return y
        return self.graph.op("Split", [y, self.graph.i64(*sizes)], hint, outputs=len(keys), axis=-1)

    def mlp(self, x: str, p: str) -> str:
        g = self.graph
        # gate and up as one [H, 2I] projection
        gate, up = self.fused(x, [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"], [None, None], "gate_up")
        if self.arch.family.activation == "silu":
            act = g.op("Mul", [gate, g.op("Sigmoid", [gate])], "silu")
        else:
            act = g.op("Gelu", [gate], "gelu", approximate="tanh")
        return self.linear(g.op("Mul", [act, up], "gated"), p + "mlp.down_proj.weight")

    def attention(self, x: str, layer: int, p: str) -> str:
        """Projections (+ q/k norms) -> the lowering's attention op -> o_proj."""
        arch, fam = self.arch, self.arch.family
        names = ("q_proj", "k_proj", "v_proj")
        keys = [p + f"self_attn.{n}.weight" for n in names]
        biases = [p + f"self_attn.{n}.bias" if fam.qkv_bias else None for n in names]
        if self.PACKED_QKV and not fam.qk_norm:  # one [H, (Hq+2Hkv)D] projection, key/value inputs empty
            q, k, v = self.fused(x, keys, biases, "qkv", split=False), "", ""
        else:
            q, k, v = self.fused(x, keys, biases, "qkv")
        if fam.qk_norm:
            q = self.head_norm(q, p + "self_attn.q_norm.weight", arch.heads)
            k = self.head_norm(k, p + "self_attn.k_norm.weight", arch.kv_heads)
        return self.linear(self.attention_op(q, k, v, layer), p + "self_attn.o_proj.weight")

    # ---- graph ---------------------------------------------------------------------------
    def embed(self) -> str:
        """input_ids -> h [B, T, H] (scaled, and mixed with the target's features for EAGLE)."""
        g, arch = self.graph, self.arch
        qe = embedding_form(arch, self.weights, self.imported, self.opts)
        if qe is not None:  # the GGUF's own blocks (nbits.gather)
            h = nbits.gather(g, self.io.input_ids, "embed_tokens", qe)
        else:
            emb = g.weight("embed_tokens", self.weights[EMBED])
            h = g.op("Gather", [emb, self.io.input_ids], "embed")  # [B, T, H]
        if arch.family.embed_scale:
            scale = np.array(np.sqrt(arch.hidden), dtype=g.dtype)
            h = g.op("Mul", [h, g.const("embed_scale", scale)])
        if self.opts.eagle:  # h = fc([embed(x_{p+1}), f_p])
            f_in = self.io.hidden_in
            f = g.op("Cast", [f_in], to=TensorProto.FLOAT16) if g.dtype == np.float16 else f_in
            h = self.project(g.op("Concat", [h, f], "eagle_in", axis=-1), "eagle_fc",
                             self.weights["eagle.fc.weight"], self.weights.get("eagle.fc.bias"))
        return h

    def build(self) -> None:
        g, arch, fam = self.graph, self.arch, self.arch.family
        self.prepare_positions()
        resid = self.embed()
        x = self.rms(resid, "model.layers.0.input_layernorm.weight")
        for i in range(arch.layers):
            p = f"model.layers.{i}."
            att = self.attention(x, i, p)
            if fam.attn_out_norm:
                att = self.rms(att, p + fam.attn_out_norm + ".weight")
            x, resid = self.rms(att, p + fam.mlp_norm + ".weight", skip=resid)
            m = self.mlp(x, p)
            if fam.mlp_out_norm:
                m = self.rms(m, p + fam.mlp_out_norm + ".weight")
            nxt = f"model.layers.{i + 1}.input_layernorm.weight" if i + 1 < arch.layers else "model.norm.weight"
            x, resid = self.rms(m, nxt, skip=resid)
        self.lm_head(x)
        if self.opts.hidden_out:
            to32 = g.dtype != np.float32
            g.op("Cast" if to32 else "Identity", [x], outputs=[self.opts.hidden_out], **({"to": TensorProto.FLOAT} if to32 else {}))

    def lm_head(self, x: str):
        g, arch, o, keep = self.graph, self.arch, self.opts, self.io.logits_to_keep
        if keep:  # only the last num_logits_to_keep positions go through the LM head
            g.const(keep, np.array([KEEP_ALL], dtype=np.int64))
            x = g.op("Slice", [x, g.op("Neg", [keep]), g.i64(np.iinfo(np.int64).max), g.i64(1)], "keep")
        key = head_key(arch, self.weights)
        head = nbits.resolve(self.head_source(key), o.lm_head_precision or o.precision, o.int4_block_size,
                             o.int4_accuracy_level)
        # float and equal to the embedding (a gguf import's weights are the fp32 ones, checked on import)
        if isinstance(head, np.ndarray) and arch.tie_embeddings and (o.precision == "gguf" or (o.lm_head_precision or o.precision) in ("fp32", "fp16")):
            # Share the embedding initializer: Gemm(transB=1) on [B*T, H] avoids a transposed copy.
            x2 = g.op("Reshape", [x, g.i64(-1, arch.hidden)])
            y2 = g.op("Gemm", [x2, "embed_tokens"], "lm_head", transB=1)
            # [B, n] (the standard lowering has no Slice: its graph stays as TensorRT has run it)
            shape = g.op("Shape", [x], end=2) if keep else g.op("Shape", [self.io.input_ids])
            out_shape = g.op("Concat", [shape, g.i64(arch.vocab)], axis=0)
            logits = g.op("Reshape", [y2, out_shape])
        else:
            logits = self.project(x, "lm_head", head)
        if g.dtype != np.float32:
            g.op("Cast", [logits], outputs=[self.io.logits], to=TensorProto.FLOAT)
        else:
            g.op("Identity", [logits], outputs=[self.io.logits])
