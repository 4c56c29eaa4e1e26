"""A draft model's LM head over the most frequent tokens only (FR-Spec: Zhao et al. 2025,
"Accelerating Large-Vocabulary Language Models via Frequency-Ranked Speculative Sampling").

A 0.5B draft of a 152k-token vocabulary spends about a fifth of its step in its LM head
(docs/benchmarks.md §24). Cut to the `size` tokens a corpus uses most, the head's rows are
sliced, and the graph scatters their logits back into a [.., V] row of -inf: the graph's
outputs, and everything that reads them, keep their shapes.

Exactness: the draft's q is 0 outside the subset. A greedy draft proposes its best token in the
subset, a sampled one draws from q over it, and verification needs only q of the tokens drawn
(and max(0, p - q) for the residual), so the output stays the target's. A token outside the
subset is still the target's to choose; the draft never proposes it. A row where a request's
grammar leaves no subset token has no finite logit: its proposal ends there
(runtime/drafters/model.py).

The ranking: token counts over a corpus the exporter has without a network (the running
Python's standard library, code and English docstrings), ties by id (a BPE vocabulary's ids
follow its merges, most frequent first), plus every added token (chat, FIM and tool tokens).
"""

from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .bundle import DATA, GRAPH, ExternalData, save_graph

SKIP = {"test", "tests", "idlelib", "lib2to3", "site-packages"}  # test data, an IDE, a retired tool, installs


class SubsetError(ValueError):
    """A draft graph or setting the vocabulary subset cannot take."""


def stdlib_corpus() -> list[Path]:
    """The running Python's standard library modules (~600 files, ~11 MB, ~3M tokens of code
    and docstrings), sorted."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.rglob("*.py") if not SKIP & set(p.relative_to(root).parts))


def tokenize(tokenizer, texts, vocab: int) -> np.ndarray:
    """tokenizers.Tokenizer, texts -> their ids inside the vocabulary, concatenated. int64 [n]."""
    parts = [np.asarray(e.ids, dtype=np.int64) for e in tokenizer.encode_batch(list(texts), add_special_tokens=False)]
    ids = np.concatenate(parts) if parts else np.empty(0, np.int64)
    return ids[ids < vocab]


def rank_tokens(ids: np.ndarray, vocab: int) -> np.ndarray:
    """Corpus ids -> all `vocab` ids, most frequent first, ties by id. int64 [vocab]."""
    return np.argsort(-np.bincount(ids, minlength=vocab), kind="stable")


def choose(tokenizer, vocab: int, size: int, files: list[Path] | None = None) -> tuple[np.ndarray, dict]:
    """The `size` ids the draft keeps (sorted, int64) and what to record of them: the corpus, and
    the share of a held-out half's tokens that a subset chosen from the other half covers."""
    if not 0 < size < vocab:
        raise SubsetError(f"a draft vocabulary subset must be between 1 and the vocabulary ({vocab}) "
                          f"exclusive, got {size}")
    files = stdlib_corpus() if files is None else files
    texts = [f.read_text(encoding="utf-8", errors="replace") for f in files]
    always = np.array(sorted(t for t in tokenizer.get_added_tokens_decoder() if t < vocab), dtype=np.int64)
    if len(always) >= size:
        raise SubsetError(f"a subset of {size} tokens cannot hold the vocabulary's {len(always)} added tokens")

    def pick(tokens: np.ndarray) -> np.ndarray:  # -> bool [vocab]
        ranked = rank_tokens(tokens, vocab)
        keep = np.zeros(vocab, dtype=bool)
        keep[always] = True
        keep[ranked[~keep[ranked]][: size - len(always)]] = True
        return keep

    halves = [tokenize(tokenizer, texts[i::2], vocab) for i in (0, 1)]
    keep = pick(np.concatenate(halves))
    ids = np.flatnonzero(keep).astype(np.int64)
    info = {
        "size": int(size),
        "corpus": f"python {sys.version.split()[0]} standard library, {len(files)} modules" if files
        else "none (ids in order)",
        "corpus_tokens": int(sum(len(h) for h in halves)),
        "heldout_coverage": round(float(pick(halves[0])[halves[1]].mean()), 4) if len(halves[1]) else None,
        "ids_sha256": hashlib.sha256(ids.tobytes()).hexdigest(),
    }
    return ids, info


def _producer(g: onnx.GraphProto, name: str) -> onnx.NodeProto:
    node = next((n for n in g.node if name in n.output), None)
    if node is None:
        raise SubsetError(f"no node of the draft graph writes {name!r}")
    return node


def _head(g: onnx.GraphProto, logits: str) -> onnx.NodeProto:
    """The LM head's matrix product: the logits' producer, through Identity nodes and the
    Reshape nodes around a Gemm (which takes the positions flattened)."""
    head = _producer(g, logits)
    while head.op_type in ("Identity", "Reshape"):
        head = _producer(g, head.input[0])
    if head.op_type not in ("MatMulNBits", "MatMul", "Gemm"):
        raise SubsetError(f"the draft's LM head is a {head.op_type} node; a vocabulary subset takes "
                          "MatMulNBits, MatMul or Gemm")
    return head


