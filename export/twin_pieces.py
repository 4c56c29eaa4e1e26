"""The level-0 twin's teacher-forced check (validate.observe_forced) in pieces of the graph, one
session at a time, so the check never holds the twin's weights at once (docs/design.md, "The
export's time and peak, session 23").

A teacher-forced check is a fixed list of calls (prompt chunks, the continuation, the forced
sequence's chunks): no call depends on another call's logits. So the graph can run piece by piece:
its nodes cut in emission order into pieces of about PIECE_BYTES of weights each; every call runs
through the first piece, whose outputs that later nodes read (the residual stream, the position
tensors) are kept per call; the session is dropped; the next piece runs every call on them; and
so on. Each piece keeps its own layers' KV cache per sequence (plain inputs and outputs: the
present rows fed back as the next call's past). The last piece's logits are the graph's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from .gguf_stream import give_back

PIECE_BYTES = 384 << 20  # a piece's share of the weights file


def _bytes(t: onnx.TensorProto) -> int:
    ext = {e.key: e.value for e in t.external_data}
    return int(ext.get("length", 0)) if t.data_location == TensorProto.EXTERNAL else len(t.raw_data)


def cuts(model: onnx.ModelProto, piece_bytes: int = PIECE_BYTES) -> list[int]:
    """Node indices where pieces start ([0, ...]): a new piece once the weights first read since
    the last cut reach `piece_bytes`."""
    size = {t.name: _bytes(t) for t in model.graph.initializer}
    seen, acc, out = set(), 0, [0]
    for i, n in enumerate(model.graph.node):
        new = [x for x in n.input if x in size and x not in seen]
        add = sum(size[x] for x in new)
        if acc and acc + add > piece_bytes:
            out.append(i)
            acc = 0
        seen.update(new)
        acc += add
    return out


def _consumers(model: onnx.ModelProto) -> dict[str, int]:
    """Tensor name -> the index of the last node that reads it (graph outputs: past the end)."""
    last = {}
    for i, n in enumerate(model.graph.node):
        for x in n.input:
            last[x] = i
    for o in model.graph.output:
        last[o.name] = len(model.graph.node)
    return last


def piece_model(model: onnx.ModelProto, a: int, b: int, fed: dict[str, np.ndarray], last: dict[str, int]):
    """Nodes [a, b) as a model: its inputs what they read that no node of theirs makes (typed by
    `fed`: arrays of an earlier piece or the caller), its outputs what later nodes or the graph's
    outputs read. -> (model, input names, output names)."""
    g = model.graph
    nodes = list(g.node)[a:b]
    inits = {t.name: t for t in g.initializer}
    made = {o for n in nodes for o in n.output}
    reads = [x for n in nodes for x in n.input if x]
    inputs = list(dict.fromkeys(x for x in reads if x not in made and x not in inits))
    outputs = [o for o in dict.fromkeys(o for n in nodes for o in n.output) if o and last.get(o, -1) >= b]
    graph = helper.make_graph(
        nodes, f"piece_{a}",
        [helper.make_tensor_value_info(x, helper.np_dtype_to_tensor_dtype(fed[x].dtype), None) for x in inputs],
        [helper.make_empty_tensor_value_info(o) for o in outputs],
        initializer=[inits[x] for x in dict.fromkeys(reads) if x in inits])
    m = helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    return m, inputs, outputs


def run_calls(folder: Path, graph: str, entry, calls: list[tuple[int, np.ndarray]],
              piece_bytes: int = PIECE_BYTES) -> list[np.ndarray]:
    """calls: (sequence, tokens [T]) in order; each sequence starts with an empty cache and
    continues its own. -> the logits [T, V] of each call, the graph run piece by piece."""
    import onnxruntime as ort

    src = folder / graph
    model = onnx.load(str(src), load_external_data=False)
    last, io = _consumers(model), entry.io
    present_of = {}
    for i in range(entry.kv.layers):
        present_of[io.present_key.format(i=i)] = io.past_key.format(i=i)
        present_of[io.present_value.format(i=i)] = io.past_value.format(i=i)
    kv_dtype = np.dtype(entry.kv.dtype)
    empty = np.zeros((1, entry.kv.kv_heads, 0, entry.kv.head_dim), kv_dtype)
    lengths: dict[int, int] = {}
    state = []  # per call: name -> array (the call's inputs, then what earlier pieces made for later ones)
    for seq, toks in calls:
        p = lengths.get(seq, 0)
        lengths[seq] = p + len(toks)
        state.append({io.input_ids: np.asarray(toks, np.int64)[None], io.attention_mask: np.ones((1, p + len(toks)), np.int64)})
    starts = cuts(model, piece_bytes)
    for a, b in zip(starts, [*starts[1:], len(model.graph.node)], strict=True):
        kv: dict[tuple[int, str], np.ndarray] = {}
        fed = {**state[0], **{name: empty for name in present_of.values()}}
        m, ins, outs = piece_model(model, a, b, fed, last)
        path = src.with_name(f"{src.stem}.piece{a}.onnx")
        onnx.save(m, str(path))
        try:
            sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            for c, (seq, _) in enumerate(calls):
                feeds = {x: kv.get((seq, x), empty) if x in present_of.values() else state[c][x] for x in ins}
                for name, value in zip(outs, sess.run(outs, feeds), strict=True):
                    if name in present_of:
                        kv[(seq, present_of[name])] = value
                    else:
                        state[c][name] = value
                for x in [x for x in state[c] if last.get(x, -1) < b]:  # read by no later piece
                    del state[c][x]
        finally:
            sess = None
            path.unlink()
            give_back()
    return [s[io.logits][0] for s in state]


def observe_forced_in_pieces(folder: Path, twin, ref, tokens: np.ndarray, piece_bytes: int = PIECE_BYTES):
    """`validate.observe_forced` on the twin entry's graph, run in pieces: the same calls, the
    same Observed."""
    from .validate import Observed

    ids, prefix, max_t = ref.ids, ref.prefix, twin.max_tokens_per_call
    seq = np.concatenate([ref.prompt, tokens[:-1]]).astype(np.int64)
    calls = [(0, ids[s : min(s + max_t, prefix)]) for s in range(0, prefix, max_t)]
    n_pre = len(calls)
    calls.append((0, ids[prefix:]))
    calls += [(1, seq[s : s + max_t]) for s in range(0, len(seq), max_t)]
    out = run_calls(folder, twin.graph, twin, calls, piece_bytes)
    rows = np.concatenate(out[n_pre + 1:])
    return Observed(np.concatenate(out[:n_pre]), out[n_pre], np.asarray(tokens, np.int64).copy(), rows[prefix - 1:])
