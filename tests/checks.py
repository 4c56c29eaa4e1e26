"""Assertions and drivers the tests share: greedy equality up to near-ties, a chi-square check
of sampled counts, one request through a pipeline's engine, a packed target's row invariance."""

from __future__ import annotations

import time

import numpy as np


def assert_same_greedy(got: list[int], want: list[int], margins=None, tie: float = 1e-4):
    """Token-for-token equality; a difference is only tolerated at a near-tie (reference top-2
    logit margin below `tie` at the first differing position) and the test says so."""
    n = min(len(got), len(want))
    for i in range(n):
        if got[i] != want[i]:
            assert margins is not None and margins[i] < tie, (
                f"greedy outputs differ at token {i}: {got[i]} vs {want[i]} "
                f"(margin {None if margins is None else margins[i]}); not a near-tie"
            )
            return i
    assert len(got) == len(want), f"lengths differ: {len(got)} vs {len(want)}"
    return None


def target_margins(pipe, prompt, tokens) -> list[float]:
    """Top-2 logit gap of a from-scratch target at each position of `tokens` after `prompt`
    (where a difference could be a near-tie)."""
    from specrt.runtime.backends.harness import SequenceHarness
    from specrt.runtime.backends.ort import OrtBackend

    man = pipe.manifest
    dec = SequenceHarness(OrtBackend(pipe.folder / man.target.graph, man.target))
    out, logits = [], dec.prefill(list(prompt))
    for t in tokens:
        top = np.sort(logits)[-2:]
        out.append(float(top[1] - top[0]))
        logits = dec.forward([t])[0]
    return out


def assert_follows(counts, exact, n: int) -> None:
    """Sampled token counts [V] from n draws follow the distribution `exact` [V]: chi-square
    (expected counts under 5 pooled into one cell), p > 1e-3."""
    from scipy import stats as sps

    e = exact * n
    big = e >= 5
    obs, exp = np.append(counts[big], counts[~big].sum()), np.append(e[big], e[~big].sum())
    keep = exp > 0
    assert sps.chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue > 1e-3


def submitted(*reqs) -> list:
    """The requests as Engine.submit queues them (their clock starts now), for tests that drive a
    Scheduler directly."""
    now = time.perf_counter()
    for r in reqs:
        r.t_submit = now
    return list(reqs)


def run_request(pipe, prompt, on_tokens=None, *, wait_s: float = 120, **kw):
    """One request through the pipeline's engine; on_tokens(request) runs on the engine thread
    at each committed chunk, while the request's slot and KV tracks are live.
    -> (tokens, Stats); a request that ends with an error raises it, and so does a failing hook.
    wait_s: the longest wait for the next event."""
    import queue

    r = pipe.request(prompt, **kw)
    events: queue.SimpleQueue = queue.SimpleQueue()
    failed: list[Exception] = []  # a hook's failure, re-raised here (the engine would cancel the request)

    def sink(kind, value):
        if kind == "tokens" and on_tokens is not None and not failed:
            try:
                on_tokens(r)
            except Exception as e:  # noqa: BLE001
                failed.append(e)
        events.put((kind, value))

    r.sink = sink
    pipe.engine.submit(r)
    out = []
    while True:
        kind, value = events.get(timeout=wait_s)
        if kind == "tokens":
            out += value
        elif kind == "logprobs":
            r.token_logprobs.extend(value)
        elif kind == "error":
            raise value
        elif failed:
            raise failed[0]
        else:
            return out, value


