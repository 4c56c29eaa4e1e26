"""End to end on tiny exported models: speculation is lossless."""

import numpy as np
import pytest
from scipy import stats as sps

import specrt
from checks import run_request, second_token_dist
from specrt.runtime.backends.harness import SequenceHarness
from specrt.runtime.backends.kvpool import KVPool
from specrt.runtime.backends.ort import OrtBackend, OrtModel
from specrt.runtime.bundle.manifest import load_manifest
from specrt.runtime.engine import Stats
from specrt.runtime.policy.adaptive import Costs
from specrt.runtime.sampling.draws import SamplingConfig

PROMPTS = [[1, 5, 9, 33, 7], [1, 100, 4, 4, 4, 90, 12, 60], [1, 3]]


@pytest.fixture(scope="module")
def shared_pipes(tiny_bundles):
    out = {name: specrt.load(path, draft="model" if name != "none" else "none", adaptive=False) for name, path in tiny_bundles.items()}
    yield out
    for pipe in out.values():
        pipe.close()


@pytest.fixture
def pipes(shared_pipes):
    """The module's pipelines, loaded once, with nothing learned by adaptive k in earlier tests."""
    for pipe in shared_pipes.values():
        pipe.forget_learned()
    return shared_pipes


def target_only(pipe, prompt, n):
    return [t for c in pipe.stream_ids(prompt, max_new_tokens=n, draft="none", k=0) for t in c]


# every drafter mode, fixed k and adaptive k (with confidence early stop)
MODES = [("model", False), ("ngram", False), ("auto", False), ("model", True), ("ngram", True), ("auto", True)]
REPETITIVE = [1, 5, 9, 33, 7, 5, 9, 33, 7, 5, 9]  # n-gram proposals get made


@pytest.mark.parametrize("bundle", ["good", "bad", "int4", "int8", "eagle", "int8-kv16", "good-kv16", "eagle-kv16"])
@pytest.mark.parametrize("draft,adaptive", MODES)
@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_greedy_speculative_equals_target_only(pipes, bundle, draft, adaptive, k):
    pipe = pipes[bundle]
    for prompt in PROMPTS + [REPETITIVE]:
        want = target_only(pipe, prompt, 40)
        got = [t for c in pipe.stream_ids(prompt, max_new_tokens=40, k=k, draft=draft, adaptive=adaptive) for t in c]
        assert got == want, (bundle, draft, adaptive, k, prompt)


def test_good_draft_accepts_everything_bad_draft_does_not(pipes):
    s_good, s_bad = Stats(), Stats()
    list(pipes["good"].stream_ids(PROMPTS[0], max_new_tokens=40, k=4, stats=s_good))
    list(pipes["bad"].stream_ids(PROMPTS[0], max_new_tokens=40, k=4, stats=s_bad))
    assert s_good.acceptance_rate == 1.0 and s_good.mean_accepted_per_round > 4
    assert s_bad.acceptance_rate < 0.5
    assert s_good.new_tokens == s_bad.new_tokens == 40
    assert len(s_good.per_position_acceptance) == 4


@pytest.mark.parametrize("adaptive", [False, True])
@pytest.mark.parametrize("k", [1, 4, 8])
def test_greedy_ngram_without_draft_model(pipes, adaptive, k):
    pipe = pipes["none"]
    st = Stats()
    want = target_only(pipe, REPETITIVE, 40)
    got = [t for c in pipe.stream_ids(REPETITIVE, max_new_tokens=40, k=k, draft="ngram", adaptive=adaptive, stats=st) for t in c]
    assert got == want
    assert st.draft_tokens > 0 and set(st.drafter_rounds) == {"ngram"}


def test_default_k_comes_from_the_manifest(pipes, tiny_bundles):
    from specrt.export.api import RECOMMENDED_K

    assert pipes["int8"].default_k == RECOMMENDED_K["self-int8"]  # written by the exporter
    assert pipes["good"].default_k == 4  # a separate draft: unset in the manifest, runtime default
    with specrt.load(tiny_bundles["int8"], k=3, adaptive=False) as pipe:
        assert pipe.default_k == 3  # the caller's k wins
    # a request without k runs at the default: with a perfect draft every round proposes it
    st = Stats()
    with specrt.load(tiny_bundles["good"], k=6, adaptive=False) as pipe:
        list(pipe.stream_ids(PROMPTS[1], max_new_tokens=30, ignore_eos=True, stats=st))
    assert st.k_history[:3] == [6, 6, 6]


