"""Prefix reuse: slots keep what finished requests held, and a new prompt reuses the longest
prefix any slot holds (runtime/engine/prefix.py, runtime/backends/kvpool.py).

The placement rules on hand-built pools, then the engine on the NumPy fake backend
(tests/fakes.py), whose KV rows hold each token plus its writer's mark and whose logits read the
previous token back from the cache: a reused or copied row that held the wrong token changes the
output, and a row marked valid that was never written raises `StaleRow`. Every output is
compared with target-only greedy straight from the fake's table."""

from __future__ import annotations

import time

import numpy as np
import pytest

from checks import submitted
from fakes import StaleRow, reference_greedy, rows, run_request
from specrt.runtime.backends.kvpool import KVPool
from specrt.runtime.bundle.manifest import KVLayout
from specrt.runtime.engine import Stats
from specrt.runtime.engine.prefix import Placement, common_prefix, place
from specrt.runtime.engine.request import DECODE, PREFILL

MODES = [("none", False), ("model", False), ("ngram", False), ("auto", False), ("model", True), ("auto", True)]


def _pool(slots=3, s_max=64) -> KVPool:
    pool = KVPool(KVLayout(layers=2, kv_heads=2, head_dim=3, dtype="float32", max_seq_len=s_max), slots)
    pool.track("target")
    return pool


def _hold(pool: KVPool, slot: int, tokens: list[int], park: bool = True) -> None:
    """Put a request's rows in `slot` (values = token ids, every layer and head) and park it."""
    pool.assign(slot)
    pool.advance("target", slot, len(tokens))
    for a in pool.host:
        a[slot, :, : len(tokens)] = np.asarray(tokens, dtype=np.float32)[None, :, None]
    if park:
        pool.park(slot, tokens)


# --- placement rules ---------------------------------------------------------------------------

def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([], [1]) == 0 and common_prefix([5], [6]) == 0


def test_next_turn_takes_its_idle_slot_as_it_is():
    pool = _pool()
    _hold(pool, 1, [1, 2, 3, 4])
    assert place([1, 2, 3, 4, 5, 6], pool, {}) == Placement(1, 4)  # no copy
    assert place([1, 2, 3, 4], pool, {}) == Placement(0, 3, 1)  # last prompt token is computed: a copy keeps slot 1 whole


def test_partial_match_copies_into_an_empty_slot_and_keeps_the_idle_one():
    pool = _pool()
    _hold(pool, 0, [1, 2, 3, 4, 5])
    assert place([1, 2, 3, 9, 9], pool, {}) == Placement(1, 3, 0)
    pool.assign(1, 3, 0)
    assert pool.length("target", 1) == 3 and list(pool.idle()) == [0]  # slot 0 keeps its five rows
    assert pool.host[0][1, 0, :3, 0].tolist() == [1, 2, 3] and np.all(pool.host[0][1, :, 3:] == 0)


def test_without_an_empty_slot_the_least_recently_parked_one_is_reused():
    pool = _pool(slots=2)
    _hold(pool, 0, [1, 2, 3, 4])  # parked first
    _hold(pool, 1, [7, 8, 9])
    assert place([1, 2, 5, 5], pool, {}) == Placement(0, 2)  # the LRU slot is the source: as it is
    assert place([7, 8, 5, 5], pool, {}) == Placement(0, 2, 1)  # copied over the LRU slot
    assert place([4, 4], pool, {}) == Placement(0, 0)  # nothing shared: the LRU slot, emptied
    pool.assign(0)
    assert pool.length("target", 0) == 0 and pool.idle() == {1: [7, 8, 9]}


