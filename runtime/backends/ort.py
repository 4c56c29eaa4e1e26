"""onnxruntime backend: one InferenceSession + IOBinding over buffers allocated once.

Buffers (allocated in __init__, never reallocated):
  KV       one OrtValue per layer and K/V, [1, Hkv, S_max, D], on the EP's device, bound as both
           past_key_values.{i}.* input and present.{i}.* output (in-place update).
  ids      int64 [1, max_T] host; rows [0, T) bound as input_ids [1, T].
  mask     int64 [1, S_max] host, all ones; its first P+T entries bound as attention_mask.
  logits   float32 [max_T * V] host; bound as logits [1, T, V]; `run` returns a view of it.
  hidden   float32 [max_T, H] host, when the graph has them: the final-norm hidden states output
           (`hidden` after a call) and the EAGLE draft's feature input (`run(..., hidden=)`).
Rebinding ids/mask/logits per call only points onnxruntime at a prefix of these buffers.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort

from ..hugepages import anonymous_pages, collapse
from ..manifest import ModelEntry
from .features import FeatureBuffers

_NP = {"float32": np.float32, "float16": np.float16}


_GLOBAL_POOL: int | None = None


PREFILL_TOKENS = 64  # widest prompt chunk on onnxruntime (logits buffer 64 x V floats)


def use_global_pool(threads: int) -> bool:
    """Ask for one process-wide intra-op pool shared by all sessions. Must happen before the
    first session of the process exists, and from then on *every* onnxruntime session in the
    process must opt out of per-session threads, so only whoever owns the process (the CLI)
    should ask. Returns whether the global pool of that size is in effect."""
    global _GLOBAL_POOL
    if _GLOBAL_POOL is None:
        try:
            from onnxruntime.capi import _pybind_state

            _pybind_state.set_global_thread_pool_sizes(threads, 1)
            _GLOBAL_POOL = threads
        except Exception:  # environment already created: per-session pools
            _GLOBAL_POOL = -1
    return _GLOBAL_POOL == threads


def session_options(threads: int | None = None, spin: bool = True, global_pool: bool = False) -> ort.SessionOptions:
    """Draft and target sessions alternate on the same cores. Spinning workers pick up the next
    kernel without a futex wake-up (fp32 target on 2 cores: 64 -> 30 ms/token), but a pool that
    keeps spinning after its run steals the cores from the other session's run, so each run ends
    its spinning (`session.force_spinning_stop`). A global pool (one for all sessions) measured
    another ~5% faster; see docs/benchmarks.md."""
    threads = threads or os.cpu_count() or 1
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    if global_pool and use_global_pool(threads):
        so.use_per_session_threads = False
    else:
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.add_session_config_entry("session.force_spinning_stop", "1")
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    # Prepacking the fp32 weights is ~95% of building a session; packing them on all threads
    # took the default pair's load from 1.1-1.7 s to 0.7-0.9 s, with bit-identical outputs.
    so.add_session_config_entry("session.prepack.enable_parallel", "1")
    return so


def pick_providers(device: str) -> tuple[list[str], str]:
    """'cpu' | 'cuda' -> (providers, ort device_type for buffers). Falls back to CPU with a warning."""
    if device == "cuda":
        if "CUDAExecutionProvider" in ort.get_available_providers():
            return ["CUDAExecutionProvider", "CPUExecutionProvider"], "cuda"
        warnings.warn("CUDA execution provider not available (install specrt[gpu]); using CPU", stacklevel=3)
    return ["CPUExecutionProvider"], "cpu"


class OrtBackend(FeatureBuffers):
    def __init__(
        self,
        graph: str | Path,
        entry: ModelEntry,
        *,
        device: str = "cpu",
        threads: int | None = None,
        spin: bool = True,
        global_pool: bool = False,
        max_tokens_per_call: int | None = None,
        prefill_tokens: int = PREFILL_TOKENS,
        hugepages: bool = False,
        kv_from: OrtBackend | None = None,
    ):
        """hugepages: move the memory this session allocates (prepacked weights, KV, buffers) onto
        2 MiB pages once it is built (runtime/hugepages.py; CPU, Linux >= 6.1).
        kv_from: bind that backend's KV buffers instead of allocating (a self-draft over its
        target's cache: both on the host with the same KV layout, else ignored). The two then
        write the same rows; the caller keeps each below the other's committed length (see
        ModelDrafter)."""
        providers, self.device_type = pick_providers(device)
        before = anonymous_pages() if hugepages and self.device_type == "cpu" else None
        so = session_options(threads, spin, global_pool)
        self.session = ort.InferenceSession(str(graph), so, providers=providers)
        self.entry = entry
        kv = entry.kv
        self.vocab = entry.vocab_size
        self.max_seq_len = kv.max_seq_len
        self.max_t = max_tokens_per_call or entry.max_tokens_per_call
        self._init_features(entry, self.max_t)
        # prompt chunks may be wider than a verification call: one call streams the weights once
        # (a 40-token prompt was 3 calls of <= 17). Graphs with EAGLE feature IO keep max_t.
        feature_io = self.takes_hidden or self.has_hidden_out
        self.max_prefill_t = self.max_t if feature_io else max(self.max_t, prefill_tokens)
        dtype = _NP[kv.dtype]
        shape = [1, kv.kv_heads, kv.max_seq_len, kv.head_dim]
        io_names = entry.io
        self.io = self.session.io_binding()
        shared = (kv_from is not None and self.device_type == "cpu"
                  and kv_from.host_kv_layout() == [(tuple(shape), np.dtype(dtype))] * (2 * kv.layers))
        # (host array or None, OrtValue) per layer and K/V; keeps both alive
        self._kv: list = kv_from._kv if shared else [self._kv_buffer(shape, dtype) for _ in range(2 * kv.layers)]
        self.kv_owner = kv_from if shared else None  # whose cache this backend writes into
        for i in range(kv.layers):
            for j, (past, present) in enumerate(((io_names.past_key, io_names.present_key),
                                                 (io_names.past_value, io_names.present_value))):
                val = self._kv[2 * i + j][1]
                self.io.bind_ortvalue_input(past.format(i=i), val)
                self.io.bind_ortvalue_output(present.format(i=i), val)
        self._ids = np.zeros((1, self.max_prefill_t), dtype=np.int64)
        self._mask = np.ones((1, kv.max_seq_len), dtype=np.int64)
        self._logits = np.empty(self.max_prefill_t * self.vocab, dtype=np.float32)
        self._logits.fill(0)  # commit the pages now: RSS stays flat during generation
        self._names = (io_names.input_ids, io_names.attention_mask, io_names.logits)
        self._keep = np.zeros(1, dtype=np.int64) if io_names.logits_to_keep else None
        self.hugepage_bytes = collapse(anonymous_pages() - before) if before is not None else 0

    def run(self, tokens: np.ndarray, past_len: int, hidden: np.ndarray | None = None,
            keep: int | None = None) -> np.ndarray:
        """tokens int64 [T] (T <= max_prefill_t) at positions [past_len, past_len + T) -> logits
        [n, V] of the last n = min(keep, T) positions (all T when keep is None or the graph has
        no `logits_to_keep` input). hidden [T, H]: feature input of an EAGLE draft (ignored by
        graphs without one)."""
        T = len(tokens)
        self._ids[0, :T] = tokens
        ids, mask, logits = self._names
        io = self.io
        io.bind_input(ids, "cpu", 0, np.int64, [1, T], self._ids.ctypes.data)
        io.bind_input(mask, "cpu", 0, np.int64, [1, past_len + T], self._mask.ctypes.data)
        n = T
        if self._keep is not None:
            n = T if keep is None else max(1, min(keep, T))
            self._keep[0] = n
            io.bind_input(self.entry.io.logits_to_keep, "cpu", 0, np.int64, [1], self._keep.ctypes.data)
        io.bind_output(logits, "cpu", 0, np.float32, [1, n, self.vocab], self._logits.ctypes.data)
        if self._h_in is not None:
            if hidden is not None:
                self._h_in[:T] = hidden
            io.bind_input(self.entry.io.hidden_in, "cpu", 0, np.float32, [1, T, self.hidden_size], self._h_in.ctypes.data)
        if self._h_out is not None:
            io.bind_output(self.entry.io.hidden_out, "cpu", 0, np.float32, [1, T, self.hidden_size], self._h_out.ctypes.data)
            self.hidden = self._h_out[:T]
        self.session.run_with_iobinding(io)
        return self._logits[: n * self.vocab].reshape(n, self.vocab)

    def _kv_buffer(self, shape, dtype):
        if self.device_type == "cpu":
            # fill() touches every page now: RSS is the full KV size from load on
            # (np.zeros would commit pages lazily and RSS would grow during generation)
            host = np.empty(shape, dtype=dtype)
            host.fill(0)
            return host, ort.OrtValue.ortvalue_from_numpy(host)
        return None, ort.OrtValue.ortvalue_from_shape_and_type(shape, dtype, self.device_type, 0)

    def host_kv_layout(self) -> list | None:
        """[(shape, dtype)] of every K/V buffer where they live on the host, else None."""
        if self.device_type != "cpu":
            return None
        return [(h.shape, h.dtype) for h, _ in self._kv]

    def shares_kv(self, other) -> bool:
        return self._kv is getattr(other, "_kv", None)

    def copy_kv_rows(self, src, n: int, start: int = 0) -> bool:
        """Overwrite KV rows [start, n) of every layer with `src`'s (another OrtBackend with the
        same KV layout, both on the host). Returns False, copying nothing, where that does not
        hold; True at once where the two share their buffers (the rows are already there)."""
        if self.shares_kv(src):
            return True
        layout = self.host_kv_layout()
        if layout is None or not hasattr(src, "host_kv_layout") or src.host_kv_layout() != layout:
            return False
        for (dst, _), (s, _) in zip(self._kv, src._kv, strict=True):
            dst[:, :, start:n] = s[:, :, start:n]
        return True

    def kv_host(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """Host views of one layer's K and V buffers (CPU only; for tests and debugging)."""
        return self._kv[2 * layer][0], self._kv[2 * layer + 1][0]
