"""Many requests on one pipeline: every request gets exactly its solo output, whatever else runs.

Real exported models through real onnxruntime sessions: the tiny bundles (fast) and the default
bundle (slow). Each concurrency test here fails on a pipeline that is one sequence (the code
before the engine: two threads corrupted each other's KV length).
"""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

import specrt
from checks import assert_same_greedy
from specrt.runtime import ContextOverflow, EngineBusy, InvalidSampling
from specrt.runtime.policy.adaptive import Costs
from specrt.runtime.policy.plan import Row, plan

MODES = [("model", False), ("model", True), ("ngram", False), ("ngram", True), ("auto", True)]


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(3, 120, size=int(rng.integers(2, 60)))] for _ in range(n)]


def _repetitive(n: int) -> list[list[int]]:
    """Prompts an n-gram drafter can copy from."""
    return [[5 + i, 6, 7, 8, 9, 10 + i, 5 + i, 6, 7, 8, 9] * 3 for i in range(n)]


def _solo(pipe, prompt, n, **kw):
    return [t for c in pipe.stream_ids(prompt, max_new_tokens=n, draft="none", k=0, **kw) for t in c]


def _margins(pipe, prompt, tokens):
    """Top-2 logit gap of the target at every position of a greedy run (near-tie evidence)."""
    from specrt.runtime.backends.harness import SequenceHarness
    from specrt.runtime.backends.ort import OrtBackend

    man = pipe.manifest
    dec = SequenceHarness(OrtBackend(pipe.folder / man.target.graph, man.target))
    seq = list(prompt) + list(tokens)
    out = []
    logits = dec.prefill(seq[: len(prompt)])
    for i in range(len(tokens)):
        top = np.sort(logits)[-2:]
        out.append(float(top[1] - top[0]))
        logits = dec.forward([seq[len(prompt) + i]])[0]
    return out


@pytest.fixture(scope="module")
def shared_int8(tiny_bundles):
    pipe = specrt.load(tiny_bundles["int8"], max_batch=4, max_queue=32, adaptive=False)
    yield pipe
    pipe.close()


@pytest.fixture
def int8(shared_int8):
    """The module's pipeline, loaded once, with nothing learned by adaptive k in earlier tests."""
    shared_int8.forget_learned()
    return shared_int8


@pytest.mark.parametrize("draft,adaptive", MODES)
def test_staggered_threads_each_get_their_solo_output(int8, draft, adaptive):
    """12 requests, different prompt and output lengths, started at staggered times from their
    own threads, 4 slots (so some wait in the queue). Each client starts when the one before it
    has its first token: staggered by the engine's progress, not by wall time, so requests
    overlap on any machine (a fixed sleep let a fast engine finish each before the next came:
    the overlap check failed now and then, with prompts reused from the cache more so)."""
    prompts = _prompts(6) + _repetitive(6)
    lens = [5 + 7 * i % 40 for i in range(len(prompts))]
    want = [_solo(int8, p, n) for p, n in zip(prompts, lens, strict=True)]
    got: dict[int, list[int]] = {}
    errors = []
    started = [threading.Event() for _ in prompts]
    before = int8.counters()

    def client(i):
        try:
            if i:
                started[i - 1].wait(30)
            got[i] = []
            for c in int8.stream_ids(prompts[i], max_new_tokens=lens[i], draft=draft, k=4, adaptive=adaptive):
                got[i] += c
                started[i].set()
        except Exception as e:  # noqa: BLE001
            errors.append(e)
        finally:
            started[i].set()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    for i, w in enumerate(want):
        assert_same_greedy(got[i], w)
    c = int8.counters()
    assert c["running"] == 0 and c["waiting"] == 0
    assert c["rows"] - before["rows"] > c["steps"] - before["steps"]  # some steps served several requests


def test_interleaved_generators(int8):
    """Two streams advanced alternately by one thread."""
    p1, p2 = _prompts(2, seed=3)
    w1, w2 = _solo(int8, p1, 30), _solo(int8, p2, 30)
    g1, g2 = int8.stream_ids(p1, max_new_tokens=30, k=3), int8.stream_ids(p2, max_new_tokens=30, k=3)
    a, b = [], []
    for c1, c2 in zip(g1, g2, strict=False):
        a += c1
        b += c2
    a += [t for c in g1 for t in c]
    b += [t for c in g2 for t in c]
    assert a == w1 and b == w2


