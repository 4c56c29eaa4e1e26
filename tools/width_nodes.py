"""Where do a graph's one-token and two-token calls start to differ? (docs/design.md, "One-token
calls of int8-activation graphs".)

Every node output of an `ort`-lowering graph becomes a graph output; the graph prefills a
random prompt, then the same position is computed once by a one-token call and once as row 0
of a two-token call from the same cache. Prints each output's largest difference on that row,
in graph order: the first non-zero line is the op whose one-token path differs.

    python tools/width_nodes.py engines/coder/target/model.onnx --layers 2
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np
import onnx
import onnxruntime as ort

from specrt.runtime.backends.ort import session_options


def probe(graph: str, layers: int = 2, prompt: int = 10, seed: int = 0) -> list[tuple[str, str, float]]:
    """-> [(output name, op type, max |one-token row - two-token row 0|)] in graph order, for the
    node outputs up to the `layers`-th attention (outputs of other shapes are left out)."""
    m = onnx.load(graph, load_external_data=False)
    wanted, seen_attn = [], 0
    for n in m.graph.node:
        if n.op_type == "GroupQueryAttention":
            seen_attn += 1
            if seen_attn > layers:
                break
        wanted += [(o, n.op_type) for o in n.output if o and not o.startswith("present")]
    for o, _ in wanted:
        m.graph.output.append(onnx.ValueInfoProto(name=o))
    fd, path = tempfile.mkstemp(suffix=".onnx", dir=os.path.dirname(os.path.abspath(graph)))  # beside its data file
    os.close(fd)
    try:
        onnx.save(m, path)
        s = ort.InferenceSession(path, session_options(2), providers=["CPUExecutionProvider"])
    finally:
        os.remove(path)
    past = [i for i in s.get_inputs() if i.name.startswith("past_key_values")]
    names = [o.name for o in s.get_outputs()]
    vocab = s.get_outputs()[0].shape[-1]
    ids = np.random.default_rng(seed).integers(0, vocab if isinstance(vocab, int) else 100, prompt + 2)

    def run(toks, kv, start):
        feeds = {"input_ids": np.array([toks], np.int64), "attention_mask": np.ones((1, start + len(toks)), np.int64)}
        feeds.update(kv)
        out = dict(zip(names, s.run(None, feeds), strict=True))
        return out, {i.name: out[i.name.replace("past_key_values", "present")] for i in past}

    kv0 = {i.name: np.zeros([1, i.shape[1], prompt + 8, i.shape[3]], np.float32) for i in past}
    _, kv = run(list(ids[:prompt]), kv0, 0)
    one, _ = run([int(ids[prompt])], {k: v.copy() for k, v in kv.items()}, prompt)
    two, _ = run([int(ids[prompt]), int(ids[prompt + 1])], {k: v.copy() for k, v in kv.items()}, prompt)
    rows = []
    for o, op in wanted:
        a, b = one[o], two[o]
        if a.ndim >= 2 and a.shape[:2] == (1, 1) and b.shape[:2] == (1, 2):
            rows.append((o, op, float(np.abs(a[:, 0].astype(np.float64) - b[:, 0]).max())))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("graph")
    ap.add_argument("--layers", type=int, default=2)
    a = ap.parse_args(argv)
    for name, op, d in probe(a.graph, a.layers):
        print(f"{name:48s} {op:34s} {d:.3g}")


if __name__ == "__main__":
    main()
