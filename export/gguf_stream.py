"""A GGUF model without an fp32 copy of it: its weights read tensor by tensor from the memory-
mapped file, and a transformers reference that holds one module's weights at a time.

transformers loads a GGUF by dequantizing every tensor into one fp32 state dict and then into the
model: for a 1.5B model a 12 GB peak, for a 7B one more than this 24 GB machine has. Here:

  GGUFWeights      HF weight name -> its fp32 values (gguf-py's dequantize and transformers' own
                   tensor processor, so the same values transformers would hold), made on access
                   and not kept; `shape(name)` without reading the tensor
  load_streamed    config + tokenizer from the file's metadata, the model built with empty (meta)
                   weights: a skeleton whose rotary tables and config are real
  streamed_logits  the skeleton's forward with each top-level module's weights (embedding, one
                   decoder layer, final norm, LM head) put in place just before that module runs
                   and dropped after it: a layer by layer reference, the same torch computation
                   as the fully loaded model (docs/design.md, "Export memory")
"""

from __future__ import annotations

import functools
import mmap
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import numpy as np

EMBED = "model.embed_tokens.weight"


_READERS: dict[str, object] = {}


def gguf_reader(path: Path | str):
    """One parsed GGUFReader per file for the whole export: an export reads each file up to five
    times (config, tokenizer, weights, tokenizer check, kernel graphs). Its metadata is parsed by
    `gguf_fields.FastGGUFReader` (gguf-py's fields, 0.3 s for a 151k-token vocabulary, not 7 s).
    `forget_readers` drops them."""
    key = str(Path(path).resolve())
    if key not in _READERS:
        from .gguf_fields import FastGGUFReader

        _READERS[key] = FastGGUFReader(key)
    return _READERS[key]


BIG_FIELD = 4096  # metadata arrays longer than this (a vocabulary's tokens, types, merges)


def drop_metadata(path: Path | str) -> None:
    """Drop the long arrays (the vocabulary) from a file's shared reader once config, tokenizer
    and the tokenizer check have read them: a parsed 151k-token vocabulary is ~0.5 GB of small
    NumPy views, for the whole export otherwise (tensors and short fields stay)."""
    r = _READERS.get(str(Path(path).resolve()))
    if r is None:
        return
    for name in [k for k, f in r.fields.items() if len(f.data) > BIG_FIELD]:
        del r.fields[name]
    give_back()


def give_back() -> None:
    """Collect garbage and hand the heap's free pages back to the system (glibc `malloc_trim`): a
    parsed vocabulary is ~10^6 small objects and a check session's buffers are freed when it is
    dropped, but glibc keeps freed heap memory in the process, where it counts in the export's
    peak beside the next session."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def forget_readers() -> None:
    _READERS.clear()
    _METADATA.clear()


_METADATA: dict[str, dict] = {}


@contextmanager
def shared_readers():
    """transformers' GGUF loading (config, tokenizer: each imports gguf.GGUFReader and
    load_gguf_checkpoint when called) reads through `gguf_reader` while this is open, and parses
    a file's metadata once (a copy of it for each caller)."""
    import copy

    import gguf
    import transformers.modeling_gguf_pytorch_utils as hf_gguf

    orig_reader, orig_load = gguf.GGUFReader, hf_gguf.load_gguf_checkpoint

    def load(path, return_tensors=False, **kw):
        if return_tensors or kw:
            return orig_load(path, return_tensors, **kw)
        key = str(Path(path).resolve())
        if key not in _METADATA:
            _METADATA[key] = orig_load(path, False)
        return copy.deepcopy(_METADATA[key])

    gguf.GGUFReader = lambda path, mode="r": gguf_reader(path) if mode == "r" else orig_reader(path, mode)
    hf_gguf.load_gguf_checkpoint = load
    try:
        yield
    finally:
        gguf.GGUFReader, hf_gguf.load_gguf_checkpoint = orig_reader, orig_load