def test_asyncio_gather_of_many_requests(int8):
    prompts = _prompts(10, seed=5)
    want = [_solo(int8, p, 20) for p in prompts]

    async def one(p):
        return [t for c in [c async for c in int8.astream_ids(p, max_new_tokens=20, k=4)] for t in c]

    async def main():
        return await asyncio.gather(*(one(p) for p in prompts))

    got = asyncio.run(main())
    assert got == want


def test_agenerate_and_text_stream(int8):
    res = asyncio.run(int8.agenerate("w5 w6 w7", max_new_tokens=12, chat=False))
    ref = int8.generate("w5 w6 w7", max_new_tokens=12, chat=False, draft="none", k=0)
    assert res.token_ids == ref.token_ids and res.text == ref.text


def test_cancel_mid_stream_frees_the_slot(tiny_bundles):
    pipe = specrt.load(tiny_bundles["int8"], max_batch=1, max_queue=4)
    try:
        p1, p2 = _prompts(2, seed=7)
        gen = pipe.stream_ids(p1, max_new_tokens=200, k=2, ignore_eos=True)
        next(gen)
        assert pipe.counters()["running"] == 1
        gen.close()  # returns once the engine retired the request
        assert pipe.counters()["running"] == 0
        # the only slot is free again: the next request runs, and correctly
        assert [t for c in pipe.stream_ids(p2, max_new_tokens=16) for t in c] == _solo(pipe, p2, 16)
    finally:
        pipe.close()


def test_full_queue_is_a_clear_error_and_nothing_is_lost(tiny_bundles):
    pipe = specrt.load(tiny_bundles["none"], max_batch=1, max_queue=1, draft="none")
    try:
        prompt = _prompts(1, seed=9)[0]
        # long enough that the running request still holds the slot while the next two arrive
        # (its prompt is cached from the solo run: it starts decoding at once)
        want = _solo(pipe, prompt, 200, ignore_eos=True)
        running = pipe.stream_ids(prompt, max_new_tokens=200, ignore_eos=True)
        first = next(running)  # admitted: holds the only slot
        queued = pipe.stream_ids(prompt, max_new_tokens=200, ignore_eos=True)  # waits in the queue (size 1)
        with pytest.raises(EngineBusy, match="max_queue=1"):
            pipe.stream_ids(prompt, max_new_tokens=200)
        assert first + [t for c in running for t in c] == want
        assert [t for c in queued for t in c] == want
    finally:
        pipe.close()


