"""The `standard` lowering: standard ONNX ops only (opset 24), for TensorRT. TensorScatter writes
the new K/V rows at the write index into the buffer bound as both past and present; Attention
reads them with an explicit boolean mask [T, S_max] (causal, or causal within a sliding window),
never `is_causal`, whose alignment with an external cache is top-left; RMSNorm and rotary as plain
arithmetic. Also runs on onnxruntime CPU, where its numerics are tested."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from .emitter import Emitter


class StandardEmitter(Emitter):
    def prepare_positions(self) -> None:
        """P (committed length, the write index per row), the absolute positions of the T new
        tokens, their cos/sin rows per rope kind and the attention masks per window size."""
        g, io = self.graph, self.io
        total = g.op("Gather", [g.op("Shape", [io.attention_mask]), g.i64(1)], "total")  # [1]
        T = g.op("Gather", [g.op("Shape", [io.input_ids]), g.i64(1)], "T")  # [1]
        P = g.op("Sub", [total, T], "P")  # [1] write index
        batch = g.op("Gather", [g.op("Shape", [io.input_ids]), g.i64(0)], "B")
        self.write_idx = g.op("Expand", [P, batch], "write_idx")  # [B]
        zero = g.const("zero_i64", np.array(0, dtype=np.int64))
        one = g.const("one_i64", np.array(1, dtype=np.int64))
        Ts, Ps = g.op("Squeeze", [T]), g.op("Squeeze", [P])
        qpos = g.op("Add", [g.op("Range", [zero, Ts, one]), Ps], "qpos")  # [T] absolute positions
        self.rotary = {}  # rope kind -> (cos, sin) [T, D] at the new tokens' positions
        for kind, (cos, sin) in self.arch.rope.items():
            c = g.op("Gather", [g.weight(f"cos_{kind}", cos), qpos], "cos")
            s = g.op("Gather", [g.weight(f"sin_{kind}", sin), qpos], "sin")
            self.rotary[kind] = (c, s)
        smax = g.op("Squeeze", [g.op("Gather", [g.op("Shape", [io.past_key.format(i=0)]), g.i64(2)])])
        kpos = g.op("Unsqueeze", [g.op("Range", [zero, smax, one]), g.i64(0)], "kpos")  # [1, S]
        q2 = g.op("Unsqueeze", [qpos, g.i64(1)], "qpos2")  # [T, 1]
        causal = g.op("LessOrEqual", [kpos, q2], "causal")  # [T, S]
        self.masks = {0: causal}  # window size (0: none) -> bool mask [T, S_max]
        for win in set(self.arch.windows) - {0}:
            lo = g.op("Sub", [q2, g.i64(win)])
            self.masks[win] = g.op("And", [causal, g.op("Greater", [kpos, lo])], "window")

    def rms_op(self, x: str, gamma: str, skip: str | None):
        total = self.graph.op("Add", [x, skip], "resid") if skip is not None else x
        out = self._rms_plain(total, gamma)
        return (out, total) if skip is not None else out

    def _rms_plain(self, x: str, gamma: str) -> str:
        g = self.graph
        xf = g.op("Cast", [x], "norm_f32", to=TensorProto.FLOAT) if g.dtype == np.float16 else x
        ms = g.op("ReduceMean", [g.op("Mul", [xf, xf]), g.i64(-1)], keepdims=1)
        eps = g.const(g.name("eps"), np.array(self.arch.eps, dtype=np.float32))
        inv = g.op("Reciprocal", [g.op("Sqrt", [g.op("Add", [ms, eps])])])
        y = g.op("Mul", [xf, inv])
        if g.dtype == np.float16:
            y = g.op("Cast", [y], to=TensorProto.FLOAT16)
        return g.op("Mul", [y, gamma], "norm")

    def attention_op(self, q: str, k: str, v: str, layer: int) -> str:
        g, arch = self.graph, self.arch
        past_k, past_v, pres_k, pres_v = self.kv_names(layer)
        cos, sin = self.rotary[arch.rope_kind[layer]]
        q4 = self._heads_first(q, arch.heads)
        k4 = self._heads_first(k, arch.kv_heads)
        v4 = self._heads_first(v, arch.kv_heads)
        q4, k4 = self._rope(q4, cos, sin), self._rope(k4, cos, sin)
        g.op("TensorScatter", [past_k, k4, self.write_idx], outputs=[pres_k], axis=2)
        g.op("TensorScatter", [past_v, v4, self.write_idx], outputs=[pres_v], axis=2)
        o4 = g.op("Attention", [q4, pres_k, pres_v, self.masks[arch.windows[layer]]], f"attn{layer}", scale=arch.attn_scale)
        return g.op("Reshape", [g.op("Transpose", [o4], perm=[0, 2, 1, 3]), g.i64(0, 0, arch.heads * arch.head_dim)])

    def _heads_first(self, x: str, heads: int) -> str:
        g = self.graph  # [B, T, H*D] -> [B, H, T, D]
        return g.op("Transpose", [g.op("Reshape", [x, g.i64(0, 0, heads, self.arch.head_dim)])], perm=[0, 2, 1, 3])

    def _rope(self, x: str, cos: str, sin: str) -> str:
        """HF rotate_half rotary on [B, H, T, D] with cos/sin [T, D]."""
        g, half = self.graph, self.arch.head_dim // 2
        x1, x2 = g.op("Split", [x, g.i64(half, half)], "half", outputs=2, axis=-1)
        rot = g.op("Concat", [g.op("Neg", [x2]), x1], axis=-1)
        return g.op("Add", [g.op("Mul", [x, cos]), g.op("Mul", [rot, sin])], "rope")