def second_token_dist(pipe, prompt, cfg, prepack: bool = True):
    """Exact target distribution of the 2nd new token: sum_x p(x) p(. | x), via the target graph
    (a session of its own: the pipeline's pool stays the engine's). cfg: a SamplingConfig.
    prepack=False: that second session without prepacking (a big target: half its load peak).
    A load on the kernel graphs is compared with the kernel graph (a bundle stored without its
    portable graphs has no other)."""
    from specrt.runtime.backends.harness import SequenceHarness
    from specrt.runtime.backends.ort import OrtBackend
    from specrt.runtime.sampling.draws import probs

    man = pipe.manifest
    if pipe.parts.target.kernels:  # the graph the load runs: its kernel graph (one lane)
        from specrt.export.steps import kernel_decoder

        dec = kernel_decoder(pipe.folder, man.target)
    else:
        dec = SequenceHarness(OrtBackend(pipe.folder / man.target.graph, man.target, prepack=prepack))
    p1 = probs(dec.prefill(prompt), cfg)
    base = dec.length
    total = np.zeros_like(p1)
    for x in np.flatnonzero(p1 > 0):
        dec.rewind(base)
        total += p1[x] * probs(dec.forward([x])[0], cfg)
    return total


def packed_model(bundle, slots=8, lanes=8, max_seq_len=None, kernels=False):
    """-> (target entry, its KV pool of max_seq_len rows a slot (None: S_max), a PackedModel of
    `lanes` lanes over it: the kernel form of the graph with `kernels`)."""
    from specrt.runtime.backends.kvpool import KVPool
    from specrt.runtime.backends.packed import PackedModel
    from specrt.runtime.bundle.manifest import load_manifest

    e = load_manifest(bundle).target
    pool = KVPool(e.kv, slots, "cpu", max_seq_len=min(e.kv.max_seq_len, max_seq_len or e.kv.max_seq_len))
    graph = e.packed.kernel_file(lanes) if kernels else e.packed.file(lanes)
    return e, pool, PackedModel(bundle / graph, e, pool, lanes=lanes, threads=2, kernels=kernels)


def fill_slot(model, slot, tokens):
    """Prefill `tokens` into `slot` in the model's widest chunks."""
    p = 0
    while p < len(tokens):
        n = min(model.max_prefill_t, len(tokens) - p)
        model.run(slot, tokens[p : p + n], p, keep=1)
        p += n


class Snapshot:
    def __init__(self, pool):
        self.pool, self.saved = pool, [h.copy() for h in pool.host]

    def restore(self):
        for h, s in zip(self.pool.host, self.saved, strict=True):
            h[...] = s


def check_row_invariance(bundle, contexts, widths=(1, 2, 3, 5, 9, 17), kernels=False) -> int:
    """A packed target's row alone against the same row beside 1, 3 and 7 others of other
    widths and lengths (slot s prefilled with contexts[s] tokens), logits and K/V bit for bit.
    The pool's slots end just past the longest context's widest call (a 32k bundle's 8 slots at
    S_max, and their snapshot, would not fit in memory), so that row is near a buffer's end.
    -> the cases checked."""
    from specrt.runtime.bundle.manifest import load_manifest

    rows = max(contexts) + max(min(T, load_manifest(bundle).target.max_tokens_per_call) for T in widths) + 2
    e, pool, pm = packed_model(bundle, max_seq_len=rows + 22, kernels=kernels)
    rng = np.random.default_rng(0)
    V = e.vocab_size
    seqs = [rng.integers(3, V - 1, c + 20) for c in contexts]
    for s, c in enumerate(contexts):
        fill_slot(pm, s, seqs[s][:c])
    snap = Snapshot(pool)
    checked = 0
    for T in widths:
        T = min(T, pm.max_t)
        own = (0, seqs[0][contexts[0] : contexts[0] + T], contexts[0], None)
        snap.restore()
        alone = pm.run_packed([own])[0].copy()
        kv_alone = [h[0].copy() for h in pool.host]
        for others in (1, 3, 7):
            snap.restore()
            batch = [own] + [(s, seqs[s][contexts[s] : contexts[s] + 1 + (s * 5 + T) % 9], contexts[s], None)
                             for s in range(1, 1 + others)]
            got = pm.run_packed(batch[::-1] if others == 3 else batch)  # any order in the call
            mine = got[-1] if others == 3 else got[0]
            assert np.array_equal(mine, alone), f"{bundle.name}: width {T} beside {others} rows"
            assert all(np.array_equal(h[0], k) for h, k in zip(pool.host, kv_alone, strict=True))
            checked += 1
    return checked