def processor_for(reader, config):
    """transformers' tensor processor for the file's architecture (its row permutations, norm
    offsets)."""
    from transformers.modeling_gguf_pytorch_utils import (
        TENSOR_PROCESSORS,
        TensorProcessor,
        read_field,
    )

    arch = read_field(reader, "general.architecture")[0]
    cfg = getattr(config, "text_config", None) or config
    heads = {"num_attention_heads": cfg.num_attention_heads,
             "num_key_value_heads": getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads}
    return TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=heads)


@contextmanager
def _one_name_map():
    """gguf-py's tensor name map built once while this is open: transformers' weights map builds
    it again for every submodule it recurses into (690 times, 3.6 s for a 28-layer model); the
    map is only read."""
    import gguf

    orig = gguf.get_tensor_name_map
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(orig)
    try:
        yield
    finally:
        gguf.get_tensor_name_map = orig


SLAB_ROWS = 8192  # rows dequantized at a time
DEQ_ROWS = 128  # rows gguf-py's per-type code dequantizes in one call


def dequantize_rows(raw: np.ndarray, qtype, out: np.ndarray) -> np.ndarray:
    """gguf-py's `dequantize` of rows `raw` (as GGUFReader gives them: [n, bytes a row], or [n, k]
    for a float type) written into `out` (fp32 [n, k]) -> out. The same values: gguf-py's own
    per-type code (`dequantize_rows`), called on DEQ_ROWS rows at a time rather than through its
    `dequantize`, whose groups of 16 rows spend more in NumPy's per-call overhead than in the
    arithmetic (a coder layer 0.24 -> 0.13 s); every block is dequantized on its own, so how rows
    are grouped cannot change a value (tested against `gguf.dequantize`)."""
    from gguf import dequantize, quants

    q = quants._type_traits.get(qtype)
    if q is None or raw.ndim != 2:  # the float types (a view or a cast), anything unexpected
        out[...] = np.asarray(dequantize(raw, qtype), dtype=np.float32).reshape(out.shape)
        return out
    q.init_grid()
    for r0 in range(0, raw.shape[0], DEQ_ROWS):
        out[r0:r0 + DEQ_ROWS] = q.dequantize_rows(raw[r0:r0 + DEQ_ROWS])
    return out


