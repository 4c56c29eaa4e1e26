"""onnxruntime backend: one InferenceSession whose IO bindings point into buffers allocated once.

`OrtModel` runs one graph over a `KVPool` (runtime/backends/kvpool.py). Buffers, never reallocated:
  KV       the pool's [slots, Hkv, S, D] per layer and K/V (S: the pool's capacity, the
           bundle's S_max or a shorter load-time max_seq_len); a call over slots [lo, lo + b)
           binds rows [lo, lo + b) as both past_key_values.{i}.* and present.{i}.* (in place).
           One IOBinding per slot range, made on first use and kept: a call rebinds only ids,
           mask and logits.
  ids      int64 [rows] host; the call's tokens.
  mask     int64 [slots * S] host; a call of b rows binds [b, W] of it (row r: P_r + T ones,
           then zeros: right padding, from which GQA reads each row's own past length).
  logits   float32 [rows * V] host; bound as logits [b, T, V]; `run*` return views of it.
  hidden   float32 [rows, H] host, when the graph has them: the final-norm hidden states output
           (`hidden` after a call) and the EAGLE draft's feature input.
rows = max(slots, widest prompt chunk). Two call shapes:
  run(slot, tokens[T], past)       one sequence, T tokens (prefill chunk, verification);
  run_rows(lo, tokens[b], pasts[b]) b sequences of one token each, one call (`batch_rows`:
      the `ort` lowering, whose GroupQueryAttention takes B > 1 rows at T = 1 with ragged
      pasts; it rejects B > 1 with T > 1 and a past, and the standard lowering's TensorScatter
      takes one write offset for all rows of this graph).
`OrtBackend` is the one-sequence form (a one-slot pool of its own) that `SequenceHarness` drives:
export validation, graph tests and single-sequence tools.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort

from .. import kernels as kernel_library
from ..bundle.hugepages import anonymous_pages, collapse
from ..bundle.manifest import ModelEntry
from .features import FeatureBuffers
from .kvpool import KVPool
from .protocol import PoolModel

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


# onnxruntime's key (include/onnxruntime/core/session/onnxruntime_session_options_config_keys.h);
# an unknown key is accepted silently, so tests/runtime/backends/test_ort_backend.py checks its effect
DISABLE_PREPACKING = "session.disable_prepacking"
# graphs of MatMulNBits weights (export/nbits.py WEIGHT_ONLY): always packed, since at
# accuracy_level 4 MatMulNBits computes in fp32 without its packed form (another model)
PACKED_PRECISIONS = ("int8", "int4", "gguf")


def session_options(threads: int | None = None, spin: bool = True, global_pool: bool = False,
                    prepack: bool = True, kernels: bool = False) -> ort.SessionOptions:
    """Draft and target sessions alternate on the same cores. Spinning workers pick up the next
    kernel without a futex wake-up (about twice as fast a target step here), but a pool that
    keeps spinning after its run steals the cores from the other session's run, so each run ends
    its spinning (`session.force_spinning_stop`). A global pool (one for all sessions) is a little
    faster still: no wake-up between draft and target (numbers: docs/benchmarks.md §1)."""
    threads = threads or os.cpu_count() or 1
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 4  # fatal only: every error also comes back as the exception we report
    # once a global pool exists, onnxruntime refuses sessions with threads of their own
    if (global_pool and use_global_pool(threads)) or (_GLOBAL_POOL or 0) > 0:
        so.use_per_session_threads = False
    else:
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.add_session_config_entry("session.force_spinning_stop", "1")
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    # Weights are packed one kernel after another: onnxruntime's parallel prepacking
    # (`session.prepack.enable_parallel`) loads faster, but an export under load once computed
    # other numbers from a session built with it (docs/design.md, "Prepacking is serial").
    so.add_session_config_entry("session.prepack.enable_parallel", "0")
    if not prepack:  # a session that runs a few calls (export checks): packing would hold the raw
        # initializers beside their packed copy while it is built, twice the weights at its peak
        so.add_session_config_entry(DISABLE_PREPACKING, "1")
    if kernels:  # a graph rewritten onto specrt's own operators (export/kernel_graph.py)
        kernel_library.register(so)
    return so


def prefill_width(entry: ModelEntry, prefill_tokens: int = PREFILL_TOKENS) -> int:
    """Widest call (tokens) a model of this entry takes: prompt chunks may be wider than a
    verification call, since one call streams the weights once (a 40-token prompt was 3 calls
    of <= 17); graphs with EAGLE feature IO keep max_t (their feature buffers are max_t rows)."""
    if entry.io.hidden_in or entry.io.hidden_out:
        return entry.max_tokens_per_call
    return max(entry.max_tokens_per_call, prefill_tokens)


def pick_providers(device: str) -> tuple[list[str], str]:
    """'cpu' | 'cuda' -> (providers, ort device_type for buffers). Falls back to CPU with a warning."""
    if device == "cuda":
        if "CUDAExecutionProvider" in ort.get_available_providers():
            return ["CUDAExecutionProvider", "CPUExecutionProvider"], "cuda"
        warnings.warn("CUDA execution provider not available (install specrt[gpu]); using CPU", stacklevel=3)
    return ["CPUExecutionProvider"], "cpu"


def numerics_min_t(entry: ModelEntry) -> int:
    """The narrowest call whose rows equal what any wider call computes for the same positions
    (docs/design.md, "One-token calls of int8-activation graphs"). MatMulNBits at
    accuracy_level 4 quantizes activations to int8 per block, which turns the last-bit
    differences of onnxruntime's one-token kernels (attention's decode path, M = 1 GEMV) into
    differences of a quantization step: measured on the coder target (Q4_K_M, level 4) one-token
    and two-token calls disagree by up to 0.84 in a logit, while calls of 2, 3, 6 and 17 tokens
    agree bit for bit, rows at any place in the call. Such a target never runs a one-token call."""
    return 2 if entry.quantization.get("accuracy_level") == 4 else 1


class OrtModel(FeatureBuffers, PoolModel):
    kernels = False  # a bundle graph: onnxruntime's own operators (PackedModel may run specrt's)

    def __init__(
        self,
        graph: str | Path,
        entry: ModelEntry,
        pool: KVPool,
        *,
        track: str = "model",
        threads: int | None = None,
        global_pool: bool = False,
        prefill_tokens: int = PREFILL_TOKENS,
        prepack: bool = True,
    ):
        """pool: the KV buffers this graph reads and writes (its `entry.kv` layout; a self-draft
        passes its target's pool). track: this model's name in the pool's length bookkeeping."""
        if pool.layout != entry.kv:
            raise ValueError(f"{graph}: KV layout {entry.kv} does not match the pool's {pool.layout}")
        providers, self.device_type = pick_providers(pool.device)
        if self.device_type != pool.device:
            raise ValueError(f"KV pool on {pool.device!r} but the session runs on {self.device_type!r}")
        so = session_options(threads, global_pool=global_pool, prepack=prepack or entry.precision in PACKED_PRECISIONS)
        self.session = ort.InferenceSession(str(graph), so, providers=providers)
        self.entry, self.pool, self.track = entry, pool, pool.track(track)
        self.name = track
        self.vocab = entry.vocab_size
        self.max_seq_len = pool.capacity  # the bundle's S_max, or the load's max_seq_len
        self.max_t = entry.max_tokens_per_call
        self.max_prefill_t = prefill_width(entry, prefill_tokens)
        self.batch_rows = entry.lowering == "ort"
        self.min_t = numerics_min_t(entry)
        rows = max(pool.slots, self.max_prefill_t)  # runtime/bundle/memory.py counts these buffers
        self._init_features(entry, rows)
        self._ids = np.zeros(rows, dtype=np.int64)
        self._mask = np.zeros(pool.slots * pool.capacity, dtype=np.int64)
        self._logits = np.empty(rows * self.vocab, dtype=np.float32)
        self._logits.fill(0)  # commit the pages now: RSS stays flat during generation
        self._keep = np.zeros(1, dtype=np.int64) if entry.io.logits_to_keep else None
        self._bindings: dict[tuple[int, int], ort.IOBinding] = {}

    def _binding(self, lo: int, b: int):
        """The IOBinding for slots [lo, lo + b), its KV bound once."""
        io = self._bindings.get((lo, b))
        if io is None:
            pool, names = self.pool, self.entry.io
            if not pool.ptrs:
                raise RuntimeError(f"{self.name}: the KV pool has no buffers yet (KVPool.allocate)")
            io = self.session.io_binding()
            shape = [b, *pool.slot_shape]
            for i in range(pool.layout.layers):
                for j, (past, present) in enumerate(((names.past_key, names.present_key),
                                                     (names.past_value, names.present_value))):
                    ptr = pool.ptrs[2 * i + j] + lo * pool.slot_bytes
                    io.bind_input(past.format(i=i), pool.device, 0, pool.dtype, shape, ptr)
                    io.bind_output(present.format(i=i), pool.device, 0, pool.dtype, shape, ptr)
            self._bindings[(lo, b)] = io
        return io

    def run(self, slot: int, tokens: np.ndarray, past_len: int, hidden: np.ndarray | None = None,
            keep: int | None = None) -> np.ndarray:
        """tokens int64 [T] (T <= max_prefill_t) at positions [past_len, past_len + T) of `slot`
        -> logits [n, V] of the last n = min(keep, T) positions (all T when keep is None or the
        graph has no `logits_to_keep` input). hidden [T, H]: feature input of an EAGLE draft
        (ignored by graphs without one). Lengths are the caller's (the pool's tracks)."""
        T = len(tokens)
        if not 0 < T <= self.max_prefill_t or past_len + T > self.max_seq_len:
            raise ValueError(f"{self.name}: {T} tokens at {past_len} do not fit a call "
                             f"(1..{self.max_prefill_t} tokens, max_seq_len {self.max_seq_len})")
        self._ids[:T] = tokens
        mask = self._mask[: past_len + T]
        mask.fill(1)
        io = self._binding(slot, 1)
        n = T if self._keep is None or keep is None else max(1, min(keep, T))
        self._bind_call(io, [1, T], [1, past_len + T], mask, n, hidden)
        self.session.run_with_iobinding(io)
        return self._logits[: n * self.vocab].reshape(n, self.vocab)

    def run_rows(self, lo: int, tokens: np.ndarray, pasts: np.ndarray, hidden: np.ndarray | None = None) -> np.ndarray:
        """One token for each of slots [lo, lo + b): tokens int64 [b] at positions pasts [b]
        -> logits [b, V]. hidden [b, H]: an EAGLE draft's features. `batch_rows` graphs only."""
        b = len(tokens)
        if not self.batch_rows and b > 1:
            raise ValueError(f"{self.name}: this graph's lowering runs one sequence per call")
        pasts = np.asarray(pasts, dtype=np.int64)
        W = int(pasts.max()) + 1
        if W > self.max_seq_len:
            raise ValueError(f"{self.name}: a row at position {W - 1} is past max_seq_len {self.max_seq_len}")
        self._ids[:b] = tokens
        mask = self._mask[: b * W].reshape(b, W)
        np.less(np.arange(W), (pasts + 1)[:, None], out=mask, casting="unsafe")
        io = self._binding(lo, b)
        self._bind_call(io, [b, 1], [b, W], mask, 1, hidden)
        self.session.run_with_iobinding(io)
        return self._logits[: b * self.vocab].reshape(b, self.vocab)

    def _bind_call(self, io, ids_shape, mask_shape, mask, n, hidden):
        names = self.entry.io
        B, T = ids_shape
        io.bind_input(names.input_ids, "cpu", 0, np.int64, ids_shape, self._ids.ctypes.data)
        io.bind_input(names.attention_mask, "cpu", 0, np.int64, mask_shape, mask.ctypes.data)
        if self._keep is not None:
            self._keep[0] = n
            io.bind_input(names.logits_to_keep, "cpu", 0, np.int64, [1], self._keep.ctypes.data)
        io.bind_output(names.logits, "cpu", 0, np.float32, [B, n, self.vocab], self._logits.ctypes.data)
        rows = B * T
        if self._h_in is not None:
            if hidden is not None:
                self._h_in[:rows] = np.reshape(hidden, (rows, self.hidden_size))
            io.bind_input(names.hidden_in, "cpu", 0, np.float32, [B, T, self.hidden_size], self._h_in.ctypes.data)
        if self._h_out is not None:
            io.bind_output(names.hidden_out, "cpu", 0, np.float32, [B, T, self.hidden_size], self._h_out.ctypes.data)
            self.hidden = self._h_out[:rows]


class OrtBackend(OrtModel):
    """One sequence over a one-slot pool of its own: the backend `SequenceHarness` drives (export
    validation, graph tests, single-sequence tools)."""

    def __init__(self, graph: str | Path, entry: ModelEntry, *, device: str = "cpu", threads: int | None = None,
                 global_pool: bool = False, prefill_tokens: int = PREFILL_TOKENS, hugepages: bool = False,
                 prepack: bool = True, max_seq_len: int | None = None):
        """hugepages: move the memory this session allocates (prepacked weights, KV, buffers) onto
        2 MiB pages once it is built (runtime/bundle/hugepages.py; CPU, Linux >= 6.1). prepack=False:
        float weights stay as loaded (half the peak of building the session; slower calls);
        MatMulNBits graphs are packed regardless (PACKED_PRECISIONS). max_seq_len: the slot's rows
        (None: the bundle's S_max)."""
        _, dev = pick_providers(device)
        before = anonymous_pages() if hugepages and dev == "cpu" else None
        super().__init__(graph, entry, KVPool(entry.kv, 1, dev, max_seq_len=max_seq_len), threads=threads,
                         global_pool=global_pool, prefill_tokens=prefill_tokens, prepack=prepack)
        if before is not None:
            collapse(anonymous_pages() - before)

    def run(self, tokens: np.ndarray, past_len: int, hidden: np.ndarray | None = None,
            keep: int | None = None) -> np.ndarray:
        return super().run(0, tokens, past_len, hidden, keep)

    def kv_host(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """Host views [1, Hkv, S_max, D] of one layer's K and V buffers (CPU; tests, debugging)."""
        return self.pool.host[2 * layer], self.pool.host[2 * layer + 1]
