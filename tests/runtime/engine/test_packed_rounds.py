"""Rounds over a packed target (runtime/backends/packed.py `PackedModel.run_batch`): every running row's
tokens in one target call per step, and each request's tokens *and logprobs* the same floats
alone, beside other requests, and without a draft — no near-tie allowance: the packed path
computes a row the same way in any call (tests/export/test_packed.py)."""

import threading

import numpy as np
import pytest

import specrt
from checks import submitted
from specrt.runtime.engine.request import DECODE

LENS = [24, 40, 17, 33, 28, 12, 36, 20]


def _prompts(pipe, n):
    rng = np.random.default_rng(7)
    return [list(map(int, rng.integers(3, pipe.manifest.target.vocab_size - 1, 5 + 3 * i))) for i in range(n)]


def _run(pipe, prompt, n, **kw):
    r = pipe.request(prompt, max_new_tokens=n, logprobs=2, **kw)
    toks = [t for c in pipe.submit(r) for t in c]
    return toks, [(e.token, e.logprob, tuple(e.top)) for e in r.token_logprobs]


def _together(pipe, prompts, **kw):
    got = {}

    def client(i):
        got[i] = _run(pipe, prompts[i], LENS[i], **kw)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    return [got[i] for i in range(len(prompts))]


@pytest.mark.parametrize("bundle", ["good", "int8"])
def test_tokens_and_logprobs_are_the_same_floats_alone_together_and_without_a_draft(tiny_bundles, bundle):
    pipe = specrt.load(tiny_bundles[bundle], max_batch=8)
    try:
        assert type(pipe.parts.target).__name__ == "PackedModel" and pipe.parts.target.lanes == 8
        d, t = pipe.parts.draft, pipe.parts.target  # the draft packs too, without fillers (its numbers
        # only decide acceptance); the target writes them unless its kernel graph is one_row
        assert type(d).__name__ == "PackedModel" and d.filler is False and t.filler is not (t.kernels and t.entry.packed.one_row)
        prompts = _prompts(pipe, 8)
        want = [_run(pipe, p, n, draft="none") for p, n in zip(prompts, LENS, strict=True)]
        for draft, adaptive in [("model", False), ("model", True), ("ngram", True), ("auto", True)]:
            for n in (1, 4, 8):
                got = _together(pipe, prompts[:n], draft=draft, adaptive=adaptive, k=4)
                for i in range(n):
                    assert got[i] == want[i], f"{bundle} {draft} adaptive={adaptive} at {n}: request {i}"
    finally:
        pipe.close()


def test_seeded_sampling_equals_target_only_under_load(tiny_bundles):
    pipe = specrt.load(tiny_bundles["good"], max_batch=4)
    try:
        prompts = _prompts(pipe, 4)
        kw = dict(temperature=0.9, top_p=0.95, seed=11)
        want = [_run(pipe, p, n, draft="none", **kw) for p, n in zip(prompts, LENS[:4], strict=True)]
        got = _together(pipe, prompts, draft="model", adaptive=True, **kw)
        assert got == want
    finally:
        pipe.close()


def test_drafting_rows_share_the_steps_call(tiny_bundles):
    """Four requests drafting with a fixed k: each step is one target call for all of them
    (prefill chunks apart), where the unpacked graph makes one per drafting row."""
    calls = {}
    for packed in (True, False):
        pipe = specrt.load(tiny_bundles["good"], max_batch=4, packed=packed)
        try:
            prompts = _prompts(pipe, 4)
            before = pipe.counters()
            _together(pipe, prompts, draft="model", adaptive=False, k=4)
            after = pipe.counters()
            calls[packed] = (after["target_calls"] - before["target_calls"], after["steps"] - before["steps"])
        finally:
            pipe.close()
    (packed_calls, packed_steps), (plain_calls, _) = calls[True], calls[False]
    assert packed_calls < plain_calls
    # one per step: prompt chunks ride in the step's call, or share one when nothing decodes
    assert packed_calls <= packed_steps + 4