def test_a_failing_request_does_not_disturb_the_others(int8, monkeypatch):
    prompts = _prompts(3, seed=11)
    want = [_solo(int8, p, 25) for p in prompts]
    # bad requests are refused before they reach the engine ...
    with pytest.raises(ContextOverflow):
        int8.stream_ids(prompts[0], max_new_tokens=10_000)
    with pytest.raises(InvalidSampling):
        int8.stream_ids(prompts[0], temperature=-1.0)
    # ... and one whose model call fails mid-run ends alone, with its error
    target = int8.parts.target
    bad = int8.request(prompts[0], max_new_tokens=25, k=3)
    real = target.run_batch  # every row of a step in one batch: the batch fails for all,
    # each row is retried alone, and only the bad one fails again

    def failing(batch):
        if any(s == bad.slot and batch.count(i) > 1 for i, s in enumerate(batch.slots)) and bad.produced > 3:
            raise RuntimeError("boom")  # a verification call, mid-run
        return real(batch)

    monkeypatch.setattr(target, "run_batch", failing)
    got, errs = {}, []

    def good(i):
        got[i] = [t for c in int8.stream_ids(prompts[i], max_new_tokens=25, k=3) for t in c]

    def failing_client():
        import queue

        q = queue.SimpleQueue()
        bad.sink = lambda kind, value: q.put((kind, value))
        int8.engine.submit(bad)
        try:
            list(int8._drain(bad, q))
        except RuntimeError as e:
            errs.append(e)

    threads = [threading.Thread(target=client) for client in (failing_client,)] + \
        [threading.Thread(target=good, args=(i,)) for i in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [str(e) for e in errs] == ["boom"]
    assert bad.stats.stop_reason == "error"
    assert got[1] == want[1] and got[2] == want[2]
    assert int8.counters()["running"] == 0


def test_seed_reproduces_sampling_whatever_else_runs(int8):
    """A sampled request's output with fixed k depends only on its seed: alone or beside other
    requests (greedy and sampled) it is the same."""
    prompt = _prompts(1, seed=13)[0]
    kw = dict(max_new_tokens=30, temperature=0.9, top_p=0.95, seed=42, k=3)
    alone = [t for c in int8.stream_ids(prompt, **kw) for t in c]
    others = _prompts(3, seed=14)
    got = {}

    def run(key, p, **k):
        got[key] = [t for c in int8.stream_ids(p, **k) for t in c]

    threads = [threading.Thread(target=run, args=("me", prompt), kwargs=kw)]
    threads += [threading.Thread(target=run, args=(i, p), kwargs=dict(max_new_tokens=30, temperature=0.7 * (i % 2),
                                                                         seed=i, k=2))
                for i, p in enumerate(others)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert got["me"] == alone
    assert [t for c in int8.stream_ids(prompt, **{**kw, "seed": 43}) for t in c] != alone  # the seed matters


def test_batched_sampling_follows_the_target_distribution(tiny_bundles):
    """The second token's distribution over many seeded requests decoded 4 at a time (batched
    rows, drafting rows and plain rows mixed; the second token comes from verifying a k = 1
    draft) matches the target's own, by chi-square."""
    from scipy.stats import chisquare

    from specrt.runtime.backends.harness import SequenceHarness
    from specrt.runtime.backends.ort import OrtBackend
    from specrt.runtime.sampling.draws import SamplingConfig, probs

    pipe = specrt.load(tiny_bundles["bad"], max_batch=4, max_queue=2000, adaptive=False)
    try:
        cfg = SamplingConfig(1.0, 0, 1.0)
        prompt = [5, 9, 17]
        man = pipe.manifest
        dec = SequenceHarness(OrtBackend(pipe.folder / man.target.graph, man.target))
        p1 = probs(dec.prefill(prompt), cfg)
        n = 1200
        firsts, seconds = [], []

        async def one(seed, k):
            toks = [t for c in [c async for c in pipe.astream_ids(prompt, max_new_tokens=3, temperature=1.0,
                                                                 seed=seed, k=k, ignore_eos=True)] for t in c]
            return toks

        async def main():
            return await asyncio.gather(*(one(s, 1 + s % 3) for s in range(n)))

        for toks in asyncio.run(main()):
            firsts.append(toks[0])
            seconds.append(toks[1])
        # first token: exactly the target's distribution
        counts = np.bincount(firsts, minlength=len(p1))
        keep = p1 * n >= 5
        exp = np.append(p1[keep] * n, p1[~keep].sum() * n)
        obs = np.append(counts[keep], counts[~keep].sum())
        assert chisquare(obs, exp * obs.sum() / exp.sum()).pvalue > 1e-3
        # second token after the most common first token: the target's conditional
        top = int(np.bincount(firsts).argmax())
        dec.reset()
        p2 = probs(dec.prefill(prompt + [top]), cfg)
        sec = [s for f, s in zip(firsts, seconds, strict=True) if f == top]
        counts = np.bincount(sec, minlength=len(p2))
        m = len(sec)
        keep = p2 * m >= 5
        exp = np.append(p2[keep] * m, p2[~keep].sum() * m)
        obs = np.append(counts[keep], counts[~keep].sum())
        assert m > 100 and chisquare(obs, exp * obs.sum() / exp.sum()).pvalue > 1e-3
        assert pipe.counters()["rows"] > pipe.counters()["steps"]  # rows were batched
    finally:
        pipe.close()


def test_healed_sampling_follows_the_target_distribution_under_the_constraint(tiny_bundles):
    """Token healing (RequestOptions.text_prefix) masks target and draft rows alike, so a
    seeded, speculative request's first token follows the target's distribution restricted to
    the tokens that keep the text on course, by chi-square (k = 1..3, 4 requests at a time)."""
    from scipy.stats import chisquare

    from specrt.runtime.backends.harness import SequenceHarness
    from specrt.runtime.backends.ort import OrtBackend
    from specrt.runtime.sampling.draws import SamplingConfig, probs
    from specrt.runtime.sampling.text_prefix import TextPrefix, prefix_index

    pipe = specrt.load(tiny_bundles["bad"], max_batch=4, max_queue=2000, adaptive=False)
    try:
        prompt, n = [5, 9, 17], 1200
        man = pipe.manifest
        dec = SequenceHarness(OrtBackend(pipe.folder / man.target.graph, man.target))
        allowed = TextPrefix(prefix_index(pipe.tokenizer, man.target.vocab_size), "w1").masks()[0]
        assert 10 < allowed.sum() < 100  # w10..w19, w100..w127 of the word-level tiny vocabulary
        p = probs(dec.prefill(prompt), SamplingConfig(1.0, 0, 1.0)) * allowed
        p /= p.sum()

        async def one(seed):
            return [t for c in [c async for c in pipe.astream_ids(prompt, max_new_tokens=2, temperature=1.0, seed=seed,
                                                                   k=1 + seed % 3, text_prefix="w1", ignore_eos=True)]
                    for t in c]

        async def main():
            return await asyncio.gather(*(one(s) for s in range(n)))

        firsts = [toks[0] for toks in asyncio.run(main())]
        assert all(allowed[t] for t in firsts)
        counts = np.bincount(firsts, minlength=len(p))
        keep = p * n >= 5
        exp = np.append(p[keep] * n, p[~keep].sum() * n)
        obs = np.append(counts[keep], counts[~keep].sum())
        assert keep.sum() >= 5 and chisquare(obs, exp * obs.sum() / exp.sum()).pvalue > 1e-3
        c = pipe.counters()
        assert c["rows"] > c["steps"]  # rows were batched
    finally:
        pipe.close()


def test_batched_rows_equal_single_calls(tiny_bundles):
    """One call of b rows x 1 token over ragged pasts gives each row the logits of its own
    single-sequence call; slots in the range that are not served are untouched below their
    spare row."""
    pipe = specrt.load(tiny_bundles["none"], max_batch=4, draft="none")
    try:
        t, pool = pipe.parts.target, pipe.parts.target.pool
        prompts = _prompts(4, seed=21)
        slots = [pool.alloc() for _ in prompts]
        for s, p in zip(slots, prompts, strict=True):
            t.run(s, np.array(p), 0)
            pool.advance("target", s, len(p))
        before = pool.host[0][2].copy()
        nxt = np.array([7, 8, 9, 10])
        pasts = np.array([len(p) for p in prompts])
        rows = t.run_rows(0, nxt, pasts).copy()
        served = [0, 1, 3]  # slot 2 is covered but not served: filler at its spare row
        pasts2 = pasts.copy()
        pasts2[2] = pool.spare_row(2)
        t.run_rows(0, nxt, pasts2)
        assert np.array_equal(pool.host[0][2][:, : len(prompts[2])], before[:, : len(prompts[2])])
        for s in served:
            one = t.run(s, nxt[s : s + 1], int(pasts[s]))[0]
            np.testing.assert_allclose(rows[s], one, atol=1e-5)
    finally:
        pipe.close()


def test_plan_drafts_alone_and_stops_under_load():
    """The batch plan on this machine class's measured shape (docs/design.md): alone it is the
    single-request rule argmax_k E(k) / (k d + v(k+1)); for eight requests it drafts nothing;
    a poor draft never drafts."""
    costs = Costs({1: 10.0, 2: 11.9, 3: 13.0, 5: 15.0, 6: 15.7, 9: 18.5, 17: 25.9}, draft_ms=4.5,
                  rows_ms={1: 10.0, 2: 13.2, 4: 15.3, 8: 21.2, 16: 30.7},
                  draft_rows_ms={1: 4.5, 2: 5.5, 4: 6.5, 8: 9.0, 16: 13.0})
    good = np.concatenate(([1.0], 1 + np.cumsum(np.cumprod(np.full(8, 0.9)))))
    poor = np.concatenate(([1.0], 1 + np.cumsum(np.cumprod(np.full(8, 0.2)))))
    alone = [good[k] / (k * 4.5 + costs.verify_ms(k + 1)) if k else good[0] / 10.0 for k in range(6)]
    assert plan([Row(5, good[:6])], costs) == [int(np.argmax(alone))] and np.argmax(alone) > 0
    assert plan([Row(5, good[:6]) for _ in range(8)], costs) == [0] * 8
    assert plan([Row(5, poor[:6])], costs) == [0]
    # n-gram rows cost no draft calls: they draft under more load than model rows
    assert plan([Row(5, good[:6]) for _ in range(3)], costs) == [0, 0, 0]
    assert sum(plan([Row(5, good[:6], lookup=True) for _ in range(3)], costs)) > 0


@pytest.mark.parametrize("packed,reading", [(False, 0), (True, 0), (True, 40)])
def test_plan_equals_a_brute_force_search(packed, reading):
    """The vectorized plan finds the best (ceiling, drafting rows) of the search it replaces, on
    random rows: mixed k, acceptance, n-gram and model routes. With a prompt chunk riding in a
    packed step's call, the best is the most tokens less the step's time at the best rate a step
    without the chunk reaches."""
    from specrt.runtime.policy.plan import step_ms

    costs = Costs({1: 19.3, 2: 19.6, 3: 20.5, 5: 21.8, 9: 25.2, 17: 32.8, 64: 90.0}, draft_ms=7.2,
                  rows_ms={1: 19.3, 2: 20.2, 4: 21.2, 8: 28.5}, draft_rows_ms={1: 7.2, 2: 8.1, 4: 10.8, 8: 18.3})
    costs.packed = packed

    def value(rows, ks, best=None):
        tokens = sum(r.expected[k] if k else 1.0 for r, k in zip(rows, ks, strict=True))
        if best is None:
            return tokens / step_ms(rows, ks, costs)
        return tokens - best * step_ms(rows, ks, costs, reading)

    def brute(rows, best=None):
        n, top = len(rows), value(rows, [0] * len(rows), best)
        for cap in range(1, max(r.k for r in rows) + 1):
            ks = [min(r.k, cap) for r in rows]
            order = sorted((i for i in range(n) if ks[i] > 0), key=lambda i: -rows[i].expected[ks[i]])
            for m in range(1, len(order) + 1):
                trial = [ks[i] if i in order[:m] else 0 for i in range(n)]
                top = max(top, value(rows, trial, best))
        return top

    g = np.random.default_rng(0)
    for _ in range(150):
        rows = []
        for _ in range(int(g.integers(1, 9))):
            k, a = int(g.integers(0, 9)), g.uniform(0.3, 0.98)
            rows.append(Row(k, np.concatenate(([1.0], 1 + np.cumsum(np.cumprod(np.full(k, a))))), bool(g.random() < 0.3),
                            first=int(g.integers(1, 3))))
        best = brute(rows)
        if reading:
            assert value(rows, plan(rows, costs, reading), best) == pytest.approx(brute(rows, best), rel=1e-9, abs=1e-9)
        else:
            assert value(rows, plan(rows, costs)) == pytest.approx(best, rel=1e-12)


def test_a_riding_prompt_chunk_prices_draft_tokens_at_the_calls_width():
    """A packed call's cost is flat while the weights stream (up to ~9 tokens here), then grows
    with every token. Four rows draft when the step is theirs; with a 64-token prompt chunk in the
    call each draft token costs its share of the compute, and the plan drafts less (not more, as
    it would if the chunk's time counted as the rows' own)."""
    costs = Costs({1: 20.0, 2: 20.2, 4: 20.6, 9: 21.5, 17: 30.0, 64: 80.0, 128: 150.0}, draft_ms=4.0,
                  draft_rows_ms={1: 4.0, 2: 4.4, 4: 5.0})
    costs.packed = True
    def rows(a):
        return [Row(4, np.concatenate(([1.0], 1 + np.cumsum(np.cumprod(np.full(4, a)))))) for _ in range(4)]

    assert plan(rows(0.9), costs) == [3] * 4 and plan(rows(0.9), costs, 64) == [2] * 4
    assert plan(rows(0.5), costs) == [1] * 4 and plan(rows(0.5), costs, 64) == [0] * 4


def test_the_first_draft_call_is_priced_at_the_rows_catching_up():
    """A round's first draft call reads the one or two tokens each drafting row's draft lacks:
    four rows at two tokens each make it an 8-token call. That cost is the same for every k >= 1,
    so with it the plan drafts further (k = 3, the better rate, as the step's model computes it)
    where pricing a 4-token call chose k = 2."""
    from specrt.runtime.policy.plan import step_ms

    costs = Costs({1: 55.0, 2: 70.0, 4: 80.0, 9: 98.0, 12: 107.0, 16: 121.0, 17: 163.0}, draft_ms=16.5,
                  draft_rows_ms={1: 16.5, 2: 19.0, 4: 23.0, 8: 34.0})
    costs.packed = True
    e = np.concatenate(([1.0], 1 + np.cumsum(np.cumprod(np.full(4, 0.85)))))

    def rows(first):
        return [Row(4, e, first=first) for _ in range(4)]

    def rate(rs, k):
        return 4 * e[k] / step_ms(rs, [k] * 4, costs)

    for first in (1, 2):
        assert plan(rows(first), costs) == [max((1, 2, 3, 4), key=lambda k: rate(rows(first), k))] * 4
    assert plan(rows(1), costs) == [2] * 4 and plan(rows(2), costs) == [3] * 4
    assert step_ms(rows(2), [3] * 4, costs) - step_ms(rows(1), [3] * 4, costs) == pytest.approx(34.0 - 23.0)


@pytest.mark.parametrize("plan_batches,packed", [(True, False), (False, False), (True, True)])
def test_policy_mode_drafts_nothing_under_load(tiny_bundles, plan_batches, packed):
    """Call costs where drafting pays alone but not beside three others when every drafting row
    is a call of its own: with the batch plan, adaptive requests decoding together draft nothing
    (without it they do), and their outputs are still their solo outputs. With a packed target
    the drafting rows share the step's one call, and the same costs make the plan draft."""
    pipe = specrt.load(tiny_bundles["int8"], max_batch=4, adaptive=True, plan_batches=plan_batches, packed=packed)
    try:
        # a verification call costs about a step (the weights streamed again), while a token
        # more in a call costs little: the packed step holds every row's drafts for ~1.5 steps
        costs = Costs({1: 10.0, 2: 10.2, 3: 10.4, 5: 10.8, 9: 11.6}, draft_ms=1.0,
                      rows_ms={1: 10.0, 2: 10.3, 4: 11.0}, draft_rows_ms={1: 1.0, 2: 1.1, 4: 1.2})
        pipe.store._costs = costs  # the probe's place: a probe on this machine measures its own
        costs.packed = packed
        pipe.use_costs(costs)  # the pipeline took the probe's at load
        # a draft accepted at 0.6 a position (at the tiny int8 draft's measured agreement even a
        # verification call per row pays: ~7 tokens a call at 0.95)
        pipe.store.draft_prior = lambda: 0.6
        prompts = _prompts(4, seed=31)
        want = [_solo(pipe, p, 20) for p in prompts]
        seen = []
        planner = pipe.scheduler.round.planner
        real = planner.choose_ks
        planner.choose_ks = lambda rows, costs, running=None, reading=0: seen.append((len(rows), real(rows, costs, running, reading))) or seen[-1][1]
        gens = [pipe.stream_ids(p, max_new_tokens=20) for p in prompts]
        got = [[t for c in g for t in c] for g in gens]
        assert got == want
        together = [c.ks for n, c in seen if n > 1]
        assert together
        assert all(k == 0 for ks in together for k in ks) == (plan_batches and not packed)
    finally:
        pipe.close()


def test_one_sequence_per_call_lowering_under_concurrency(tiny_dirs, tmp_path):
    """The standard lowering runs one sequence per call (no batched rows): requests decoding
    together still get their solo outputs (each call's logits are taken before the next)."""
    from specrt.export import export_bundle

    folder = export_bundle(str(tiny_dirs["target"]), tmp_path / "std", draft="none", lowering="standard",
                           max_seq_len=128, max_draft_tokens=4, echo=None) and tmp_path / "std"
    pipe = specrt.load(folder, max_batch=3, hugepages=False, adaptive=False)
    try:
        assert not pipe.parts.target.batch_rows
        prompts = _prompts(3, seed=41)
        want = [_solo(pipe, p, 20) for p in prompts]
        gens = [pipe.stream_ids(p, max_new_tokens=20) for p in prompts]
        firsts = [next(g) for g in gens]
        assert [f + [t for c in g for t in c] for f, g in zip(firsts, gens, strict=True)] == want
        assert pipe.counters()["rows"] > pipe.counters()["steps"]
    finally:
        pipe.close()


def test_a_client_that_cannot_take_events_does_not_stop_the_engine(int8):
    """A sink that raises (an asyncio client whose loop is gone) cancels that request; the
    engine thread lives on and the others finish."""
    prompts = _prompts(2, seed=43)
    want = _solo(int8, prompts[1], 20)
    dead = int8.request(prompts[0], max_new_tokens=50)

    def broken(kind, value):
        raise RuntimeError("Event loop is closed")

    dead.sink = broken
    int8.engine.submit(dead)
    assert [t for c in int8.stream_ids(prompts[1], max_new_tokens=20) for t in c] == want
    deadline = time.time() + 10
    while int8.counters()["running"] and time.time() < deadline:
        time.sleep(0.02)
    assert int8.counters()["running"] == 0 and dead.cancelled


@pytest.mark.slow
def test_default_bundle_under_concurrency(default_bundle):
    """The real pair: 8 requests with different prompts and lengths, staggered, 8 slots, under
    model / n-gram / auto drafting with fixed and adaptive k: each equals its solo target-only
    output token for token (a difference would have to be a near-tie, and the test says so)."""
    pipe = specrt.load(default_bundle, max_batch=8, adaptive=False)
    try:
        texts = ["Explain KV caches in two sentences.", "Write a haiku about the sea.",
                 "List three prime numbers and say why they are prime.", "What is the capital of France?",
                 "Summarize: the cat sat on the mat. The cat sat on the mat again.", "Count from 1 to 12.",
                 "Give me a short recipe for pancakes.", "Translate 'good morning' into Spanish and German."]
        prompts = [pipe.tokenizer.encode(t) for t in texts]
        lens = [24, 40, 64, 16, 48, 56, 32, 72]
        want = [_solo(pipe, p, n) for p, n in zip(prompts, lens, strict=True)]
        for draft, adaptive in [("model", False), ("ngram", False), ("auto", True), ("model", True)]:
            got = {}

            def client(i, draft=draft, adaptive=adaptive, got=got):
                time.sleep(0.05 * i)
                got[i] = [t for c in pipe.stream_ids(prompts[i], max_new_tokens=lens[i], draft=draft,
                                                     adaptive=adaptive) for t in c]

            threads = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts))]
            for t in threads:
                t.start()
            for t in threads:
                t.join(300)
            for i, w in enumerate(want):
                diff = assert_same_greedy(got[i], w, _margins(pipe, prompts[i], w) if got[i] != w else None)
                assert diff is None, f"{draft} adaptive={adaptive} prompt {i}: near-tie at token {diff}"
        c = pipe.counters()
        # batched: most steps carry several rows (adaptive rounds draft from the first round at the
        # int8 draft's measured prior, so requests take fewer, fuller steps and overlap less)
        assert c["rows"] > 1.5 * c["steps"] and c["running"] == 0
    finally:
        pipe.close()
