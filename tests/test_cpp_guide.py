"""docs/cpp.md, followed step by step with plain onnxruntime + IO binding + NumPy (no specrt in
`guide_speculative`): a speculative greedy run reproduces specrt's target-only tokens."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest


def guide_speculative(bundle: Path, prompt: list[int], max_new: int, k: int, share: bool) -> list[int]:
    """§1-§6 of docs/cpp.md. share: a self-draft on the target's buffers (§6)."""
    man = json.loads((bundle / "specrt.json").read_text())  # §1
    tok = man["tokenizer"]
    eos = set(tok["eog_token_ids"]) if tok.get("eog_token_ids") is not None else (  # older bundles
        set(tok["eos_token_ids"]) | {tok["fim"][r] for r in ("pad", "repo_name", "file_sep") if tok["fim"][r] is not None})

    def session(entry):  # §2
        so = ort.SessionOptions()
        so.intra_op_num_threads = 2
        so.add_session_config_entry("session.intra_op.allow_spinning", "1")
        so.add_session_config_entry("session.force_spinning_stop", "1")
        return ort.InferenceSession(str(bundle / entry["graph"]), so, providers=["CPUExecutionProvider"])

    class Model:
        def __init__(self, entry, kv=None):
            self.e, self.s = entry, session(entry)
            L = entry["kv"]
            shape = (1, L["kv_heads"], L["max_seq_len"], L["head_dim"])
            self.kv = kv or [np.zeros(shape, np.dtype(L["dtype"])) for _ in range(2 * L["layers"])]
            self.io = self.s.io_binding()
            io = entry["io"]
            for i in range(L["layers"]):
                for j, (past, present) in enumerate(((io["past_key"], io["present_key"]),
                                                     (io["past_value"], io["present_value"]))):
                    buf = self.kv[2 * i + j]
                    self.io.bind_input(past.format(i=i), "cpu", 0, buf.dtype, list(buf.shape), buf.ctypes.data)
                    self.io.bind_output(present.format(i=i), "cpu", 0, buf.dtype, list(buf.shape), buf.ctypes.data)
            self.V = entry["vocab_size"]
            self.ids = np.zeros(64, np.int64)
            self.mask = np.ones(L["max_seq_len"], np.int64)
            self.logits = np.zeros(64 * self.V, np.float32)
            self.P = 0  # §3: rows of committed tokens

        def call(self, tokens) -> np.ndarray:  # §3: T tokens at P -> logits [T, V]; P += T
            T, io, names = len(tokens), self.io, self.e["io"]
            self.ids[:T] = tokens
            io.bind_input(names["input_ids"], "cpu", 0, np.int64, [1, T], self.ids.ctypes.data)
            io.bind_input(names["attention_mask"], "cpu", 0, np.int64, [1, self.P + T], self.mask.ctypes.data)
            if names.get("logits_to_keep"):
                keep = np.array([T], np.int64)  # every row (verification needs them all)
                io.bind_input(names["logits_to_keep"], "cpu", 0, np.int64, [1], keep.ctypes.data)
            io.bind_output(names["logits"], "cpu", 0, np.float32, [1, T, self.V], self.logits.ctypes.data)
            self.s.run_with_iobinding(io)
            self.P += T
            return self.logits[: T * self.V].reshape(T, self.V)

    target = Model(man["target"])
    draft = Model(man["draft"], kv=target.kv if share else None)
    # §4 prefill
    for s in range(0, len(prompt), 64):
        row = target.call(prompt[s : s + 64])[-1]
    seq = list(prompt) + [int(row.argmax())]
    if not share:
        for s in range(0, len(prompt) - 1, 64):
            draft.call(prompt[s : min(s + 64, len(prompt) - 1)])
    out = [seq[-1]]
    if seq[-1] in eos:
        return []
    while len(out) < max_new:  # §5
        kk = min(k, max_new - len(out) - 1)
        n = len(seq)
        if share:
            draft.P = target.P  # §6: the committed rows are the target's
        d = []
        if kk:
            logits = draft.call(seq[draft.P :])[-1]
            for j in range(kk):
                d.append(int(logits.argmax()))
                if j + 1 < kk:
                    logits = draft.call([d[-1]])[0]
        rows = target.call([seq[-1]] + d)
        best = rows.argmax(axis=-1)
        a = 0
        while a < len(d) and d[a] == best[a]:
            a += 1
        new = d[:a] + [int(best[a])]
        target.P = n + a
        draft.P = min(draft.P, n + len(new) - 1)
        for t in new:
            if t in eos or len(out) >= max_new:
                return out
            out.append(t)
            seq.append(t)
    return out


@pytest.mark.parametrize("bundle,share", [("good", False), ("int8", True), ("int8", False)])
def test_guide_reproduces_specrt_greedy(tiny_bundles, bundle, share):
    import specrt

    folder = tiny_bundles[bundle]
    pipe = specrt.load(folder, draft="none", max_batch=1, hugepages=False)
    for prompt in ([1, 5, 9, 33, 7], list(range(3, 80))):
        want = [t for c in pipe.stream_ids(prompt, max_new_tokens=40) for t in c]
        assert guide_speculative(folder, prompt, 40, k=4, share=share) == want
    pipe.close()


@pytest.mark.slow
def test_guide_on_the_default_bundle(default_bundle):
    import specrt

    pipe = specrt.load(default_bundle, draft="none", max_batch=1)
    prompt = pipe.tokenizer.encode("Explain KV caches in two sentences.")
    want = [t for c in pipe.stream_ids(prompt, max_new_tokens=64) for t in c]
    pipe.close()
    assert guide_speculative(default_bundle, prompt, 64, k=5, share=True) == want
