"""TensorRT backend: a deserialized engine + device buffers allocated once (cuda-python).

Same protocol as `ort.py`: run(tokens[T], past_len[, hidden]) -> logits [T, V] (host view, owned
here); `hidden` / `takes_hidden` / `has_hidden_out` for EAGLE pairs as there.
KV: when the engine aliases present.{i}.* to past_key_values.{i}.* (TensorRT's KV-cache update
layer, `get_aliased_input_tensor`), both names get the same device pointer and the update is in
place. Otherwise the backend double-buffers: present is a second buffer and the two swap roles
after each call (TensorScatter then writes the whole cache; correct, but more traffic).
Rewinds never move data: rows past P+T are masked by the next call's attention_mask length.
tensorrt and cuda-python are imported lazily (extra `trt`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..bundle.manifest import ModelEntry
from .cudart import ck as _ck
from .cudart import cudart as _cuda
from .features import FeatureBuffers


def gpu_tag() -> str:
    """'<name>-sm<major><minor>' of device 0 (plans are specific to GPU and TensorRT version)."""
    cudart = _cuda()
    err, prop = cudart.cudaGetDeviceProperties(0)
    if int(err) != 0:
        raise RuntimeError(f"cudaGetDeviceProperties failed: {err}")
    name = prop.name.decode() if isinstance(prop.name, bytes) else str(prop.name)
    return f"{name.replace(' ', '_')}-sm{prop.major}{prop.minor}"


class TrtBackend(FeatureBuffers):
    def __init__(self, plan: str | Path, entry: ModelEntry):
        try:
            import tensorrt as trt
        except ImportError as e:
            raise RuntimeError(f"TensorRT is not installed (pip install 'specrt[trt]'): {e}") from None
        cu = self.cu = _cuda()
        self.entry = entry
        kv, io = entry.kv, entry.io
        self.vocab = entry.vocab_size
        self.max_seq_len = kv.max_seq_len
        self.max_t = entry.max_tokens_per_call
        self.max_prefill_t = self.max_t  # the engine's optimization profile ends at max_t
        self.logger = trt.Logger(trt.Logger.WARNING)
        self.engine = trt.Runtime(self.logger).deserialize_cuda_engine(Path(plan).read_bytes())
        if self.engine is None:
            raise RuntimeError(f"could not deserialize TensorRT plan {plan} (built for another GPU or TensorRT?)")
        self.ctx = self.engine.create_execution_context()
        self.stream = _ck(cu.cudaStreamCreate())
        self._ptrs: list[int] = []

        def alloc(nbytes: int) -> int:
            ptr = _ck(cu.cudaMalloc(nbytes))
            _ck(cu.cudaMemset(ptr, 0, nbytes))
            self._ptrs.append(ptr)
            return ptr

        kv_bytes = kv.kv_heads * kv.max_seq_len * kv.head_dim * kv.itemsize
        kv_shape = (1, kv.kv_heads, kv.max_seq_len, kv.head_dim)
        self.pairs = []  # (past name, present name, past ptr, present ptr)
        for i in range(kv.layers):
            for past_t, pres_t in ((io.past_key, io.present_key), (io.past_value, io.present_value)):
                past, pres = past_t.format(i=i), pres_t.format(i=i)
                aliased = getattr(self.engine, "get_aliased_input_tensor", lambda n: None)(pres) == past
                p = alloc(kv_bytes)
                q = p if aliased else alloc(kv_bytes)
                self.ctx.set_input_shape(past, kv_shape)
                self.pairs.append([past, pres, p, q])
        self.in_place = all(p == q for _, _, p, q in self.pairs)
        self._bind_kv()

        self.ids_name, self.mask_name, self.logits_name = io.input_ids, io.attention_mask, io.logits
        self.ids_dev = alloc(self.max_t * 8)
        self.mask_dev = alloc(kv.max_seq_len * 8)
        ones = np.ones(kv.max_seq_len, dtype=np.int64)
        _ck(cu.cudaMemcpy(self.mask_dev, ones.ctypes.data, ones.nbytes, cu.cudaMemcpyKind.cudaMemcpyHostToDevice))
        self.logits_dev = alloc(self.max_t * self.vocab * 4)
        self._logits = np.empty(self.max_t * self.vocab, dtype=np.float32)
        self._ids = np.zeros(self.max_t, dtype=np.int64)
        self.ctx.set_tensor_address(self.ids_name, self.ids_dev)
        self.ctx.set_tensor_address(self.mask_name, self.mask_dev)
        self.ctx.set_tensor_address(self.logits_name, self.logits_dev)
        # final-norm hidden states out (target of an EAGLE pair) / target features in (EAGLE draft)
        self._init_features(entry, self.max_t)
        if self.has_hidden_out:
            self._h_out_dev = alloc(self._h_out.nbytes)
            self.ctx.set_tensor_address(io.hidden_out, self._h_out_dev)
        if self.takes_hidden:
            self._h_in_dev = alloc(self._h_in.nbytes)
            self.ctx.set_tensor_address(io.hidden_in, self._h_in_dev)

    def _bind_kv(self):
        for past, pres, p, q in self.pairs:
            self.ctx.set_tensor_address(past, p)
            self.ctx.set_tensor_address(pres, q)

    def run(self, tokens: np.ndarray, past_len: int, hidden: np.ndarray | None = None,
            keep: int | None = None) -> np.ndarray:
        """As OrtBackend.run; `keep` is ignored (standard-lowering graphs have no logits_to_keep
        input): all T rows come back and callers use the last ones."""
        cu = self.cu
        T, H = len(tokens), self.hidden_size
        self._ids[:T] = tokens
        h2d, d2h = cu.cudaMemcpyKind.cudaMemcpyHostToDevice, cu.cudaMemcpyKind.cudaMemcpyDeviceToHost
        _ck(cu.cudaMemcpyAsync(self.ids_dev, self._ids.ctypes.data, T * 8, h2d, self.stream))
        self.ctx.set_input_shape(self.ids_name, (1, T))
        self.ctx.set_input_shape(self.mask_name, (1, past_len + T))
        if self._h_in is not None:
            if hidden is not None:
                self._h_in[:T] = hidden
            _ck(cu.cudaMemcpyAsync(self._h_in_dev, self._h_in.ctypes.data, T * H * 4, h2d, self.stream))
            self.ctx.set_input_shape(self.entry.io.hidden_in, (1, T, H))
        if not self.ctx.execute_async_v3(int(self.stream)):
            raise RuntimeError("TensorRT execution failed")
        _ck(cu.cudaMemcpyAsync(self._logits.ctypes.data, self.logits_dev, T * self.vocab * 4, d2h, self.stream))
        if self._h_out is not None:
            _ck(cu.cudaMemcpyAsync(self._h_out.ctypes.data, self._h_out_dev, T * H * 4, d2h, self.stream))
            self.hidden = self._h_out[:T]
        _ck(cu.cudaStreamSynchronize(self.stream))
        if not self.in_place:  # double-buffered KV: the updated cache becomes next call's past
            for pair in self.pairs:
                pair[2], pair[3] = pair[3], pair[2]
            self._bind_kv()
        return self._logits[: T * self.vocab].reshape(T, self.vocab)

    def __del__(self):
        cu = getattr(self, "cu", None)
        for ptr in getattr(self, "_ptrs", []):
            cu.cudaFree(ptr)
