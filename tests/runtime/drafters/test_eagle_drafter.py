"""The EAGLE drafter's cache bookkeeping: after any sequence of rounds every cache row holds the
pair a from-scratch computation over the target's real features puts there (no stale or
misaligned rows), and its proposals are what those rows and its own predicted features give.

Rows are compared within float noise, not bit for bit: calls of other widths give other last bits
(the fp32 target's attention and GEMM kernels; the int4 draft's MatMulNBits at M = 1), and the
draft's int8 activation quantization (accuracy_level 4) turns a 1e-6 difference at a rounding
boundary into a whole quantization step in up to 2 % of rows. Through the random tiny head's feature
feedback such a step changes greedy proposals a few tokens later (docs/design.md, EAGLE draft), so
proposals are checked by a replay in the drafter's own call widths over its own rows."""

import numpy as np
import pytest

import specrt
from checks import submitted
from specrt.runtime.backends.harness import SequenceHarness
from specrt.runtime.backends.kvpool import KVPool
from specrt.runtime.backends.ort import OrtBackend, OrtModel
from specrt.runtime.bundle.manifest import load_manifest
from specrt.runtime.drafters import AutoDrafter, DraftCall, EagleDrafter, Proposal
from specrt.runtime.drafters.eagle import pair_calls
from specrt.runtime.engine.request import DECODE, PREFILL
from specrt.runtime.sampling.draws import SamplingConfig

GREEDY = SamplingConfig(0.0)
# Measured on the tiny EAGLE bundle (6 sequences of 120 tokens; target call widths 1, 4, 9; draft 1, 9):
FEATURE_ATOL = 1e-4  # a target feature across call widths differs by <= 1.1e-5
KV_ATOL = 0.4  # a draft cache row differs by <= 0.044 (|K|, |V| up to ~11); a wrong pair by >= 3.5:
# a feature misaligned by one position, or a predicted feature in place of the real one


@pytest.fixture(scope="module")
def eagle(tiny_bundles):
    folder = tiny_bundles["eagle"]
    man = load_manifest(folder)
    fresh = (SequenceHarness(OrtBackend(folder / man.target.graph, man.target), "t", keep_hidden=True),
             SequenceHarness(OrtBackend(folder / man.draft.graph, man.draft), "d"))
    pipe = specrt.load(folder, adaptive=False)  # fixed k: the tests count rounds of k
    yield pipe, fresh
    pipe.close()


def cache_rows(pool, slot, n):
    """Rows [0, n) of every layer's K and V in `slot` -> [2 * layers, Hkv, n, D] (a copy)."""
    return np.stack([a[slot, :, :n] for a in pool.host])


def scratch(fresh, seq):
    """The target's features of positions [0, n - 1) and the draft rows of the pairs (f_p,
    x_{p+1}) for p < n - 1, every cache built from nothing -> ([n - 1, H], [2L, Hkv, n - 1, D])."""
    target, draft = fresh
    n, w = len(seq), draft.max_t
    target.reset()
    target.prefill(seq[:-1])
    feats = target.features[: n - 1].copy()
    draft.reset()
    for p in range(0, n - 1, w):
        draft.forward(seq[p + 1 : p + 1 + w], feats[p : p + w])
    return feats, cache_rows(draft.backend.pool, 0, n - 1)


def replay(model, slot, features, seq, start, k):
    """Greedy k tokens from `slot`'s rows [0, start) as they are, the pairs of positions
    [start, n - 1) and then the draft's own features, in the drafter's call widths, on a spare
    slot of the same pool and session: bit for bit what a correct drafter computes."""
    pool = model.pool
    spare = pool.alloc()
    assert spare is not None
    try:
        pool.copy_rows(slot, spare, start)
        calls = pair_calls(seq, features, start, len(seq) - 1, model.max_t)
        assert calls, f"the drafter kept rows up to {start}: none left to give the first proposal's logits"
        pos, toks = start, []
        for call in calls:
            logits = model.run(spare, call.tokens, pos, call.hidden, call.keep)
            pos += len(call.tokens)
        while True:
            toks.append(int(logits[-1].argmax()))
            if len(toks) == k:
                break
            logits = model.run(spare, np.array(toks[-1:]), pos, model.hidden[-1:].copy())
            pos += 1
        return toks
    finally:
        pool.free(spare)


