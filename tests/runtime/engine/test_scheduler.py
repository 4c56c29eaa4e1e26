"""The engine's loop on the NumPy fake backend (tests/fakes.py): prefill, draft, verify, commit
and rewind for every drafter, fixed and adaptive k, one request and many, against target-only
greedy computed straight from the fake's table. No onnxruntime session and no torch: a test
runs in milliseconds (a distribution test, of thousands of requests, in under a second). Every
test builds its own pipeline, so nothing learned by adaptive k in one test reaches another."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from checks import assert_follows, submitted
from fakes import DRAFT_MARK, StaleRow, drive, reference_greedy, rows, run_request
from specrt.runtime.drafters import ModelDrafter
from specrt.runtime.engine import Stats
from specrt.runtime.engine.request import DECODE
from specrt.runtime.policy.adaptive import Costs
from specrt.runtime.sampling.draws import SamplingConfig, probs

MODES = [("model", False), ("ngram", False), ("auto", False), ("model", True), ("ngram", True), ("auto", True)]
PROMPTS = [[1, 5, 9, 7], [1, 3], [4, 4, 4, 9, 12, 30, 6, 4, 4, 4, 9],
           [int(t) for t in np.random.default_rng(1).integers(3, 32, size=40)]]  # 40 > max_prefill_t: chunks
DRAFTS = ["self", "separate"]


def tokens(pipe, prompt, **kw) -> list[int]:
    return [t for c in pipe.stream_ids(prompt, **kw) for t in c]


def want(pipe, prompt, n, eos=()):
    return reference_greedy(pipe.parts.target.table, prompt, n, eos)


@pytest.mark.parametrize("kind", DRAFTS)
@pytest.mark.parametrize("draft,adaptive", MODES)
@pytest.mark.parametrize("k", [1, 3, 8])
def test_greedy_speculation_equals_target_only_greedy(make, kind, draft, adaptive, k):
    pipe = make(draft=kind)
    proposed = accepted = 0
    for prompt in PROMPTS:
        st = Stats()
        got = tokens(pipe, prompt, max_new_tokens=40, k=k, draft=draft, adaptive=adaptive, ignore_eos=True, stats=st)
        assert got == want(pipe, prompt, 40), (prompt, st.k_history)
        assert st.new_tokens == 40 and st.stop_reason == "length"
        proposed, accepted = proposed + st.draft_tokens, accepted + st.accepted_tokens
    # drafts were made, and both verification outcomes happened: accepted runs and rejections
    assert 0 < accepted < proposed, (accepted, proposed)


@pytest.mark.parametrize("batch_rows", [True, False])
def test_concurrent_requests_each_get_their_solo_output(make, batch_rows):
    """Ten requests over three slots, submitted at once (seven wait in the queue), every
    drafter and fixed / adaptive k side by side; with batch_rows the plain rows and the
    drafting rows' one-token draft steps share batched calls."""
    pipe = make(draft="separate", slots=3, batch_rows=batch_rows)
    g = np.random.default_rng(2)
    prompts = [[int(t) for t in g.integers(3, 32, size=int(g.integers(2, 30)))] for _ in range(10)]
    lens = [5 + 7 * i % 31 for i in range(10)]
    modes = [MODES[i % len(MODES)] for i in range(10)]
    stats = [Stats() for _ in prompts]
    gens = [pipe.stream_ids(p, max_new_tokens=n, k=1 + i % 5, draft=d, adaptive=a, ignore_eos=True, stats=s)
            for i, (p, n, (d, a), s) in enumerate(zip(prompts, lens, modes, stats, strict=True))]
    got = [[t for c in gen for t in c] for gen in gens]
    for p, n, g_ in zip(prompts, lens, got, strict=True):
        assert g_ == want(pipe, p, n)
    c = pipe.counters()
    assert c["rows"] > c["steps"] and c["running"] == c["waiting"] == 0
    assert c["finished"] == 10 and pipe.parts.target.pool.free_slots == 3
    assert sum(s.draft_tokens for s in stats) > 0
    widest = max((b for kind, _, _, b in pipe.parts.target.calls + pipe.parts.draft.calls if kind == "rows"), default=1)
    assert (widest > 1) == batch_rows  # several rows in one call exactly where the lowering allows it