def test_max_new_tokens_and_eos_inside_accepted_run(pipes):
    pipe = pipes["good"]
    full = target_only(pipe, PROMPTS[1], 30)
    for n in (1, 2, 7, 13):
        got = [t for c in pipe.stream_ids(PROMPTS[1], max_new_tokens=n, k=8) for t in c]
        assert got == full[:n]
    # make a token in the middle of the run an EOS: output stops right before it
    eos_at = 9
    ends = pipe.tokenizer.eog_ids
    pipe.tokenizer.eog_ids = {full[eos_at]}
    try:
        got = [t for c in pipe.stream_ids(PROMPTS[1], max_new_tokens=30, k=8) for t in c]
    finally:
        pipe.tokenizer.eog_ids = ends
    assert got == full[: full.index(full[eos_at])]


def test_k_larger_than_room_left(pipes):
    pipe = pipes["good"]
    cap = pipe.max_seq_len
    prompt = list(np.random.default_rng(0).integers(3, 128, size=cap - 6))
    want = target_only(pipe, prompt, 6)
    got = [t for c in pipe.stream_ids(prompt, max_new_tokens=6, k=8) for t in c]
    assert got == want and len(got) == 6


# Every drafter x fixed / adaptive k x sampling setting runs on the fake backend
# (tests/runtime/engine/test_scheduler.py); here each kind of real draft: a separate model (`bad`), the
# self-draft on the target's pool (`int8`) and an EAGLE head, under each drafter once.
SAMPLING_CASES = [
    ("bad", "model", False, SamplingConfig(1.0)), ("bad", "auto", True, SamplingConfig(0.8, top_p=0.9)),
    ("bad", "ngram", False, SamplingConfig(1.2, top_k=10)), ("bad", "model", True, SamplingConfig(1.2, top_k=10)),
    ("int8", "model", False, SamplingConfig(1.0)), ("int8", "auto", True, SamplingConfig(0.8, top_p=0.9)),
    ("eagle", "model", False, SamplingConfig(1.0)), ("eagle", "auto", True, SamplingConfig(0.8, top_p=0.9)),
]


@pytest.mark.parametrize("bundle,draft,adaptive,cfg", SAMPLING_CASES)
def test_sampling_distribution_matches_target(pipes, bundle, draft, adaptive, cfg, monkeypatch):
    pipe = pipes[bundle]
    # tiny draft and target cost the same here; pretend drafting and verifying are nearly free
    # so the adaptive policy keeps speculating (and early-stopping) with a draft it has learned
    # (across these requests) is mostly wrong, instead of falling back to plain steps
    cheap = Costs({1: 10.0, 2: 10.05, 9: 10.4}, draft_ms=0.05)
    monkeypatch.setattr(pipe.store, "_costs", cheap)  # what every request's policies start from
    monkeypatch.setattr(pipe.scheduler, "costs", cheap)
    monkeypatch.setattr(pipe.tokenizer, "eog_ids", set())  # EOS is just another token here
    prompt = [1, 5, 9, 33, 7, 5, 9]
    want = second_token_dist(pipe, prompt, cfg)
    n = 3000
    counts = np.zeros_like(want)
    proposed = 0
    for seed in range(n):
        st = Stats()
        # max_new_tokens 3 leaves room for k = 1 in the first round, so token 2 is verified
        gen = pipe.stream_ids(prompt, max_new_tokens=3, k=4, draft=draft, seed=seed, adaptive=adaptive,
                              temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p, stats=st)
        toks = [t for c in gen for t in c]
        counts[toks[1]] += 1
        proposed += st.draft_tokens
    assert proposed > n // 4, "speculation barely ran: the test would not check verification"
    assert counts[want == 0].sum() == 0
    exp = want * n
    big = exp >= 5
    obs = np.append(counts[big], counts[~big].sum())
    e = np.append(exp[big], exp[~big].sum())
    keep = e > 0
    pval = sps.chisquare(obs[keep], e[keep] * obs[keep].sum() / e[keep].sum()).pvalue
    assert pval > 1e-3, pval


