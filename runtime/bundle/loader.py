"""Bundle -> the parts the engine runs: tokenizer, KV pools, target and draft models.

The target's pool has `max_batch` slots of `max_seq_len` tokens. A self-draft (a quantized copy
of the target, same KV layout, host or device) is a second track on that same pool; any other
draft (a separate model, an EAGLE head, a TensorRT plan) gets a pool of its own with the same
slot numbering. Before any session or buffer exists, the load is sized against the memory
available (runtime/bundle/memory.py): a count that cannot fit is refused with the numbers, `auto`
takes as many slots as fit.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import kernels as kernel_library
from ..backends.kvpool import KVPool, kv_bytes_per_slot
from ..backends.ort import OrtModel, pick_providers, prefill_width
from ..backends.packed import PackedModel
from ..backends.protocol import PoolModel
from ..options import DRAFTS, LoadOptions, load_options
from . import memory
from .hugepages import anonymous_pages, collapse
from .manifest import (
    SELF_DRAFT_PRECISION,
    BundleError,
    Manifest,
    ModelEntry,
    load_manifest,
    needs_portable,
)
from .tokenizer import Tokenizer

__all__ = ["DRAFTS", "LoadedModels", "load_models", "memory_plan", "size_load"]


@dataclass
class LoadedModels:
    """What a load built: the sessions, their KV pools, the tokenizer and the manifest."""

    folder: Path
    manifest: Manifest
    tokenizer: Tokenizer
    target: PoolModel  # backends/ort.py OrtModel, backends/single.py for TensorRT
    draft: PoolModel | None  # None: not in the bundle, or not asked for
    eagle: bool  # the draft reads the target's features
    shared_kv: bool  # the draft is a track on the target's pool
    features: np.ndarray | None  # [slots, S, H] target hidden states (EAGLE)
    device: str
    sizing: memory.Sizing | None = None  # what the load was sized to (None: not sized, e.g. TensorRT)

    @property
    def kernel_form(self) -> str:
        """The form specrt's own operators take in this load's target calls: "amx", "vnni",
        "avxvnni", "avx2" (runtime/kernels.isa), or "none" where its graphs run onnxruntime's
        operators."""
        return kernel_library.isa() if self.target.kernels else "none"

    @property
    def pools(self) -> list:
        """Every KV pool the models write (a self-draft's is the target's)."""
        return [self.target.pool] + ([self.draft.pool] if self.draft is not None else [])

    @property
    def kv_bytes_per_slot(self) -> int:
        """KV bytes one slot holds over every pool (backends/kvpool.py `kv_bytes_per_slot`, as the
        engine's counters report it)."""
        return kv_bytes_per_slot(self.pools)


def load_models(folder: str | Path, options: LoadOptions | None = None, **kw) -> LoadedModels:
    """The models, tokenizer and KV pools of a load. options (or its fields as keywords):
    `draft`, `device`, `threads`, `global_pool`, `hugepages`, `max_batch`, `max_seq_len` and
    `memory_fraction` apply here (runtime/options.py). Raises memory.InsufficientMemory before
    building anything when the load cannot fit."""
    o = load_options(options, **kw)
    folder = Path(folder)
    man = load_manifest(folder)
    tok = Tokenizer(folder, man.tokenizer)
    eagle = man.draft is not None and bool(man.draft.io.hidden_in)
    want_draft = man.draft is not None and o.want_draft
    if o.device == "trt":
        return _trt_models(folder, man, tok, want_draft, eagle, 1 if o.max_batch == memory.AUTO else o.max_batch,
                           o.max_seq_len)
    _, dev = pick_providers(o.device)
    sizing = size_load(folder, man, want_draft=want_draft, device=dev, max_batch=o.max_batch,
                       max_seq_len=o.max_seq_len, memory_fraction=o.memory_fraction, packed=o.packed,
                       draft_window=o.draft_window)
    slots, seq = sizing.slots, sizing.seq
    threads, global_pool = o.threads, o.global_pool
    before = anonymous_pages() if o.hugepages and dev == "cpu" else None
    pool = KVPool(man.target.kv, slots, dev, allocate=False, max_seq_len=seq)  # after the sessions: lower peak RSS
    packs = _packs(o.packed, dev, eagle)
    if not packs:  # the bundle graphs run: a bundle without them says how to add them, before any session
        why = f"device {dev}" if dev != "cpu" else "an EAGLE pair" if eagle else "packed graphs off"
        for role, e in (("target", man.target), ("draft", man.draft if want_draft else None)):
            if e is not None and e.portable_missing:
                raise needs_portable(folder, role, why)
    target = _model(folder, man.target, pool, "target", threads, global_pool, packed=packs, kernels=o.kernels)
    d = None
    shared = False
    if want_draft:
        shared = _shares_kv(man, eagle)
        dpool = pool if shared else KVPool(man.draft.kv, slots, dev, allocate=False,
                                           max_seq_len=draft_rows(man, seq, eagle, o.draft_window))
        d = _model(folder, man.draft, dpool, "draft", threads, global_pool, packed=packs, exact=False,
                   kernels=o.kernels)
        dpool.allocate()
    pool.allocate()
    features = None
    if eagle and d is not None:
        if not target.has_hidden_out:
            raise BundleError(f"bundle {folder}: the target graph has no hidden-state output for its EAGLE draft")
        features = np.zeros((slots, seq, target.hidden_size), dtype=np.float32)
    if before is not None:
        collapse(anonymous_pages() - before)
    return LoadedModels(folder, man, tok, target, d, eagle and d is not None, shared, features, dev, sizing)


def _packs(packed: bool, device: str, eagle: bool) -> bool:
    """Whether a load runs its models' packed graphs where the bundle has them (CPU, no EAGLE
    pair: runtime/backends/packed.py)."""
    return packed and device == "cpu" and not eagle


def _shares_kv(man: Manifest, eagle: bool) -> bool:
    """A self-draft (a quantized copy of the target) is a second track on the target's pool."""
    return man.draft.recipe in SELF_DRAFT_PRECISION and not eagle and man.draft.kv == man.target.kv


def draft_rows(man: Manifest, seq: int, eagle: bool, window: int | None) -> int | None:
    """Rows of a draft's own pool: the load's context, or for a separate draft that reads a
    window (runtime/drafters/model.py; an EAGLE head never does) its window and a run after it
    (memory.windowed_rows); None for a self-draft on the target's pool."""
    if _shares_kv(man, eagle):
        return None
    rows = min(seq, man.draft.kv.max_seq_len)
    return rows if window is None or eagle else min(rows, memory.windowed_rows(window))


def memory_plan(folder: Path, man: Manifest, *, want_draft: bool, device: str = "cpu",
                packed: bool = True, draft_window: int | None = None) -> memory.MemoryPlan:
    """What the models `load_models` builds will hold (runtime/bundle/memory.py), from the manifest and
    the files' sizes; nothing is loaded."""
    eagle = man.draft is not None and bool(man.draft.io.hidden_in)
    entries = [("target", man.target)] + ([("draft", man.draft)] if want_draft else [])
    models = []
    for name, e in entries:
        if e.portable_missing:  # its kernel graphs' files: the operators read them as they are
            size = memory.file_bytes(folder, e.data, e.packed.kernel_data)
            factor = 1.0
        else:
            size = memory.file_bytes(folder, e.graph, e.data)
            # prepacking on CPU changes the size; on a GPU the weights are the files' bytes
            factor = memory.WEIGHT_FACTOR.get(e.precision, 1.0) if device == "cpu" else 1.0
        lanes = tuple(e.packed.lanes) if name == "target" and _packs(packed, device, eagle) else ()
        models.append(memory.ModelMemory(name, size, int(size * factor), e.vocab_size, prefill_width(e),
                                         e.hidden_size * (bool(e.io.hidden_in) + bool(e.io.hidden_out)),
                                         lanes, e.max_tokens_per_call))
    kv, capped, s_max = man.target.kv.bytes_per_token(), (), man.target.kv.max_seq_len
    if want_draft and not _shares_kv(man, eagle):
        rows = draft_rows(man, s_max, eagle, draft_window)
        if rows < s_max:  # a windowed draft's pool stops at its rows
            capped = ((man.draft.kv.bytes_per_token(), rows),)
        else:
            kv += man.draft.kv.bytes_per_token()
    features = 4 * man.target.hidden_size if want_draft and eagle else 0
    return memory.MemoryPlan(tuple(models), kv, features, kv_capped=capped)


def size_load(folder: Path, man: Manifest, *, want_draft: bool, device: str, max_batch: int | str,
              max_seq_len: int | None, memory_fraction: float, packed: bool = True,
              draft_window: int | None = None) -> memory.Sizing:
    """Slots and context for this load, checked against the memory available now (the seam
    tests replace: `memory.available_bytes`); no max_seq_len: the bundle's S_max, or the longest
    context that holds the slots (memory.size's fit_seq). Raises InsufficientMemory or ValueError."""
    s_max = man.target.kv.max_seq_len
    seq = s_max if max_seq_len is None else max_seq_len
    shortest = man.target.max_tokens_per_call + 1  # a widest verification call after one token
    if not isinstance(seq, int) or not shortest <= seq <= s_max:
        raise ValueError(f"max_seq_len must be between {shortest} and the bundle's S_max {s_max}, got {max_seq_len!r}")
    plan = memory_plan(folder, man, want_draft=want_draft, device=device, packed=packed, draft_window=draft_window)
    return memory.size(plan, max_batch, seq, memory.available_bytes(device), fraction=memory_fraction, s_max=s_max,
                       fit_seq=max_seq_len is None)


def _model(folder: Path, entry: ModelEntry, pool: KVPool, track: str, threads, global_pool,
           packed: bool = False, exact: bool = True, kernels: bool = False) -> OrtModel | PackedModel:
    """The model over `pool`: the entry's packed graph when asked for and the bundle has one
    (export/packed.py; `exact`: row-invariant calls, for a target), else its graph. `kernels`:
    the packed graph on specrt's own operators where the bundle has it, the library is built and
    the CPU runs a fast form of them (runtime/kernels.form_for)."""
    graph = entry.graph
    try:
        if packed and entry.packed.graph:
            lanes = entry.packed.lanes_for(pool.slots)
            form, why = kernel_library.form_for(bool(entry.packed.kernels), kernels)
            own = form != "none"
            if not own and entry.portable_missing:
                raise needs_portable(folder, track, why.split(": the packed graphs")[0])
            graph = entry.packed.kernel_file(lanes) if own else entry.packed.file(lanes)
            return PackedModel(folder / graph, entry, pool, lanes=lanes, track=track, threads=threads,
                               global_pool=global_pool, exact=exact, kernels=own)
        return OrtModel(folder / graph, entry, pool, track=track, threads=threads, global_pool=global_pool)
    except (BundleError, ValueError):
        raise
    except Exception as e:  # onnxruntime raises its own exception types on a bad graph
        raise BundleError(f"cannot load {track} graph {folder / graph}: {str(e)[:300]}") from None


def _trt_models(folder, man, tok, want_draft, eagle, max_batch, max_seq_len) -> LoadedModels:
    from ..backends.single import SingleSequenceModel
    from ..backends.trt import TrtBackend, gpu_tag

    if max_batch != 1:
        raise ValueError("the TensorRT backend runs one sequence per engine: use max_batch=1 with device='trt'")
    if max_seq_len not in (None, man.target.kv.max_seq_len):
        raise ValueError("TensorRT plans are built for the bundle's S_max: max_seq_len at load needs device cpu or cuda")

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

    target = plan_for(man.target, "target")  # one sequence at S_max: not sized (runtime/bundle/memory.py)
    d = plan_for(man.draft, "draft") if want_draft else None
    features = None
    if eagle and d is not None:
        features = np.zeros((1, man.target.kv.max_seq_len, target.hidden_size), dtype=np.float32)
    return LoadedModels(folder, man, tok, target, d, eagle and d is not None, False, features, "trt")