def _attr(node: onnx.NodeProto, name: str, default=0):
    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def _cut(head: onnx.NodeProto, slot: int, arr: np.ndarray, vocab: int, ids: np.ndarray) -> np.ndarray:
    """The rows or columns of the head's input `slot` that belong to the kept outputs."""
    if head.op_type == "MatMulNBits":  # B, scales, zero points, bias: N-major
        flat = arr.reshape(vocab, -1)[ids]
        return flat.reshape((len(ids),) + arr.shape[1:]) if arr.ndim > 1 else flat.reshape(-1)
    if slot == 2:  # Gemm's bias [N]
        return arr[..., ids]
    n_major = head.op_type == "Gemm" and _attr(head, "transB")  # [N, K]
    return arr[ids] if n_major else arr[:, ids]


def subset_head(model: onnx.ModelProto, logits: str, ids: np.ndarray, vocab: int, base: Path) -> dict:
    """Rewrites `model` (weights left external) so that its LM head computes `ids`' outputs only
    and `logits` holds -inf elsewhere. -> the new initializers' arrays by name (not yet in the
    graph's weights file; `rewrite` streams them there). A weight the head shares (a tied
    embedding's table) stays for its other readers."""
    g = model.graph
    head = _head(g, logits)
    inits = {t.name: t for t in g.initializer}
    if head.op_type == "MatMulNBits":
        if _attr(head, "N") != vocab:
            raise SubsetError(f"the draft's LM head has {_attr(head, 'N')} outputs, its vocabulary {vocab}")
        for a in head.attribute:
            if a.name == "N":
                a.i = len(ids)
        slots = [i for i in range(1, len(head.input)) if i != 4]  # g_idx (4) is per K row
    elif head.op_type == "Gemm" and _attr(head, "transA"):
        raise SubsetError("the draft's LM head is a Gemm with a transposed input")
    else:
        slots = range(1, len(head.input))
    arrays = {}
    for i in slots:
        name = head.input[i]
        if not name:
            continue
        if name not in inits:
            raise SubsetError(f"the draft's LM head input {name!r} is not a weight of the graph")
        new = f"{name}.vocab_subset"
        arrays[new] = np.ascontiguousarray(_cut(head, i, numpy_helper.to_array(inits[name], str(base)), vocab, ids))
        head.input[i] = new
        if not any(name in m.input for m in g.node):
            g.initializer.remove(inits[name])
        g.initializer.append(TensorProto(name=new))  # a placeholder `rewrite` fills
    out = head.output[0]
    sub = head.output[0] = f"{out}.vocab_subset"
    c = f"{out}.vocab_subset_"
    g.initializer.extend([
        numpy_helper.from_array(ids.astype(np.int64), c + "ids"),
        numpy_helper.from_array(np.array([-np.inf], np.float32), c + "neg_inf"),
        numpy_helper.from_array(np.array([vocab], np.int64), c + "vocab"),
        numpy_helper.from_array(np.array([0], np.int64), c + "zero"),
        numpy_helper.from_array(np.array([-1], np.int64), c + "last"),
    ])
    scatter = [  # [..., size] -> [..., V]: -inf, the kept logits scattered in
        helper.make_node("Shape", [sub], [c + "shape"]),
        helper.make_node("Slice", [c + "shape", c + "zero", c + "last"], [c + "lead"]),
        helper.make_node("Concat", [c + "lead", c + "vocab"], [c + "full_shape"], axis=0),
        helper.make_node("Expand", [c + "neg_inf", c + "full_shape"], [c + "full"]),
        helper.make_node("Expand", [c + "ids", c + "shape"], [c + "index"]),
        helper.make_node("ScatterElements", [c + "full", c + "index", sub], [out], axis=-1),
    ]
    nodes = list(g.node)
    at = nodes.index(head) + 1  # the graph stays in topological order
    del g.node[:]
    g.node.extend(nodes[:at] + scatter + nodes[at:])
    return arrays


def rewrite(folder: Path, graph: str, logits: str, ids: np.ndarray, vocab: int) -> None:
    """The draft graph `folder/graph` (model.onnx + model.onnx.data) rewritten in place with the
    subset head; its weights streamed into a new weights file one tensor at a time."""
    path = folder / graph
    if path.name != GRAPH:
        raise SubsetError(f"expected a draft graph named {GRAPH}, got {path.name}")
    model = onnx.load(str(path), load_external_data=False)
    arrays = subset_head(model, logits, ids, vocab, path.parent)
    tmp = path.parent / ".vocab_subset"
    tmp.mkdir(exist_ok=True)
    sink = ExternalData(tmp)
    try:
        for t in model.graph.initializer:
            arr = arrays.pop(t.name, None)
            if arr is None:
                if t.data_location != TensorProto.EXTERNAL:
                    continue
                arr = numpy_helper.to_array(t, str(path.parent))
            t.CopyFrom(sink(t.name, arr) or numpy_helper.from_array(arr, t.name))
    finally:
        sink.close()
    save_graph(model, tmp)
    os.replace(tmp / DATA, path.parent / DATA)
    os.replace(tmp / GRAPH, path)
    tmp.rmdir()