@pytest.mark.parametrize("bundle", ["good", "bad", "int8", "eagle"])
@pytest.mark.parametrize("draft,adaptive", [("model", False), ("ngram", False), ("auto", True)])
def test_seed_reproduces_sampling_and_equals_target_only(pipes, bundle, draft, adaptive):
    """A seeded sampled request gives one output on every repeat, and it is target-only
    sampling's with that seed (runtime/sampling/draws.py `Draws`), whatever the drafter."""
    pipe = pipes[bundle]
    kw = dict(max_new_tokens=20, temperature=1.0, top_p=0.95, ignore_eos=True)
    for prompt, seed in ((PROMPTS[0], 5), (REPETITIVE, 6)):
        want = [t for c in pipe.stream_ids(prompt, draft="none", k=0, seed=seed, **kw) for t in c]
        for _ in range(2):
            got = [t for c in pipe.stream_ids(prompt, draft=draft, adaptive=adaptive, k=4, seed=seed, **kw) for t in c]
            assert got == want
    other = [t for c in pipe.stream_ids(PROMPTS[0], seed=7, **kw) for t in c]
    assert other != [t for c in pipe.stream_ids(PROMPTS[0], seed=5, **kw) for t in c]


def test_kv_rewind_random_accept_patterns(tiny_bundles):
    """Random verify/accept/rewind rounds on two slots of one pool, with batched one-token calls
    over a range of slots (a free one in the middle) in between; at every round each slot's
    cache gives the logits of a fresh run."""
    folder = tiny_bundles["none"]
    man = load_manifest(folder)
    pool = KVPool(man.target.kv, 3)
    model = OrtModel(folder / man.target.graph, man.target, pool, track="target")
    assert model.batch_rows
    fresh = SequenceHarness(OrtBackend(folder / man.target.graph, man.target))

    def ref(tokens):
        fresh.reset()
        return fresh.prefill(tokens)

    rng = np.random.default_rng(0)
    seqs = {}
    for slot in (0, 2):  # slot 1 stays free: batched calls over [0, 3) write filler at its spare row
        seqs[slot] = [int(t) for t in rng.integers(3, 128, size=6 + slot)]
        model.run(slot, np.array(seqs[slot][:-1]), 0, keep=1)
        pool.advance("target", slot, len(seqs[slot]) - 1)
    batched = 0
    for _ in range(40):
        if rng.random() < 0.3:  # a plain step for both: one token each, one call
            pasts = [pool.length("target", 0), pool.spare_row(1), pool.length("target", 2)]
            logits = model.run_rows(0, np.array([seqs[0][-1], 7, seqs[2][-1]]), np.array(pasts)).copy()
            batched += 1
            for slot in (0, 2):
                pool.advance("target", slot, 1)
                np.testing.assert_allclose(logits[slot], ref(seqs[slot]), atol=1e-4)
                seqs[slot].append(int(rng.integers(3, 128)))
            continue
        slot = int(rng.choice([0, 2]))
        seq = seqs[slot]
        k = int(rng.integers(0, model.max_t))
        proposal = [int(t) for t in rng.integers(3, 128, size=k)]
        pos = pool.reserve("target", slot, k + 1)
        assert pos == len(seq) - 1
        rows = model.run(slot, np.array([seq[-1]] + proposal), pos).copy()  # verification-shaped call
        pool.advance("target", slot, k + 1)
        accepted = int(rng.integers(0, k + 1))
        np.testing.assert_allclose(rows[accepted], ref(seq + proposal[:accepted]), atol=1e-4)
        seq += proposal[:accepted] + [int(rng.integers(3, 128))]
        pool.rewind("target", slot, len(seq) - 1)
    assert batched > 3
    for slot in (0, 2):
        assert pool.length("target", slot) == len(seqs[slot]) - 1