def assert_missing_file_is_a_bundle_error(bundle, rel: str, tmp_path) -> None:
    """A copy of `bundle` without its file `rel` is refused when its manifest is read, with an
    error naming the file (an interrupted copy is not a bundle)."""
    import re
    import shutil

    import pytest

    from specrt.runtime.bundle.manifest import BundleError, load_manifest

    b = tmp_path / "b"
    shutil.copytree(bundle, b)
    (b / rel).unlink()
    with pytest.raises(BundleError, match=re.escape(rel.rsplit("/", 1)[-1]) + " is missing"):
        load_manifest(b)


def kernel_model(graph) -> bytes:
    """An onnx.GraphProto of specrt's operators (native/) as a serialized model."""
    from onnx import helper

    from specrt.runtime import kernels

    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(kernels.DOMAIN, 1)])
    m.ir_version = 10
    return m.SerializeToString()


# specrt's operators' instruction-set forms on this architecture, lowest first (native/isa.h)
ARM64 = __import__("platform").machine() in ("aarch64", "arm64")
# (avxvnni: the AVX2 form with 256-bit vpdpbusd, run on AVX-512 hosts in its EVEX encoding)
ISA_FORMS = ("ref", "neon", "dotprod") if ARM64 else ("ref", "avx2", "avxvnni", "vnni", "amx")
FAST_FORMS = ISA_FORMS[1:3] if ARM64 else ISA_FORMS[1:4]  # every operator has them (AMX hosts run attention in VNNI)


def forms_here() -> list[str]:
    """The forms this CPU runs: those the library takes when SPECRT_KERNELS_ISA names them (a
    form the CPU lacks leaves its best; avxvnni needs AVX-VNNI or AVX-512 VL + VNNI)."""
    import os

    from specrt.runtime import kernels

    old = os.environ.pop("SPECRT_KERNELS_ISA", None)
    try:
        best = kernels.isa()
        here = []
        for f in ISA_FORMS:
            os.environ["SPECRT_KERNELS_ISA"] = f
            if kernels.isa() == f:
                here.append(f)
        return here if best in here else [*here, best]
    finally:
        os.environ.pop("SPECRT_KERNELS_ISA", None)
        if old is not None:
            os.environ["SPECRT_KERNELS_ISA"] = old


def isa_forms(forms: tuple[str, ...] = ISA_FORMS) -> list:
    """`forms` as pytest parameters, each one this CPU cannot run marked skipped with the reason,
    so a host without AVX-512 (or AMX, or AVX-VNNI) reports what it did not check instead of
    dropping it."""
    import pytest

    from specrt.runtime import kernels

    have = forms_here()
    why = {"avxvnni": "neither AVX-VNNI nor AVX-512 VL + VNNI (vpdpbusd on 256 bits)"}
    return [pytest.param(f, marks=() if f in have else pytest.mark.skip(
        reason=f"this CPU runs specrt's operators in {', '.join(have)} (best {kernels.isa()}), not {f}"
               + (f": it has {why[f]}" if f in why else ""))) for f in forms]


def kernel_session(blob: bytes, form: str, monkeypatch, threads: int = 2):
    """An onnxruntime session over `blob` with specrt's operators in instruction-set form `form`
    (one of ISA_FORMS; SPECRT_KERNELS_ISA is read when the session creates its kernels)."""
    import onnxruntime as ort

    from specrt.runtime import kernels

    monkeypatch.setenv("SPECRT_KERNELS_ISA", form)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    kernels.register(so)
    return ort.InferenceSession(blob, so, providers=["CPUExecutionProvider"])