class GGUFWeights(Mapping):
    """HF state-dict names -> fp32 NumPy arrays, dequantized from the GGUF on each access (no
    cache: a caller holds what it reads as long as it needs it). `tensor(name)`: the GGUF tensor
    behind a name (GGUFReader's, memory-mapped), for importing its blocks."""

    def __init__(self, path: Path | str, model):
        from transformers.modeling_gguf_pytorch_utils import get_gguf_hf_weights_map

        self.path = Path(path)
        self.reader = gguf_reader(path)
        self.processor = processor_for(self.reader, model.config)
        with _one_name_map():
            self.to_hf = to_hf = get_gguf_hf_weights_map(model, self.processor)
        self._tensors = {}
        for t in self.reader.tensors:
            hf = to_hf.get(t.name)
            if hf is not None:
                self._tensors[hf] = t

    def tensor(self, name: str):
        return self._tensors[name]

    def shape(self, name: str) -> tuple[int, ...]:
        """The HF shape ([out, in] for a projection) without reading the data."""
        return tuple(int(d) for d in reversed(self._tensors[name].shape))

    def __getitem__(self, name: str) -> np.ndarray:
        from gguf import dequantize

        t = self._tensors[name]
        # as transformers' load_gguf_checkpoint (dequantize, then its processor), in row slabs
        # written into one array: gguf-py concatenates its parts, twice the tensor at its peak
        shape = tuple(int(d) for d in reversed(t.shape))  # ggml's [ne1, ne0] order = rows, elements
        raw = np.asarray(t.data)
        if len(shape) == 2 and raw.ndim == 2 and raw.shape[0] == shape[0]:
            w = np.empty(shape, np.float32)
            for r0 in range(0, shape[0], SLAB_ROWS):
                dequantize_rows(raw[r0:r0 + SLAB_ROWS], t.tensor_type, w[r0:r0 + SLAB_ROWS])
        else:
            w = dequantize(t.data, t.tensor_type)
        w = self.processor.process(weights=w, name=t.name, tensor_key_mapping={}, parsed_parameters={}).weights
        w = np.ascontiguousarray(np.asarray(w, dtype=np.float32).reshape(self.shape(name)))
        w = w if w.flags.writeable else w.copy()  # F32 tensors: a view of the read-only map
        drop_pages(self.reader.data)
        return w

    def rows(self, name: str, idx) -> np.ndarray:
        """Rows `idx` (an int array or a slice) of a 2-D weight, dequantized from those rows' blocks
        alone: `self[name][idx]`'s values without the whole tensor in fp32, for a tensor whose rows
        transformers' processor keeps as stored (the token table, an LM head); else read whole."""
        t = self._tensors[name]
        n, k = self.shape(name)
        raw = np.asarray(t.data)
        if raw.ndim != 2 or raw.shape[0] != n or not self._rows_as_stored(name):
            return self[name][idx]
        sel = raw[idx]
        w = dequantize_rows(sel, t.tensor_type, np.empty((len(sel), k), np.float32))
        drop_pages(self.reader.data)
        return w

    def _rows_as_stored(self, name: str) -> bool:
        """Whether the processor leaves tensor `name`'s rows as stored (run on row indices)."""
        t = self._tensors[name]
        n = self.shape(name)[0]
        idx = np.arange(n, dtype=np.float64)[:, None]
        out = self.processor.process(weights=idx, name=t.name, tensor_key_mapping={}, parsed_parameters={}).weights
        return np.asarray(out).shape == idx.shape and np.array_equal(np.asarray(out), idx)

    def __contains__(self, name) -> bool:  # (Mapping's own would read the tensor)
        return name in self._tensors

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)


def drop_pages(array) -> None:
    """Unmap the resident pages of the file map behind `array` (a GGUFReader's tensor data or its
    whole map) from this process: they stay in the page cache, but no longer count in its
    resident memory, which would otherwise grow to the file's size as every tensor is read."""
    base = array
    while base is not None and getattr(base, "_mmap", None) is None:
        base = getattr(base, "base", None)
    mm = getattr(base, "_mmap", None) if base is not None else None
    if mm is not None and hasattr(mm, "madvise"):
        mm.madvise(mmap.MADV_DONTNEED)


def weight_shape(weights: Mapping, name: str) -> tuple[int, ...]:
    """A weight's shape, without dequantizing it where `weights` streams from a file."""
    shape = getattr(weights, "shape", None)
    return shape(name) if callable(shape) else tuple(weights[name].shape)


def load_streamed(folder: Path, gguf_file: str):
    """-> (model skeleton, eval mode, weights on the meta device; tokenizer) from the GGUF's
    metadata alone."""
    import torch
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    with shared_readers():
        config = AutoConfig.from_pretrained(folder, gguf_file=gguf_file)
        with init_empty_weights():  # parameters on meta; buffers (rotary tables) real
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)
    return model.eval(), tok


def _units(model) -> list[tuple[str, object]]:
    """(name prefix, module) of the modules whose weights are put in place one at a time: each
    child of the decoder stack (a layer list's layers one by one), and the model's own others
    (the LM head)."""
    out = []
    for name, child in model.named_children():
        subs = child.named_children() if name == "model" else [("", child)]
        for sub, mod in subs:
            prefix = f"{name}.{sub}" if sub else name
            if isinstance(mod, __import__("torch").nn.ModuleList):
                out += [(f"{prefix}.{i}", m) for i, m in enumerate(mod)]
            elif any(True for _ in mod.parameters()):
                out.append((prefix, mod))
    return out