def test_a_running_request_shares_its_committed_rows():
    pool = _pool()
    _hold(pool, 0, [1, 2, 3, 4, 5], park=False)  # busy
    assert place([1, 2, 3, 4, 9], pool, {0: [1, 2, 3, 4, 5]}) == Placement(1, 4, 0)
    _hold(pool, 2, [1, 2, 7])
    # on a tie the idle slot is the source (its rows are not being extended by anyone)
    assert place([1, 2, 8, 8], pool, {0: [1, 2, 3, 4, 5]}) == Placement(1, 2, 2)
    assert place([1, 2, 7, 8], pool, {0: [1, 2, 3, 4, 5]}) == Placement(2, 3)  # extends all it holds


def test_no_reuse_when_turned_off_or_nothing_matches():
    pool = _pool()
    _hold(pool, 0, [1, 2, 3])
    assert place([1, 2, 3, 4], pool, {}, reuse=False) == Placement(1, 0)
    assert place([9, 2, 3, 4], pool, {}) == Placement(1, 0)
    assert place([1], pool, {}) == Placement(1, 0)  # one token: nothing to reuse


def test_pool_slot_states():
    pool = _pool(slots=2)
    _hold(pool, 0, [1, 2, 3])
    assert pool.free_slots == 2 and pool.in_use() == [] and pool.empty_slots() == [1]
    with pytest.raises(ValueError, match="already free"):
        pool.park(0, [1])
    _hold(pool, 1, [4, 5])
    assert pool.alloc() == 0 and pool.length("target", 0) == 0  # LRU emptied
    assert pool.alloc() == 1 and pool.in_use() == [0, 1] and pool.alloc() is None
    pool.free(0)
    pool.park(1, [])  # nothing kept: empty, not idle
    assert pool.idle() == {} and pool.empty_slots() == [0, 1]


# --- the engine on the fake backend ---------------------------------------------------------------

def _want(pipe, prompt, n):
    return reference_greedy(pipe.parts.target.table, prompt, n)


@pytest.mark.parametrize("kind", ["self", "separate"])
@pytest.mark.parametrize("draft,adaptive", MODES)
def test_multi_turn_conversation_reuses_its_history(make, kind, draft, adaptive):
    """Four turns, each prompt = the last prompt + its answer + a new user turn: every turn's
    output is target-only greedy, and every turn after the first finds its history cached (all
    of it but the last answer token, which no call has fed yet)."""
    pipe = make(draft=kind)
    g = np.random.default_rng(3)
    prompt = [int(t) for t in g.integers(3, 32, size=30)]  # 30 > max_prefill_t: chunks
    history = 0  # tokens the last turn left in its slot
    for turn in range(4):
        out, st = run_request(pipe, prompt, max_new_tokens=12, draft=draft, adaptive=adaptive, k=4, ignore_eos=True)
        assert out == _want(pipe, prompt, 12), turn
        assert st.cached_tokens == history, (turn, st.cached_tokens)
        history = len(prompt) + len(out) - 1
        prompt = prompt + out + [int(t) for t in g.integers(3, 32, size=5)]
    c = pipe.counters()
    assert c["prefix_cache_hits"] > 0 and c["prefix_cache_queries"] > c["prefix_cache_hits"]


@pytest.mark.parametrize("kind", ["self", "separate"])
def test_prompt_ending_inside_or_before_a_cached_range(make, kind):
    pipe = make(draft=kind, slots=3)
    g = np.random.default_rng(4)
    base = [int(t) for t in g.integers(3, 32, size=40)]
    run_request(pipe, base, max_new_tokens=10, ignore_eos=True)
    for prompt, cached in [(base[:25] + [7, 7, 7], 25),  # diverges inside the cached rows
                           (base[:20], 19),  # a strict prefix of what is cached: its last token recomputed
                           (base, 39)]:
        out, st = run_request(pipe, prompt, max_new_tokens=10, ignore_eos=True, k=3)
        assert out == _want(pipe, prompt, 10) and st.cached_tokens == cached, (len(prompt), st.cached_tokens)