def test_prompt_chunks_wider_than_a_verification_call(pipes, tiny_bundles, monkeypatch):
    """On onnxruntime a prompt goes in chunks of up to max_prefill_t (one weight stream per
    chunk), with the same logits and cache as chunks of max_t; graphs with EAGLE feature IO
    keep max_t."""
    folder = tiny_bundles["none"]
    man = load_manifest(folder)
    wide = SequenceHarness(OrtBackend(folder / man.target.graph, man.target))
    assert wide.max_prefill_t > wide.max_t == 9
    ids = (np.arange(40) * 7) % 50 + 3
    calls = []
    real = wide.backend.run
    wide.backend.run = lambda t, p, h=None, keep=None: (calls.append((len(t), keep)), real(t, p, h, keep))[1]
    got = wide.prefill(ids).copy()
    assert calls == [(40, 1)]  # one chunk, and only its last row through the LM head
    wide.reset()
    np.testing.assert_allclose(got, wide.prefill(ids, chunk=wide.max_t), atol=1e-4, rtol=0)
    np.testing.assert_allclose(wide.forward([5])[0], fresh_row(folder, man, list(ids) + [5]), atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="1..64"):
        wide.forward(np.arange(65) % 50)
    eagle = load_manifest(tiny_bundles["eagle"])
    assert OrtBackend(tiny_bundles["eagle"] / eagle.target.graph, eagle.target).max_prefill_t == eagle.target.max_tokens_per_call
    # the engine's prefill: the same one chunk on the pool model, its first token that row's argmax
    pipe = pipes["none"]
    target = pipe.parts.target
    assert target.max_prefill_t == wide.max_prefill_t
    assert pipes["eagle"].parts.target.max_prefill_t == eagle.target.max_tokens_per_call
    calls.clear()
    real_pool = target.run_batch
    monkeypatch.setattr(target, "run_batch", lambda b: (calls.extend((b.count(i), int(b.keeps[i]))
                                                                     for i in range(len(b))), real_pool(b))[1])
    out, st = run_request(pipe, [int(t) for t in ids], max_new_tokens=1, draft="none")
    assert calls == [(40, 1)] and out == [int(got.argmax())] and st.prompt_tokens == 40


def fresh_row(folder, man, ids):
    dec = SequenceHarness(OrtBackend(folder / man.target.graph, man.target))
    row = None
    for t in ids:  # one token per call: no chunking at all
        row = dec.forward([t])[0].copy()
    return row


def test_auto_adaptive_learns_ngram_and_model_rounds_apart(tiny_bundles):
    with specrt.load(tiny_bundles["good"], adaptive=False) as pipe:
        want = target_only(pipe, REPETITIVE, 40)
        st = Stats()
        got = [t for c in pipe.stream_ids(REPETITIVE, max_new_tokens=40, draft="auto", adaptive=True, stats=st)
               for t in c]
        assert got == want
        learned = pipe.store._learned
        assert {("auto:ngram", True), ("model", True)} <= set(learned)
        assert learned[("auto:ngram", True)][0].tried.sum() > 0  # the prompt repeats: copies were tried
        assert learned[("auto:ngram", True)][0] is not learned[("model", True)][0]
        assert st.drafter_rounds.get("ngram", 0) > 0


def test_first_token_goes_out_before_the_draft_reads_the_prompt(tiny_bundles, monkeypatch):
    """TTFT is the target's prefill alone; the draft's prompt prefill follows the first token
    and is counted in decode time (and reported as draft_prefill_ms)."""
    with specrt.load(tiny_bundles["good"], adaptive=False) as pipe:
        draft = pipe.parts.draft
        widths = _Widths(draft, monkeypatch).widths
        assert draft.pool is not pipe.parts.target.pool  # a separate model: it computes the prompt itself
        want = target_only(pipe, PROMPTS[1], 20)
        seen = []  # (new tokens so far, draft rows) at each committed chunk
        got, st = run_request(pipe, PROMPTS[1], max_new_tokens=20, k=4,
                      on_tokens=lambda r: seen.append((r.produced, draft.pool.length(draft.track, r.slot))))
        assert got == want
        assert seen[0] == (1, 0)  # the first token went out before the draft had seen the prompt
        assert all(rows >= len(PROMPTS[1]) for _, rows in seen[1:])  # then it read it
        # in one call, of the prompt and the first token (the widest chunk holds both), timed
        # as the draft's prefill and counted in decode time, not in TTFT
        assert widths[0] == len(PROMPTS[1]) + 1 and max(widths[1:]) <= 2
        assert st.draft_prefill_ms > 0 and st.prefill_ms >= st.draft_prefill_ms
        assert st.decode_ms >= st.draft_prefill_ms
        # a request that asks for one token never runs the draft
        widths.clear()
        _, one = run_request(pipe, PROMPTS[1], max_new_tokens=1, k=4)
        assert widths == [] and one.draft_prefill_ms == 0 and one.rounds == 0


