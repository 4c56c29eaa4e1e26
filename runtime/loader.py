"""Bundle -> the parts the engine runs: tokenizer, KV pools, target and draft models.

The target's pool has `max_batch` slots. A self-draft (a quantized copy of the target, same KV
layout, host or device) is a second track on that same pool; any other draft (a separate
model, an EAGLE head, a TensorRT plan) gets a pool of its own with the same slot numbering.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .backends.ort import OrtModel, pick_providers
from .hugepages import anonymous_pages, collapse
from .kvpool import KVPool
from .manifest import SELF_DRAFT_PRECISION, BundleError, Manifest, ModelEntry, load_manifest
from .tokenizer import Tokenizer

DRAFTS = ("model", "none", "ngram", "auto")


@dataclass
class Parts:
    folder: Path
    manifest: Manifest
    tokenizer: Tokenizer
    target: object  # pool model (backends/ort.py OrtModel, backends/single.py for TensorRT)
    draft: object | None  # pool model, or None (not in the bundle, or not asked for)
    eagle: bool  # the draft reads the target's features
    shared_kv: bool  # the draft is a track on the target's pool
    features: np.ndarray | None  # [slots, S_max, H] target hidden states (EAGLE)
    device: str

    @property
    def kv_bytes_per_slot(self) -> int:
        n = self.target.pool.bytes_per_slot()
        if self.draft is not None and not self.shared_kv:
            n += self.draft.pool.bytes_per_slot()
        return n


def load_parts(folder: str | Path, *, draft: str = "model", device: str = "cpu", threads: int | None = None,
               global_pool: bool = False, hugepages: bool = False, max_batch: int = 1) -> Parts:
    folder = Path(folder)
    man = load_manifest(folder)
    if not isinstance(max_batch, int) or max_batch < 1:
        raise ValueError(f"max_batch must be a positive integer, got {max_batch!r}")
    tok = Tokenizer(folder, man.tokenizer)
    eagle = man.draft is not None and bool(man.draft.io.hidden_in)
    want_draft = man.draft is not None and draft in ("model", "auto")
    if device == "trt":
        return _trt_parts(folder, man, tok, want_draft, eagle, max_batch)
    _, dev = pick_providers(device)
    before = anonymous_pages() if hugepages and dev == "cpu" else None
    pool = KVPool(man.target.kv, max_batch, dev, allocate=False)  # after the sessions: lower peak RSS
    target = _model(folder, man.target, pool, "target", threads, global_pool)
    d = None
    shared = False
    if want_draft:
        shared = (man.draft.recipe in SELF_DRAFT_PRECISION and not eagle and man.draft.kv == man.target.kv)
        dpool = pool if shared else KVPool(man.draft.kv, max_batch, dev, allocate=False)
        d = _model(folder, man.draft, dpool, "draft", threads, global_pool)
        dpool.allocate()
    pool.allocate()
    features = None
    if eagle and d is not None:
        if not target.has_hidden_out:
            raise BundleError(f"bundle {folder}: the target graph has no hidden-state output for its EAGLE draft")
        features = np.zeros((max_batch, man.target.kv.max_seq_len, target.hidden_size), dtype=np.float32)
    if before is not None:
        collapse(anonymous_pages() - before)
    return Parts(folder, man, tok, target, d, eagle and d is not None, shared, features, dev)


def _model(folder: Path, entry: ModelEntry, pool: KVPool, track: str, threads, global_pool) -> OrtModel:
    try:
        return OrtModel(folder / entry.graph, entry, pool, track=track, threads=threads, global_pool=global_pool)
    except (BundleError, ValueError):
        raise
    except Exception as e:  # onnxruntime raises its own exception types on a bad graph
        raise BundleError(f"cannot load {track} graph {folder / entry.graph}: {str(e)[:300]}") from None


def _trt_parts(folder, man, tok, want_draft, eagle, max_batch) -> Parts:
    from .backends.single import SingleSequenceModel
    from .backends.trt import TrtBackend, gpu_tag

    if max_batch != 1:
        raise ValueError("the TensorRT backend runs one sequence per engine: use max_batch=1 with device='trt'")

    def plan_for(entry, name):
        plans = entry.trt_plans
        if not plans:
            raise BundleError(f"bundle {folder} has no TensorRT plan for the {name}; "
                              "export with --lowering standard --trt on this GPU")
        tag = gpu_tag()
        plan = next((p for p in plans if p.gpu == tag), None)
        if plan is None:
            raise BundleError(f"no TensorRT plan of the {name} matches this GPU ({tag}); plans: {[p.gpu for p in plans]}")
        return SingleSequenceModel(TrtBackend(folder / plan.file, entry), entry, name)

    target = plan_for(man.target, "target")
    d = plan_for(man.draft, "draft") if want_draft else None
    features = None
    if eagle and d is not None:
        features = np.zeros((1, man.target.kv.max_seq_len, target.hidden_size), dtype=np.float32)
    return Parts(folder, man, tok, target, d, eagle and d is not None, False, features, "trt")