@pytest.mark.parametrize("kind", DRAFTS)
def test_a_perfect_draft_is_accepted_whole_beside_other_requests(make, kind):
    """A draft identical to the target, eight requests over four slots admitted at different
    steps (a new request's first draft call reads its prompt while the others take batched
    one-token steps): every proposal is the draft's own greedy token, so each is accepted. (A
    logits row read after the next call reused the buffer would propose a wrong token, which
    verification would reject: the output alone cannot show it.)"""
    pipe = make(draft=kind, noise=0.0)
    g = np.random.default_rng(3)
    prompts = [[int(t) for t in g.integers(3, 32, size=int(g.integers(2, 30)))] for _ in range(8)]
    stats = [Stats() for _ in prompts]
    gens = [pipe.stream_ids(p, max_new_tokens=12 + 5 * i, k=3, ignore_eos=True, stats=s)
            for i, (p, s) in enumerate(zip(prompts, stats, strict=True))]
    for i, (p, gen) in enumerate(zip(prompts, gens, strict=True)):
        assert [t for c in gen for t in c] == want(pipe, p, 12 + 5 * i)
    assert all(s.draft_tokens > 0 and s.acceptance_rate == 1.0 for s in stats), [s.acceptance_rate for s in stats]
    assert max(b for kind_, _, _, b in pipe.parts.draft.calls if kind_ == "rows") > 1  # batched draft steps


@pytest.mark.parametrize("kind", DRAFTS)
@pytest.mark.parametrize("draft", ["model", "auto"])
def test_eos_as_the_very_first_token(make, kind, draft):
    """A request whose first token is EOS emits nothing, never runs the draft, and frees its slot."""
    pipe = make(draft=kind)
    prompt = PROMPTS[0]
    first = want(pipe, prompt, 1)[0]
    pipe.tokenizer.eog_ids = {first}
    out, st = run_request(pipe, prompt, max_new_tokens=20, k=4, draft=draft)
    assert out == [] and st.stop_reason == "eos" and st.new_tokens == 0 and st.rounds == 0
    assert pipe.parts.target.calls == [("run", 0, len(prompt), 1)]  # the prefill and nothing else
    assert pipe.parts.draft.calls == []
    assert pipe.counters()["running"] == 0 and pipe.parts.target.pool.free_slots == pipe.parts.target.pool.slots
    assert pipe.tokenizer.encode("<s> w5 w9 w7", chat=False) == prompt
    res = pipe.generate("<s> w5 w9 w7", max_new_tokens=20, chat=False)
    assert res.text == "" and res.token_ids == [] and res.stats.stop_reason == "eos"


def test_eos_inside_an_accepted_run(make):
    pipe = make(draft="self", noise=0.0)  # the draft is the target: every round is accepted whole
    prompt = PROMPTS[0]
    full = want(pipe, prompt, 30)
    eos = full[9]
    pipe.tokenizer.eog_ids = {eos}
    out, st = run_request(pipe, prompt, max_new_tokens=30, k=8)
    assert out == full[: full.index(eos)] and st.stop_reason == "eos"
    assert st.acceptance_rate == 1.0 and max(st.k_history) == 8  # EOS came inside a run of 8


@pytest.mark.parametrize("draft", ["model", "ngram"])
@pytest.mark.parametrize("n", [1, 2, 3, 7, 13])
def test_max_new_tokens_is_exact_and_k_never_drafts_past_it(make, draft, n):
    pipe = make(draft="separate", noise=0.0)
    prompt = PROMPTS[2]
    out, st = run_request(pipe, prompt, max_new_tokens=n, k=8, draft=draft, ignore_eos=True)
    assert out == want(pipe, prompt, n) and st.stop_reason == "length" and st.new_tokens == n
    # each round commits its accepted proposals and one more token; none was cut at the limit,
    # so no round proposed more than it had room for
    assert st.accepted_tokens + st.rounds == n - 1, (st.k_history, st.accepted_tokens)
    verify_widths = [t for kind, _, t, _ in pipe.parts.target.calls[1:] if kind == "run"]
    assert all(w <= n - 1 for w in verify_widths)
    if n == 1:
        assert st.rounds == 0 and pipe.parts.draft.calls == []


@pytest.mark.parametrize("kind", DRAFTS)
@pytest.mark.parametrize("draft,adaptive", [("model", False), ("model", True), ("auto", False), ("auto", True)])
def test_kv_tracks_hold_exactly_the_committed_tokens(make, kind, draft, adaptive):
    """At every commit the target's rows are the committed tokens but the last (the target track
    was rewound past every rejected proposal), and the draft's valid rows are a prefix of them
    (its own computation in a pool of its own; a self-draft's are the target's rows)."""
    pipe = make(draft=kind)
    target, d = pipe.parts.target, pipe.parts.draft
    seen = []

    def check(r):
        n = len(r.seq)
        assert target.pool.length("target", r.slot) == n - 1
        np.testing.assert_array_equal(rows(target.pool, r.slot, n - 1), r.seq[:-1])  # target mark 0
        m = d.pool.length(d.track, r.slot)
        assert m <= n - 1
        mark = DRAFT_MARK if kind == "separate" else 0.0  # a self-draft's valid rows are the target's
        np.testing.assert_array_equal(rows(d.pool, r.slot, m), np.asarray(r.seq[:m]) + mark)
        seen.append(m)

    proposed = accepted = 0
    for prompt in PROMPTS:
        seen.clear()
        out, st = run_request(pipe, prompt, check, max_new_tokens=30, k=3, draft=draft, adaptive=adaptive,
                              ignore_eos=True)
        assert out == want(pipe, prompt, 30)
        assert len(seen) > 1 and max(seen) >= len(prompt)  # checked at every commit; the draft kept up
        proposed, accepted = proposed + st.draft_tokens, accepted + st.accepted_tokens
    assert 0 < accepted < proposed  # rejected proposals: rows the rewinds had to drop