def test_shared_system_prompt_under_concurrency_and_eviction(make):
    """Twelve conversations sharing a 24-token system prompt on three slots, two turns each,
    submitted in waves through threads: each answer is its solo greedy, and later prompts find
    at least the system prompt cached."""
    pipe = make(draft="self", slots=3)
    g = np.random.default_rng(5)
    system = [int(t) for t in g.integers(3, 32, size=24)]
    convs = [system + [int(t) for t in g.integers(3, 32, size=int(g.integers(2, 9)))] for _ in range(12)]
    for _turn in range(2):
        stats = [Stats() for _ in convs]
        gens = [pipe.stream_ids(p, max_new_tokens=8, ignore_eos=True, k=2, stats=s) for p, s in zip(convs, stats, strict=True)]
        outs = [[t for c in gen for t in c] for gen in gens]
        for p, o in zip(convs, outs, strict=True):
            assert o == _want(pipe, p, 8)
        assert sum(s.cached_tokens >= len(system) for s in stats) >= 9  # the first wave's first three may miss
        convs = [p + o + [9, 9] for p, o in zip(convs, outs, strict=True)]
    c = pipe.counters()
    assert c["finished"] == 24 and c["running"] == 0 and pipe.parts.target.pool.free_slots == 3


@pytest.mark.parametrize("kind", ["self", "separate"])
def test_reuse_from_a_running_requests_slot(make, kind):
    """B arrives while A (same 30-token prefix) is decoding: B's rows are copied from A's slot,
    and both outputs are their solo greedy."""
    pipe = make(draft=kind, slots=2)
    sched = pipe.scheduler
    g = np.random.default_rng(6)
    prefix = [int(t) for t in g.integers(3, 32, size=30)]
    a = pipe.request(prefix + [4, 5], max_new_tokens=20, ignore_eos=True, k=3)
    b = pipe.request(prefix + [6], max_new_tokens=20, ignore_eos=True, k=3)
    out = {a.id: [], b.id: []}
    for r in (a, b):
        r.sink = lambda kind, v, r=r: out[r.id].extend(v) if kind == "tokens" else None
    queue = submitted(a)
    while a.state != DECODE or len(a.seq) < len(a.prompt) + 3:
        sched.step(lambda: queue.pop() if queue else None)
    queue = submitted(b)
    sched.step(lambda: queue.pop() if queue else None)
    assert a.state == DECODE and b.stats.cached_tokens == 30 and b.slot != a.slot
    while sched.running:
        sched.step()
    assert out[a.id] == _want(pipe, a.prompt, 20) and out[b.id] == _want(pipe, b.prompt, 20)


def test_cancel_mid_prefill_keeps_only_rows_written(make):
    """A 60-token prompt (16-token chunks) cancelled after two chunks: its slot keeps exactly the
    32 rows written (the rest never written, NaN in the fake), and the next request with the same
    prompt reuses 32 and computes the rest."""
    pipe = make(draft="self", slots=1)
    sched, pool = pipe.scheduler, pipe.parts.target.pool
    prompt = [int(t) for t in np.random.default_rng(7).integers(3, 32, size=60)]
    r = pipe.request(prompt, max_new_tokens=5, ignore_eos=True)
    queue = submitted(r)
    for _ in range(2):
        sched.step(lambda: queue.pop() if queue else None)
    assert r.state == PREFILL and r.prefilled == 32
    pipe.engine.cancel(r)
    sched.step()
    assert pool.idle() == {0: prompt[:32]}
    assert not np.isnan(rows(pool, 0, 32)).any() and np.isnan(rows(pool, 0, 60)[32:]).all()
    out, st = run_request(pipe, prompt, max_new_tokens=5, ignore_eos=True)
    assert out == _want(pipe, prompt, 5) and st.cached_tokens == 32


def test_a_row_marked_valid_but_never_written_is_caught(make):
    """The fake is able to see a reuse bug: claiming rows nobody wrote raises."""
    pipe = make(draft=None, slots=1)
    pool = pipe.parts.target.pool
    prompt = [5, 6, 7, 8, 9, 10]
    pool.assign(0)
    pool.advance("target", 0, 3)  # rows 0..2 claimed, never written
    pool.park(0, prompt[:3])
    with pytest.raises(StaleRow):
        run_request(pipe, prompt, max_new_tokens=3)