def test_a_failing_draft_call_ends_only_its_request(tiny_bundles, monkeypatch):
    """A packed draft call that fails is retried request by request: only the request whose
    call fails alone ends (with its error); the others get their solo output."""
    pipe = specrt.load(tiny_bundles["good"], max_batch=4)
    try:
        prompts = _prompts(pipe, 3)
        want = [_run(pipe, p, n, draft="none")[0] for p, n in zip(prompts, LENS[:3], strict=True)]
        draft = pipe.parts.draft
        real = draft.run_packed
        bad = pipe.request(prompts[0], max_new_tokens=LENS[0], draft="model", adaptive=False, k=3)

        def failing(seqs):
            if any(s == bad.slot for s, _, _, _ in seqs) and bad.produced > 3:
                raise RuntimeError("draft boom")
            return real(seqs)

        monkeypatch.setattr(draft, "run_packed", failing)
        errs, got = [], {}

        def bad_client():
            try:
                list(pipe.submit(bad))
            except RuntimeError as e:
                errs.append(str(e))

        def good(i):
            got[i] = [t for c in pipe.stream_ids(prompts[i], max_new_tokens=LENS[i], draft="model", adaptive=False,
                                                 k=3) for t in c]

        threads = [threading.Thread(target=bad_client)] + [threading.Thread(target=good, args=(i,)) for i in (1, 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert errs == ["draft boom"] and bad.stats.stop_reason == "error"
        assert got[1] == want[1] and got[2] == want[2]
    finally:
        pipe.close()


@pytest.mark.parametrize("draft", ["none", "model"])
def test_a_prompt_being_read_rides_in_the_steps_call(tiny_bundles, draft):
    """B's prompt (several chunks) arrives while A decodes: every step while B reads is one
    target call holding A's row and B's chunk, and both answers (tokens and logprobs) are their
    solo ones. Prompt chunks of requests that arrive together share one call."""
    pipe = specrt.load(tiny_bundles["good"], max_batch=4)
    try:
        sched = pipe.scheduler
        chunk = pipe.parts.target.max_prefill_t
        g = np.random.default_rng(3)
        V = pipe.manifest.target.vocab_size
        pa, pb = [list(map(int, g.integers(3, V - 1, n))) for n in (9, 3 * chunk + 5)]
        want = {n: _run(pipe, p, 24, draft="none") for n, p in (("a", pa), ("b", pb))}
        sched.forget_prefixes()  # B reads its whole prompt
        a = pipe.request(pa, max_new_tokens=24, logprobs=2, draft=draft, adaptive=False, k=3)
        b = pipe.request(pb, max_new_tokens=24, logprobs=2, draft=draft, adaptive=False, k=3)
        out = {(r.id, kind): [] for r in (a, b) for kind in ("tokens", "logprobs")}
        for r in (a, b):
            r.sink = lambda kind, v, r=r: out[r.id, kind].extend(v) if (r.id, kind) in out else None
        queue = submitted(a)
        sched.step(lambda: queue.pop() if queue else None)
        assert a.state == DECODE
        queue = submitted(b)
        calls = []
        while b.state != DECODE:
            before = sched.counters.target_calls
            sched.step(lambda: queue.pop() if queue else None)
            calls.append(sched.counters.target_calls - before)
        assert calls == [1, 1, 1, 1] and a.state == DECODE  # 4 chunks, each beside A's row
        while sched.running:
            sched.step()
        for r, name in ((a, "a"), (b, "b")):
            got = (out[r.id, "tokens"], [(e.token, e.logprob, tuple(e.top)) for e in out[r.id, "logprobs"]])
            assert got == want[name], name
        # arriving together: their first chunks share one call
        sched.forget_prefixes()
        c, d = (pipe.request(p, max_new_tokens=4, draft="none") for p in (pa, pa[::-1]))
        queue = submitted(c, d)
        before = sched.counters.target_calls
        sched.step(lambda: queue.pop(0) if queue else None)
        # one call for both prompts, then the round (one call): each has its first two tokens
        assert sched.counters.target_calls - before == 2 and c.produced == d.produced == 2
        while sched.running:
            sched.step()
    finally:
        pipe.close()


def test_a_chunk_that_fails_in_the_steps_call_ends_only_its_request(tiny_bundles, monkeypatch):
    """The target call carrying A's row and B's prompt chunk fails where B's chunk is: each is
    tried alone, B ends with its error, A goes on to its solo answer."""
    pipe = specrt.load(tiny_bundles["good"], max_batch=4)
    try:
        sched, target = pipe.scheduler, pipe.parts.target
        g = np.random.default_rng(4)
        V = pipe.manifest.target.vocab_size
        pa, pb = [list(map(int, g.integers(3, V - 1, n))) for n in (9, 2 * target.max_prefill_t)]
        want = _run(pipe, pa, 20, draft="none")[0]
        sched.forget_prefixes()
        a = pipe.request(pa, max_new_tokens=20, draft="none")
        b = pipe.request(pb, max_new_tokens=20, draft="none")
        out, ends = [], {}
        a.sink = lambda kind, v: out.extend(v) if kind == "tokens" else None
        b.sink = lambda kind, v: ends.setdefault(kind, v)
        real = target.run_packed

        def failing(seqs):
            if any(s == b.slot and len(t) > 1 for s, t, _, _ in seqs):
                raise RuntimeError("chunk boom")
            return real(seqs)

        queue = submitted(a)
        sched.step(lambda: queue.pop() if queue else None)
        monkeypatch.setattr(target, "run_packed", failing)
        queue = submitted(b)
        while sched.running:
            sched.step(lambda: queue.pop() if queue else None)
        assert str(ends.get("error")) == "chunk boom" and b.stats.stop_reason == "error"
        assert out == want
    finally:
        pipe.close()