def _target_rows(pipe, slot, n):
    """The target's K and V rows [0, n) of one slot, every layer (copies)."""
    pool = pipe.parts.target.pool
    return [np.stack([pool.host[2 * layer][slot, :, :n].copy(), pool.host[2 * layer + 1][slot, :, :n].copy()])
            for layer in range(pipe.manifest.target.kv.layers)]


def _scramble(pool, slot, seed):
    """Noise over a slot's rows: whatever matches a reference afterwards was written since."""
    noise = np.random.default_rng(seed)
    for a in pool.host:
        a[slot] = noise.standard_normal(a[slot].shape).astype(a.dtype)


class _Widths:
    """Records the width of every sequence a pool model's batches hold (the engine thread calls it)."""

    def __init__(self, model, monkeypatch):
        self.widths = []
        run = model.run_batch
        monkeypatch.setattr(model, "run_batch",
                            lambda b: (self.widths.extend(b.count(i) for i in range(len(b))), run(b))[1])


def test_self_draft_is_a_track_on_the_targets_pool_and_never_writes_its_rows(tiny_bundles, monkeypatch):
    """A self-draft works in the target's own KV buffers: a second track on the target's pool,
    no copy, no second cache. It takes the committed rows (never computes the prompt) and may
    only write rows at or past the target's length (the next verification overwrites them), so
    after a speculative run the target's rows are still the target's: equal to a target-only
    run's, and the output is exact."""
    # no prefix reuse: the test scrambles the slot between runs (what it held must not matter)
    pipe = specrt.load(tiny_bundles["int8"], adaptive=False, prefix_cache=False)
    p = pipe.parts
    assert p.shared_kv and p.draft.pool is p.target.pool and p.draft.track != p.target.track
    assert p.kv_bytes_per_slot == p.target.pool.bytes_per_slot()  # one cache per slot
    with specrt.load(tiny_bundles["good"], adaptive=False) as other:  # a separate model: a pool of its own
        assert not other.parts.shared_kv and other.parts.draft.pool is not other.parts.target.pool
        assert other.kv_bytes_per_slot == 2 * other.parts.target.pool.bytes_per_slot()
    pool = p.target.pool
    widths = _Widths(p.draft, monkeypatch).widths
    slots = []
    on_tokens = lambda r: slots.append(r.slot)  # noqa: E731
    want, _ = run_request(pipe, PROMPTS[1], on_tokens, max_new_tokens=30, draft="none", ignore_eos=True)
    slot = slots[0]
    n = len(PROMPTS[1]) + 30 - 1  # the committed tokens the target has fed
    rows_target_only = _target_rows(pipe, slot, n)
    # fixed k, adaptive k (k = 0 rounds and early stops), auto (n-gram rounds in between)
    for i, (draft, adaptive) in enumerate((("model", False), ("model", True), ("auto", False), ("auto", True))):
        _scramble(pool, slot, i)
        widths.clear()
        slots.clear()
        got, st = run_request(pipe, PROMPTS[1], on_tokens, max_new_tokens=30, k=3, draft=draft, adaptive=adaptive,
                      ignore_eos=True)
        assert got == want and set(slots) == {slot}
        assert st.draft_tokens > 0 and widths and max(widths) == 1  # drafted, never computed the prompt
        assert st.draft_prefill_ms == 0  # taken, not computed
        for a, b in zip(_target_rows(pipe, slot, n), rows_target_only, strict=True):
            np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)  # an int8 draft row would differ by ~1e-2
    # a shorter prompt next, then sampling: still the target's own rows and exact
    short, _ = run_request(pipe, PROMPTS[0], max_new_tokens=12, draft="none", ignore_eos=True)
    m = len(PROMPTS[0]) + 12 - 1
    rows_short = _target_rows(pipe, slot, m)
    _scramble(pool, slot, 9)
    assert run_request(pipe, PROMPTS[0], on_tokens, max_new_tokens=12, k=3, ignore_eos=True)[0] == short
    for a, b in zip(_target_rows(pipe, slot, m), rows_short, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
    # sampling: what the same seed gives whatever the pool held before (the draft only reads the
    # target's rows and its own), and the target's rows are its own computation of those tokens
    sampled = []
    for i in (10, 11):
        _scramble(pool, slot, i)
        widths.clear()
        got, st = run_request(pipe, PROMPTS[1], on_tokens, max_new_tokens=20, k=3, temperature=0.8, seed=3, ignore_eos=True)
        sampled.append(got)
        assert len(got) == 20 and st.draft_tokens > 0 and widths and max(widths) == 1
    assert sampled[0] == sampled[1]
    m = len(PROMPTS[1]) + 20 - 1
    fresh = OrtBackend(pipe.folder / pipe.manifest.target.graph, pipe.manifest.target)
    fresh.run(np.array(PROMPTS[1] + sampled[0][:-1]), 0)
    for layer, (k_rows, v_rows) in enumerate(_target_rows(pipe, slot, m)):
        k_ref, v_ref = fresh.kv_host(layer)
        np.testing.assert_allclose(k_rows, k_ref[0, :, :m], atol=1e-5, rtol=0)
        np.testing.assert_allclose(v_rows, v_ref[0, :, :m], atol=1e-5, rtol=0)
    pipe.close()


@pytest.mark.parametrize("bundle", ["good", "bad"])
def test_separate_draft_keeps_its_own_pool_in_step(tiny_bundles, bundle, monkeypatch):
    """A separate draft has a pool of its own with the target's slot numbering; it computes the
    prompt itself (after the first token) and catches up on what it has not seen. At every
    commit its valid rows are its own computation of the committed tokens: a row left from a
    rejected proposal or misaligned after n-gram rounds would differ. (`good` is the target's
    own weights, so there its rows are the target's too.)"""
    folder = tiny_bundles[bundle]
    man = load_manifest(folder)
    fresh = SequenceHarness(OrtBackend(folder / man.draft.graph, man.draft))
    layers = range(man.draft.kv.layers)
    with specrt.load(folder, adaptive=False) as pipe:
        p = pipe.parts
        assert p.draft.pool is not p.target.pool and p.draft.pool.slots == p.target.pool.slots
        widths = _Widths(p.draft, monkeypatch).widths
        want, _ = run_request(pipe, REPETITIVE, max_new_tokens=30, draft="none", ignore_eos=True)
        seen = []

        def snapshot(r):  # the draft's valid rows, against a fresh computation (and the target's)
            d = p.draft.pool.length(p.draft.track, r.slot)
            assert d <= len(r.seq) - 1 == p.target.pool.length("target", r.slot)
            seen.append(d)
            if d == 0:
                return
            fresh.reset()
            fresh.prefill(r.seq[:d])
            for layer in layers:
                for j, ref in enumerate(fresh.backend.kv_host(layer)):
                    got = p.draft.pool.host[2 * layer + j][r.slot, :, :d]
                    np.testing.assert_allclose(got, ref[0, :, :d], atol=1e-4, rtol=0)
                    if bundle == "good":
                        np.testing.assert_allclose(got, p.target.pool.host[2 * layer + j][r.slot, :, :d],
                                                   atol=1e-4, rtol=0)

        for draft in ("model", "auto"):  # auto: n-gram rounds the draft has to catch up on
            widths.clear()
            seen.clear()
            _scramble(p.draft.pool, 0, 0)
            got, st = run_request(pipe, REPETITIVE, snapshot, max_new_tokens=30, k=3, draft=draft, ignore_eos=True)
            assert got == want and st.draft_tokens > 0
            assert seen[0] == 0 and max(seen) >= len(REPETITIVE) + 20  # it read the prompt, then kept up
            if bundle == "good":
                assert draft == "auto" or st.acceptance_rate == 1.0  # the model's proposals are the target's
            else:
                assert st.accepted_tokens < st.draft_tokens  # rejections: rows to drop at commit
            # its first call: the prompt and what was committed before it (one call: the prompt
            # fits the widest chunk); auto's first round here is an n-gram copy
            assert widths[0] == len(REPETITIVE) + 1 if draft == "model" else widths[0] > len(REPETITIVE) + 1
            if draft == "auto":
                assert st.drafter_rounds.get("ngram", 0) > 1 and max(widths[1:]) > 1  # catch-ups after copies