def propose(drafter, model, slot, seq, k, rng):
    """Run one proposal by hand, as the scheduler does for a request alone (one call at a time).
    -> (the proposal, the cache length its first call started at)"""
    out = drafter.start(seq, k, GREEDY, rng)
    start = model.pool.length(model.track, slot)
    while isinstance(out, DraftCall):
        pos = model.pool.length(model.track, slot)
        logits = model.run(slot, out.tokens, pos, out.hidden, out.keep)
        model.pool.advance(model.track, slot, len(out.tokens))
        out = drafter.take(logits[-1], model.hidden[-1].copy())
    assert isinstance(out, Proposal)
    return out, start


def check_now(model_drafter, pipe, slot, fresh, seq, k, rng):
    model, n = pipe.parts.draft, len(seq)
    got, start = propose(model_drafter, model, slot, seq, k, rng)
    feats, rows = scratch(fresh, seq)
    mine = pipe.parts.features[slot, : n - 1]
    np.testing.assert_allclose(mine, feats, rtol=0, atol=FEATURE_ATOL, err_msg=f"features, len {n}")
    diff = np.abs(cache_rows(model.pool, slot, n - 1) - rows).max(axis=(0, 1, 3))  # [n - 1] per position
    assert not (diff > KV_ATOL).any(), f"len {n}: rows {np.flatnonzero(diff > KV_ATOL)} differ by {diff.max():.3g}"
    assert got.tokens.tolist() == replay(model, slot, mine, seq, start, k), n
    model_drafter.commit(n)  # as if nothing was accepted


def admitted(pipe, **kw):
    """A request admitted by the pipeline's scheduler and driven step by step from here
    (nothing is submitted to the engine thread, which therefore never starts). The step with
    the prompt's last chunk gives the first token, then runs the first round.
    -> (request, the draft track's length when the first token went out)"""
    r = pipe.request(max_new_tokens=200, ignore_eos=True, **kw)
    at_first = []
    r.sink = lambda kind, value: at_first or at_first.append(pipe.parts.draft.pool.length("draft", r.slot))
    waiting = submitted(r)
    pipe.scheduler.step(lambda: waiting.pop() if waiting else None)
    while r.state == PREFILL:  # a prompt wider than the target's widest call: one chunk per step
        pipe.scheduler.step()
    assert r.state == DECODE and r.stats.rounds == 1
    return r, at_first[0]


def stop(pipe, r):
    r.cancelled = True
    pipe.scheduler.step()  # retires it: the slot is free for the next test


def step(pipe, r):
    pipe.scheduler.step()
    assert r.state == DECODE  # still running: the checks below look at a live slot


@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("prompt_len", [1, 23])  # 23 > max_t: the prompt's pairs go in chunks
def test_proposals_equal_scratch_after_rounds(eagle, k, prompt_len):
    pipe, fresh = eagle
    assert pipe.parts.eagle and not pipe.parts.shared_kv and pipe.parts.draft.pool is not pipe.parts.target.pool
    rng = np.random.default_rng(0)
    prompt = [1] + [int(t) for t in np.random.default_rng(k).integers(3, 128, size=prompt_len - 1)]
    r, at_first = admitted(pipe, prompt_ids=prompt, k=k, draft="model")
    drafter, slot = r.drafter, r.slot
    assert isinstance(drafter, EagleDrafter)
    assert at_first == 0  # the first token went out before the draft read the prompt
    draft_len = lambda: pipe.parts.draft.pool.length("draft", slot)  # noqa: E731
    try:
        for i in range(6):
            if i:
                rounds = r.stats.rounds
                step(pipe, r)
                assert r.stats.rounds == rounds + 1
            assert r.stats.k_history[-1] == k  # a speculative round of k
            assert draft_len() <= len(r.seq) - 2  # only rows built from real features survive
            check_now(drafter, pipe, slot, fresh, r.seq, k, rng)
            if i % 2:  # target-only steps: the drafter must catch up several pairs afterwards
                r.k = 0  # plain rounds as adaptive k = 0 makes them (the drafter sees their commits)
                if i == 3:
                    r.drafter = None  # or steps the drafter does not see at all
                for _ in range(3 + i):
                    step(pipe, r)
                r.k, r.drafter = k, drafter
                assert r.stats.k_history[-1] == 0
                check_now(drafter, pipe, slot, fresh, r.seq, k, rng)
        assert pipe.parts.target.pool.length("target", slot) == len(r.seq) - 1
    finally:
        stop(pipe, r)
    assert not pipe.scheduler.running and pipe.parts.target.pool.free_slots == pipe.parts.target.pool.slots