@pytest.mark.parametrize("draft", ["none", "model", "ngram"])
def test_seeded_sampling_is_the_same_with_and_without_reuse(make, draft):
    """Fixed k: the same seed gives the same tokens whether the prompt was computed or reused
    (adaptive k is reproducible in distribution only, docs/design.md "Seeds")."""
    cold = make(draft="self", prefix_cache=False)
    warm = make(draft="self")
    prompt = [int(t) for t in np.random.default_rng(8).integers(3, 32, size=40)]
    run_request(warm, prompt[:30] + [3], max_new_tokens=4)  # puts 30 tokens of the prompt in a slot
    kw = dict(max_new_tokens=30, temperature=0.9, top_p=0.95, seed=11, k=3, ignore_eos=True, draft=draft)
    a, sa = run_request(cold, prompt, **kw)
    b, sb = run_request(warm, prompt, **kw)
    assert sa.cached_tokens == 0 and sb.cached_tokens == 30
    assert a == b and len(a) == 30
    c, _ = run_request(cold, prompt, **{**kw, "seed": 12})
    assert c != a  # the seed matters: the comparison above can fail


def test_turned_off_nothing_is_reused_or_counted(make):
    pipe = make(draft="self", prefix_cache=False)
    prompt = [5, 6, 7, 8, 9, 10, 11]
    for _ in range(2):
        out, st = run_request(pipe, prompt, max_new_tokens=6, ignore_eos=True)
        assert out == _want(pipe, prompt, 6) and st.cached_tokens == 0
    c = pipe.counters()
    assert c["prefix_cache_hits"] == c["prefix_cache_queries"] == 0 and pipe.parts.target.pool.idle() == {}


def test_library_default_is_adaptive_when_requests_share_the_pipeline(make):
    assert make(adaptive=None, slots=4).default_adaptive is True
    assert make(adaptive=None, slots=1).default_adaptive is False


# --- n choices of one prompt: one prefill, each its own random stream -----------------------------

@pytest.mark.parametrize("draft", ["none", "model", "ngram"])
def test_choices_share_one_prefill_and_draw_their_own_streams(make, draft):
    pipe = make(draft="self", slots=4)
    prompt = [int(t) for t in np.random.default_rng(9).integers(3, 32, size=40)]
    kw = dict(max_new_tokens=12, temperature=0.9, seed=5, k=3, ignore_eos=True, draft=draft)
    before = pipe.counters()["prefill_tokens"]
    res = pipe.choices(" ".join(f"w{t}" for t in prompt), 3, chat=False, **kw)
    ids = pipe.tokenizer.encode(" ".join(f"w{t}" for t in prompt), chat=False)
    assert pipe.counters()["prefill_tokens"] - before == len(ids) + 2  # siblings compute one token each
    assert [r.stats.cached_tokens for r in res] == [0, len(ids) - 1, len(ids) - 1]
    assert len({tuple(r.token_ids) for r in res}) == 3  # different streams
    again = pipe.choices(" ".join(f"w{t}" for t in prompt), 3, chat=False, **kw)
    assert [r.token_ids for r in again] == [r.token_ids for r in res]  # same seed, same choices
    for i, r in enumerate(res):  # choice i is what a lone request with sibling i draws
        alone = make(draft="self", prefix_cache=False)
        got, _ = run_request(alone, ids, sibling=i, **kw)
        assert got == r.token_ids


