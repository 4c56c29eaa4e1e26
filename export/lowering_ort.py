"""The `ort` lowering: onnxruntime contrib ops. GroupQueryAttention takes the packed QKV
projection, rotates q and k itself (`do_rotary`, half cos/sin tables) and writes the new K/V rows
into the buffer bound as both past and present; SimplifiedLayerNormalization and
SkipSimplifiedLayerNormalization (residual add + norm in one node) for RMSNorm.

An fp16 KV cache under fp32 activations (`kv_dtype = "fp16"`): GQA has one type T for q, k, v,
past/present and the rotary tables, so q/k/v are cast to float16 before it, the tables are
float16, and its output is cast back (onnxruntime's CPU kernel computes QK^T, softmax and PV in
float32 over the float16 rows, then rounds the output to float16)."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from .emitter import Emitter
from .nbits import MS


class OrtEmitter(Emitter):
    PACKED_QKV = True  # GQA splits q, k, v itself (not when q/k norms sit between)

    def prepare_positions(self) -> None:
        """GQA's seqlens_k = total - 1 per batch row (int32), total as an int32 scalar, and the
        half rotary tables per rope kind."""
        g, io = self.graph, self.io
        total = g.op("Gather", [g.op("Shape", [io.attention_mask]), g.i64(1)], "total")  # [1]
        mask_sum = g.op("ReduceSum", [io.attention_mask, g.i64(1)], keepdims=0)
        self.seqlens_k = g.op("Cast", [g.op("Sub", [mask_sum, g.i64(1)])], "seqlens_k", to=TensorProto.INT32)
        self.total_len = g.op("Cast", [g.op("Squeeze", [total])], "total_len", to=TensorProto.INT32)
        self.rotary = {}  # rope kind -> (cos, sin) half tables [S_max, D/2] (rotate_half layout)
        half = self.arch.head_dim // 2
        for kind, (cos, sin) in self.arch.rope.items():
            self.rotary[kind] = (g.const(f"cos_cache_{kind}", cos[:, :half].astype(self.kv_dtype)),
                                 g.const(f"sin_cache_{kind}", sin[:, :half].astype(self.kv_dtype)))

    def rms_op(self, x: str, gamma: str, skip: str | None):
        g, eps = self.graph, self.arch.eps
        if skip is None:
            return g.op("SimplifiedLayerNormalization", [x, gamma], "norm", axis=-1, epsilon=eps)
        out, _, _, total = g.op("SkipSimplifiedLayerNormalization", [x, skip, gamma], "skipnorm",
                                outputs=4, domain=MS, epsilon=eps)
        return out, total

    def attention_op(self, q: str, k: str, v: str, layer: int) -> str:
        g, arch = self.graph, self.arch
        past_k, past_v, pres_k, pres_v = self.kv_names(layer)
        cos, sin = self.rotary[arch.rope_kind[layer]]
        cast = self.kv_dtype != np.dtype(g.dtype)  # GQA runs in the KV dtype (module docstring)
        if cast:
            to = helper.np_dtype_to_tensor_dtype(self.kv_dtype)
            q, k, v = (g.op("Cast", [x], "kv_cast", to=to) if x else "" for x in (q, k, v))
        out = g.op(
            "GroupQueryAttention",
            [q, k, v, past_k, past_v, self.seqlens_k, self.total_len, cos, sin],
            f"attn{layer}", outputs=[g.name(f"attn{layer}"), pres_k, pres_v], domain=MS,
            num_heads=arch.heads, kv_num_heads=arch.kv_heads, scale=arch.attn_scale,
            do_rotary=1, rotary_interleaved=0, local_window_size=arch.windows[layer] or -1,
        )[0]
        return g.op("Cast", [out], "attn_f", to=helper.np_dtype_to_tensor_dtype(np.dtype(g.dtype))) if cast else out