def test_auto_catches_up_after_ngram_rounds(eagle):
    pipe, fresh = eagle
    rng = np.random.default_rng(0)
    prompt = [1, 5, 9, 33, 7, 5, 9, 33, 7, 5, 9]
    r, _ = admitted(pipe, prompt_ids=prompt, k=4, draft="auto")
    auto = r.drafter
    assert isinstance(auto, AutoDrafter) and isinstance(auto.model, EagleDrafter)
    try:
        for i in range(12):
            if i:
                step(pipe, r)
            check_now(auto.model, pipe, r.slot, fresh, r.seq, 4, rng)
    finally:
        stop(pipe, r)
    assert set(r.stats.drafter_rounds) == {"ngram", "model"}, r.stats.drafter_rounds


def test_needs_features_from_the_target(eagle, tiny_bundles):
    pipe, fresh = eagle
    folder = tiny_bundles["int4"]
    man = load_manifest(folder)
    plain = OrtModel(folder / man.draft.graph, man.draft, KVPool(man.draft.kv, 1), track="draft")
    feats = pipe.parts.features[0]
    with pytest.raises(ValueError, match="EAGLE"):
        EagleDrafter(plain, 0, feats)
    with pytest.raises(ValueError, match="width"):
        EagleDrafter(pipe.parts.draft, 0, np.zeros((feats.shape[0], feats.shape[1] + 1), np.float32))
    with pytest.raises(ValueError, match="hidden-state output"):
        SequenceHarness(OrtBackend(folder / man.target.graph, man.target), keep_hidden=True)
    draft = fresh[1]
    with pytest.raises(ValueError, match="hidden must be"):
        draft.forward([5, 6], np.zeros((1, draft.backend.hidden_size), np.float32))


def test_pair_calls_feed_each_feature_with_the_token_it_chose():
    """Pairs (f_p, x_{p+1}) for p in [start, end), at most max_t rows a call, in order."""
    seq = np.arange(100, 110)
    feats = np.arange(10, dtype=np.float32)[:, None] * np.ones((1, 3), np.float32)  # row p = p
    calls = pair_calls(seq, feats, 2, 9, 3)
    assert [c.tokens.tolist() for c in calls] == [[103, 104, 105], [106, 107, 108], [109]]
    assert [c.hidden[:, 0].tolist() for c in calls] == [[2, 3, 4], [5, 6, 7], [8]]
    assert pair_calls(seq, feats, 4, 4, 3) == []



def test_batched_target_rows_record_each_rows_features(eagle):
    """Rows that do not draft go through one batched target call (ragged positions); the
    features it records in each row's slot equal the target's own features of that sequence,
    as a single-sequence call records them: an EAGLE round after plain steps reads these."""
    from collections import deque

    pipe, (target, _) = eagle
    sched = pipe.scheduler
    reqs = [pipe.request(p, max_new_tokens=12, draft="none", ignore_eos=True) for p in ([1, 5, 9], [1, 3], [1, 7, 22, 40, 9, 13, 5, 60])]
    for r in reqs:
        r.sink = lambda kind, value: None
    waiting, checked = deque(submitted(*reqs)), 0
    calls0, rows0 = sched.counters.target_calls, sched.counters.rows
    while waiting or sched.running:
        sched.step(lambda: waiting.popleft() if waiting else None)
        for r in sched.running:
            if r.state != DECODE or len(r.seq) < len(r.prompt) + 2:
                continue
            n = len(r.seq)
            target.reset()
            target.prefill(r.seq[:-1])
            np.testing.assert_allclose(pipe.parts.features[r.slot, : n - 1], target.features[: n - 1], atol=1e-4)
            checked += 1
    target.reset()
    assert checked > 10 and all(len(r.seq) == len(r.prompt) + 12 for r in reqs)
    # decode rows were batched: fewer target calls than rows (3 prefills + one call per step)
    assert sched.counters.target_calls - calls0 < 3 + (sched.counters.rows - rows0)