def _set(module, name: str, value) -> None:
    owner, _, attr = name.rpartition(".")
    setattr(module.get_submodule(owner) if owner else module, attr, value)


def _install(model, weights: GGUFWeights) -> list:
    """Forward hooks putting each unit's weights (`_units`) in place before it runs and back on the
    meta device after. -> the hook handles."""
    import torch

    shapes = {}

    def load(prefix):
        def pre(mod, _args):
            for name, p in list(mod.named_parameters()):
                key = f"{prefix}.{name}"
                if key not in weights and key == "lm_head.weight":  # tied: the embedding's table
                    key = EMBED
                shapes[(prefix, name)] = tuple(p.shape)
                _set(mod, name, torch.nn.Parameter(torch.from_numpy(weights[key]), requires_grad=False))
        return pre

    def drop(prefix):
        def post(mod, _args, _out):
            for name, _ in list(mod.named_parameters()):
                _set(mod, name, torch.nn.Parameter(torch.empty(shapes[(prefix, name)], device="meta"),
                                                   requires_grad=False))
        return post

    hooks = []
    for prefix, mod in _units(model):
        if (table := _table_forward(prefix, mod, weights)) is not None:  # rows read as needed
            mod.forward = table
            hooks.append(_Restore(mod))
            continue
        hooks += [mod.register_forward_pre_hook(load(prefix)), mod.register_forward_hook(drop(prefix))]
    return hooks


class _Restore:
    """A handle that takes a module's own forward back (`_install`'s hooks' `remove`)."""

    def __init__(self, mod):
        self.mod = mod

    def remove(self) -> None:
        del self.mod.forward


HEAD_SLAB_ROWS = 8192  # the reference LM head's rows dequantized at a time


def _table_forward(prefix: str, mod, weights: GGUFWeights):
    """The embedding and the LM head of the reference without their whole fp32 table (4·V·H
    bytes, 0.93 GB for the coder target): the embedding dequantizes the rows its ids name (the
    same rows, exact), the LM head multiplies by row slabs of its matrix (the same products,
    summed per slab as a whole matrix's; its logits agree to fp32 rounding). -> the module's
    forward, or None for the other modules."""
    import torch
    import torch.nn.functional as F

    if isinstance(mod, torch.nn.Embedding) and f"{prefix}.weight" in weights:
        key = f"{prefix}.weight"

        def embed(ids):
            uniq, inv = torch.unique(ids, return_inverse=True)
            return F.embedding(inv, torch.from_numpy(weights.rows(key, uniq.numpy())))
        return embed
    if prefix != "lm_head" or not isinstance(mod, torch.nn.Linear) or mod.bias is not None:
        return None
    key = "lm_head.weight" if "lm_head.weight" in weights else EMBED  # tied: the embedding's table

    def head(x):
        v = weights.shape(key)[0]
        out = x.new_empty(*x.shape[:-1], v)
        for r0 in range(0, v, HEAD_SLAB_ROWS):
            r1 = min(v, r0 + HEAD_SLAB_ROWS)
            out[..., r0:r1] = F.linear(x, torch.from_numpy(weights.rows(key, slice(r0, r1))))
        return out
    return head


def streamed_logits(model, weights: GGUFWeights, seqs: list[np.ndarray]) -> list[np.ndarray]:
    """Logits [len(s), V] of each token sequence (one batch, right-padded: causal attention keeps
    every row's real positions free of the padding), with one module's weights in memory at a
    time."""
    import torch

    n = max(len(s) for s in seqs)
    ids = np.zeros((len(seqs), n), dtype=np.int64)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = s
    hooks = _install(model, weights)
    try:
        with torch.no_grad():
            out = model(torch.from_numpy(ids), use_cache=False).logits.float().numpy()
    finally:
        for h in hooks:
            h.remove()
    return [out[i, :len(s)].copy() for i, s in enumerate(seqs)]