def test_a_burst_sharing_a_system_prompt_computes_it_once(make):
    """Six requests with one 40-token system prompt submitted at once on six slots: the first
    computes it, the others wait for that prefill and copy it."""
    pipe = make(draft="self", slots=6)
    g = np.random.default_rng(10)
    system = [int(t) for t in g.integers(3, 32, size=40)]
    prompts = [system + [int(t) for t in g.integers(3, 32, size=4)] for _ in range(6)]
    stats = [Stats() for _ in prompts]
    gens = [pipe.stream_ids(p, max_new_tokens=6, ignore_eos=True, stats=s) for p, s in zip(prompts, stats, strict=True)]
    outs = [[t for c in gen for t in c] for gen in gens]
    for p, o in zip(prompts, outs, strict=True):
        assert o == _want(pipe, p, 6)
    assert sorted(s.cached_tokens for s in stats) == [0] + [40] * 5
    assert pipe.counters()["prefill_tokens"] == 40 + 6 * 4


# --- failures and deferred requests (found in review) ----------------------------------------------

def test_a_copy_that_fails_ends_its_request_alone_and_frees_the_slot(make):
    pipe = make(draft=None, slots=4)
    sched, pool = pipe.scheduler, pipe.parts.target.pool
    base = [5 + (i % 20) for i in range(30)]
    run_request(pipe, base, max_new_tokens=3)  # parks slot 0
    other = pipe.request([30, 31, 3, 4], max_new_tokens=20, ignore_eos=True)
    r = pipe.request(base[:20] + [9, 9], max_new_tokens=3)  # a partial match: its rows are copied
    events = {other.id: [], r.id: []}
    for q in (other, r):
        q.sink = lambda kind, v, q=q: events[q.id].append(kind)
    waiting = submitted(other)
    sched.step(lambda: waiting.pop(0) if waiting else None)

    def broken(*a):
        raise RuntimeError("cudaMemcpy2D failed")

    pool.copy_rows = broken
    waiting = submitted(r)
    sched.step(lambda: waiting.pop(0) if waiting else None)  # does not raise
    assert events[r.id] == ["error"] and r.stats.stop_reason == "error" and r.slot == -1
    assert pool.in_use() == [other.slot] and other in sched.running
    while sched.running:
        sched.step()
    assert events[other.id][-1] == "done" and other.produced == 20


def test_a_deferred_request_keeps_its_place_and_its_deadline(make):
    """r waits for q's prefill (they share 60 tokens); a newer unrelated request s does not take
    the slot kept for r, and r's timeout is applied while it waits."""
    pipe = make(draft=None, slots=2)
    sched = pipe.scheduler
    base = [5 + (i % 20) for i in range(60)]
    q = pipe.request(base + [7], max_new_tokens=40, ignore_eos=True)
    r = pipe.request(base + [9], max_new_tokens=5, ignore_eos=True, timeout_s=0.05)
    s = pipe.request([30, 31, 3], max_new_tokens=40, ignore_eos=True)
    waiting = submitted(q, r, s)
    take = lambda: waiting.pop(0) if waiting else None  # noqa: E731
    sched.step(take)
    assert sched.running == [q] and sched.deferred == [r] and waiting == [s]  # s waits behind r
    time.sleep(0.1)
    sched.step(take)
    assert r.state == "done" and r.stats.stop_reason == "timeout" and not sched.deferred


def test_a_deferred_request_copies_the_prefill_it_waited_for(make):
    pipe = make(draft=None, slots=2)
    sched = pipe.scheduler
    base = [5 + (i % 20) for i in range(60)]
    q = pipe.request(base + [7], max_new_tokens=4, ignore_eos=True)
    r = pipe.request(base + [9], max_new_tokens=4, ignore_eos=True)
    out = {q.id: [], r.id: []}
    for x in (q, r):
        x.sink = lambda kind, v, x=x: out[x.id].extend(v) if kind == "tokens" else None
    waiting = submitted(q, r)
    while waiting or sched.running or sched.deferred:
        sched.step(lambda: waiting.pop(0) if waiting else None)
    assert r.stats.cached_tokens == 60 and out[r.id] == _want(pipe, r.prompt, 4)