@pytest.mark.parametrize("kind", DRAFTS)
def test_a_drafter_skipped_for_some_steps_catches_up(make, kind):
    """Plain steps (k = 0) between drafting steps, driven one scheduler step at a time: the
    drafter takes the committed tokens it did not see (a separate draft in one wider call, a
    self-draft by adopting the target's rows) and the output stays the target's."""
    pipe = make(draft=kind)
    prompt = PROMPTS[0]
    r = pipe.request(prompt, max_new_tokens=60, k=3, draft="model", ignore_eos=True)
    out = []
    r.sink = lambda kind_, value: out.extend(value) if kind_ == "tokens" else None
    waiting = submitted(r)
    pipe.scheduler.step(lambda: waiting.pop() if waiting else None)
    for i in range(40):
        if r.state != DECODE:
            break
        r.k = 0 if i % 6 < 3 else 3
        pipe.scheduler.step()
    r.cancelled = True
    pipe.scheduler.step()
    assert out == want(pipe, prompt, 60)[: len(out)] and len(out) > 30
    assert 0 in r.stats.k_history and 3 in r.stats.k_history
    draft_widths = [t for kind_, _, t, _ in pipe.parts.draft.calls]
    if kind == "separate":
        assert draft_widths[0] == len(prompt) + 1  # its first round reads the prompt and the first token
        assert max(draft_widths[1:]) >= 4  # after three plain steps: three tokens to catch up and the last
    else:
        assert max(draft_widths) == 1  # adopted, never recomputed


def test_the_fake_sees_a_target_that_is_not_rewound(make, monkeypatch):
    """The fake model reads its cache: a target track left at the end of a rejected proposal
    feeds the next token at the wrong position, and the output is not the target's."""
    pipe = make(draft="separate")
    pool = pipe.parts.target.pool
    real = pool.rewind
    monkeypatch.setattr(pool, "rewind", lambda track, slot, pos: None if track == "target" else real(track, slot, pos))
    prompt = PROMPTS[0]
    assert tokens(pipe, prompt, max_new_tokens=30, k=3, ignore_eos=True) != want(pipe, prompt, 30)


def test_the_fake_sees_a_self_draft_writing_the_targets_rows(make, monkeypatch):
    """A self-draft that re-feeds a committed token writes below the target's length; the
    target's next call finds the draft's row and the request fails."""
    pipe = make(draft="self")
    start = ModelDrafter.start

    def adopt_one_row_less(self, seq, *a, **kw):
        call = start(self, seq, *a, **kw)
        self.pool.adopt(self.track, self.slot, len(seq) - 2, self.target_track)
        call.tokens = np.asarray(seq[-2:], dtype=np.int64)
        return call

    monkeypatch.setattr(ModelDrafter, "start", adopt_one_row_less)
    with pytest.raises(StaleRow, match="written by another model"):
        tokens(pipe, PROMPTS[0], max_new_tokens=30, k=3, ignore_eos=True)


T1, TOP_P, TOP_K = SamplingConfig(1.0), SamplingConfig(0.8, top_p=0.9), SamplingConfig(1.2, top_k=10)
SAMPLING = [("self", "model", False, T1), ("self", "model", True, T1), ("self", "auto", True, TOP_P),
            ("self", "ngram", False, TOP_K), ("separate", "model", False, TOP_P), ("separate", "auto", False, T1),
            ("separate", "ngram", True, T1), ("separate", "model", True, TOP_K)]


@pytest.mark.parametrize("kind,draft,adaptive,cfg", SAMPLING)
def test_sampling_follows_the_target_distribution(make, kind, draft, adaptive, cfg):
    """Sampled speculation with a partly wrong draft (model rounds: rejection sampling against
    the draft's q; n-gram rounds: one-hot proposals), 64 requests decoding at once: the second
    new token's distribution over many seeds is the target's own, sum_x p(x) p(. | x), by
    chi-square; and verification decided it (the first round proposes one token)."""
    pipe = make(draft=kind, slots=64, noise=0.5, plan_batches=False)  # every row drafts as it would alone
    table = pipe.parts.target.table
    # the fake's next token depends on the last two tokens and the position only, so the first
    # token's distribution is fixed by the prompt's end; its likeliest values x go earlier in the
    # prompt, each followed by the target's likeliest token after x: n-gram rounds propose
    # that one, and it is rejected often enough to test the residual too
    tail, n_prompt = [1, 5, 9], 9
    p1 = probs(table.next_logits([0] * (n_prompt - len(tail)) + tail), cfg)
    pairs = [(int(x), int(table.next_logits([0] * (n_prompt - 1) + [9, int(x)]).argmax()))
             for x in np.argsort(-p1)[:3]]
    prompt = [t for pair in pairs for t in pair] + tail
    assert len(prompt) == n_prompt and np.array_equal(p1, probs(table.next_logits(prompt), cfg))
    exact = sum(p1[x] * probs(table.next_logits(prompt + [x]), cfg) for x in np.flatnonzero(p1))
    n = 1500
    reqs = [pipe.request(prompt, max_new_tokens=3, k=4, draft=draft, adaptive=adaptive, seed=seed, ignore_eos=True,
                         temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p) for seed in range(n)]
    counts = np.bincount([out[1] for out in drive(pipe, reqs)], minlength=table.vocab)
    assert sum(r.stats.draft_tokens for r in reqs) > n // 4, "speculation barely ran"
    assert counts[exact == 0].sum() == 0
    assert_follows(counts, exact, n)


def test_fixed_k_rounds_propose_k_and_long_prompts_go_in_chunks(make):
    """What the loop did, counted: a 40-token prompt is three prefill calls of <= 16 (the
    widest chunk), then every round with a perfect draft proposes exactly k and commits k + 1."""
    pipe = make(draft="separate", noise=0.0)
    prompt = PROMPTS[3]
    out, st = run_request(pipe, prompt, max_new_tokens=1 + 4 * 5, k=4, ignore_eos=True)
    assert out == want(pipe, prompt, 21)
    assert [t for _, _, t, _ in pipe.parts.target.calls[:3]] == [16, 16, 8]
    assert st.k_history == [4] * 4 and st.accepted_tokens == 16 and st.mean_accepted_per_round == 5.0
    assert [t for _, _, t, _ in pipe.parts.target.calls[3:]] == [4 + 1] * 4  # one call of k + 1 per round


@dataclasses.dataclass
class _Frozen(Costs):
    """The fake pipeline's costs, not following measured call times: the fake's calls take
    microseconds that vary with the machine's load, so two runs' k would differ by timing alone,
    and this test compares what was learned about acceptance."""

    def observe(self, *a, **kw):
        pass


def _frozen() -> _Frozen:
    return _Frozen({1: 10.0, 2: 10.2, 5: 10.8, 9: 11.6}, draft_ms=0.5, rows_ms={1: 10.0, 2: 10.5, 4: 11.5})


def test_forget_learned_starts_adaptive_k_from_its_priors(make):
    """What adaptive k learned from earlier requests shapes the next one's rounds; after
    `forget_learned` a request drafts exactly as on a fresh pipeline."""
    prompt, kw = PROMPTS[2], dict(max_new_tokens=40, draft="ngram", adaptive=True, ignore_eos=True)
    fresh = Stats()
    tokens(make(draft=None, costs=_frozen()), prompt, stats=fresh, **kw)
    pipe = make(draft=None, costs=_frozen())
    others = PROMPTS[:2] + PROMPTS[3:]  # n-gram proposals on these are mostly rejected
    for p in others:  # teach it
        tokens(pipe, p, **kw)
    taught = Stats()
    tokens(pipe, prompt, stats=taught, **kw)
    assert taught.k_history != fresh.k_history
    for p in others:  # teach it again (the last request taught it the other way), then forget
        tokens(pipe, p, **kw)
    pipe.forget_learned()
    again = Stats()
    tokens(pipe, prompt, stats=again, **kw)
    assert again.k_history == fresh.k_history


def test_a_requests_clock_starts_when_it_is_submitted(make, monkeypatch):
    """Timeouts and queue time count from submission (Engine.submit, the one place that sets
    t_submit): a request checked early and submitted later has its whole timeout, and its
    queue time is measured from submit, not from when it was built. On a clock of the test's
    own, which moves only where the test moves it, so a busy host cannot change the outcome."""
    import time

    clock = [1000.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    pipe = make(draft=None)
    r = pipe.request([1, 5, 9], max_new_tokens=3, ignore_eos=True, timeout_s=0.05)
    clock[0] += 0.1  # built, not yet submitted: past its timeout since it was built
    assert r.t_submit is None and not r.expired(clock[0])
    chunks = pipe.submit(r)
    assert r.t_submit == clock[0]
    assert not r.expired(r.t_submit + 0.04) and r.expired(r.t_submit + 0.06)
    assert sum(len(c) for c in chunks) == 3 and r.stats.stop_reason == "length"
    assert r.stats.queue_ms == 0.0  # the 0.1 s before submit is not queue time
