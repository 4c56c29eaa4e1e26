"""End to end on tiny exported models: speculation is lossless."""

import numpy as np
import pytest
from scipy import stats as sps

import specrt
from specrt.runtime.adaptive import Costs
from specrt.runtime.backends.ort import OrtBackend
from specrt.runtime.decoder import Decoder
from specrt.runtime.manifest import load_manifest
from specrt.runtime.sampling import SamplingConfig, probs

PROMPTS = [[1, 5, 9, 33, 7], [1, 100, 4, 4, 4, 90, 12, 60], [1, 3]]


@pytest.fixture(scope="module")
def pipes(tiny_bundles):
    out = {name: specrt.load(path, draft="model" if name != "none" else "none") for name, path in tiny_bundles.items()}
    return out


def target_only(pipe, prompt, n):
    return [t for c in pipe.stream_ids(prompt, max_new_tokens=n, draft="none", k=0) for t in c]


# every drafter mode, fixed k and adaptive k (with confidence early stop)
MODES = [("model", False), ("ngram", False), ("auto", False), ("model", True), ("ngram", True), ("auto", True)]
REPETITIVE = [1, 5, 9, 33, 7, 5, 9, 33, 7, 5, 9]  # n-gram proposals get made


@pytest.mark.parametrize("bundle", ["good", "bad", "int4", "int8", "eagle"])
@pytest.mark.parametrize("draft,adaptive", MODES)
@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_greedy_speculative_equals_target_only(pipes, bundle, draft, adaptive, k):
    pipe = pipes[bundle]
    for prompt in PROMPTS + [REPETITIVE]:
        want = target_only(pipe, prompt, 40)
        got = [t for c in pipe.stream_ids(prompt, max_new_tokens=40, k=k, draft=draft, adaptive=adaptive) for t in c]
        assert got == want, (bundle, draft, adaptive, k, prompt)


def test_good_draft_accepts_everything_bad_draft_does_not(pipes):
    from specrt.runtime.speculate import Stats

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
    from specrt.runtime.speculate import Stats

    st = Stats()
    want = target_only(pipe, REPETITIVE, 40)
    got = [t for c in pipe.stream_ids(REPETITIVE, max_new_tokens=40, k=k, draft="ngram", adaptive=adaptive, stats=st) for t in c]
    assert got == want
    assert st.draft_tokens > 0 and set(st.drafter_rounds) == {"ngram"}


def test_default_k_comes_from_the_manifest(pipes, tiny_bundles):
    from specrt.export.api import RECOMMENDED_K

    assert pipes["int8"].default_k == RECOMMENDED_K["self-int8"]  # written by the exporter
    assert pipes["good"].default_k == 4  # a separate draft: unset in the manifest, runtime default
    assert specrt.load(tiny_bundles["int8"], k=3).default_k == 3  # the caller's k wins
    # a request without k runs at the default: with a perfect draft every round proposes it
    from specrt.runtime.speculate import Stats

    st = Stats()
    list(specrt.load(tiny_bundles["good"], k=6).stream_ids(PROMPTS[1], max_new_tokens=30, ignore_eos=True, stats=st))
    assert st.k_history[:3] == [6, 6, 6]


def test_max_new_tokens_and_eos_inside_accepted_run(pipes):
    pipe = pipes["good"]
    full = target_only(pipe, PROMPTS[1], 30)
    for n in (1, 2, 7, 13):
        got = [t for c in pipe.stream_ids(PROMPTS[1], max_new_tokens=n, k=8) for t in c]
        assert got == full[:n]
    # make a token in the middle of the run an EOS: output stops right before it
    eos_at = 9
    pipe.tokenizer.eos_ids = {full[eos_at]}
    try:
        got = [t for c in pipe.stream_ids(PROMPTS[1], max_new_tokens=30, k=8) for t in c]
    finally:
        pipe.tokenizer.eos_ids = set(pipe.manifest.tokenizer.eos_token_ids)
    assert got == full[: full.index(full[eos_at])]


def test_k_larger_than_room_left(pipes):
    pipe = pipes["good"]
    cap = pipe.max_seq_len
    prompt = list(np.random.default_rng(0).integers(3, 128, size=cap - 6))
    want = target_only(pipe, prompt, 6)
    got = [t for c in pipe.stream_ids(prompt, max_new_tokens=6, k=8) for t in c]
    assert got == want and len(got) == 6


def _second_token_dist(pipe, prompt, cfg):
    """Exact target distribution of the 2nd new token: sum_x p(x) p(. | x), via the target graph."""
    dec = pipe.target
    dec.reset()
    p1 = probs(dec.prefill(prompt), cfg)
    base = dec.length
    total = np.zeros_like(p1)
    for x in np.flatnonzero(p1 > 0):
        dec.rewind(base)
        total += p1[x] * probs(dec.forward([x])[0], cfg)
    dec.reset()
    return total


SAMPLING_CASES = [(d, a, SamplingConfig(1.0)) for d, a in MODES] + [
    ("model", False, SamplingConfig(0.8, top_p=0.9)), ("auto", True, SamplingConfig(0.8, top_p=0.9)),
    ("model", True, SamplingConfig(1.2, top_k=10)), ("ngram", False, SamplingConfig(1.2, top_k=10)),
]


@pytest.mark.parametrize("bundle,draft,adaptive,cfg", [("bad", *c) for c in SAMPLING_CASES] + [
    ("eagle", "model", False, SamplingConfig(1.0)), ("eagle", "auto", True, SamplingConfig(0.8, top_p=0.9))])
def test_sampling_distribution_matches_target(pipes, bundle, draft, adaptive, cfg, monkeypatch):
    pipe = pipes[bundle]
    # tiny draft and target cost the same here; pretend drafting and verifying are nearly free
    # so the adaptive policy keeps speculating (and early-stopping) with a draft it has learned
    # (across these requests) is mostly wrong, instead of falling back to plain steps
    monkeypatch.setattr(pipe, "_costs", Costs({1: 10.0, 2: 10.05, 9: 10.4}, draft_ms=0.05))
    monkeypatch.setattr(pipe.tokenizer, "eos_ids", set())  # EOS is just another token here
    prompt = [1, 5, 9, 33, 7, 5, 9]
    want = _second_token_dist(pipe, prompt, cfg)
    n = 3000
    counts = np.zeros_like(want)
    from specrt.runtime.speculate import Stats

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


def test_seed_reproduces_sampling(pipes):
    pipe = pipes["bad"]
    a = [t for c in pipe.stream_ids(PROMPTS[0], max_new_tokens=20, temperature=1.0, seed=5) for t in c]
    b = [t for c in pipe.stream_ids(PROMPTS[0], max_new_tokens=20, temperature=1.0, seed=5) for t in c]
    c = [t for c in pipe.stream_ids(PROMPTS[0], max_new_tokens=20, temperature=1.0, seed=6) for t in c]
    assert a == b and a != c


def test_kv_rewind_random_accept_patterns(tiny_bundles):
    """Random verify/accept/rewind rounds; afterwards the cache gives the logits of a fresh run."""
    folder = tiny_bundles["none"]
    man = load_manifest(folder)
    dec = Decoder(OrtBackend(folder / man.target.graph, man.target))
    fresh = Decoder(OrtBackend(folder / man.target.graph, man.target))
    rng = np.random.default_rng(0)
    seq = [int(t) for t in rng.integers(3, 128, size=6)]
    dec.prefill(seq[:-1])
    for _ in range(30):
        k = int(rng.integers(0, dec.max_t))
        proposal = [int(t) for t in rng.integers(3, 128, size=k)]
        rows = dec.forward([seq[-1]] + proposal).copy()  # verification-shaped call
        accepted = int(rng.integers(0, k + 1))
        fresh.reset()
        ref = fresh.prefill(seq + proposal[:accepted])
        np.testing.assert_allclose(rows[accepted], ref, atol=1e-4)
        seq += proposal[:accepted] + [int(rng.integers(3, 128))]
        dec.rewind(len(seq) - 1)
    assert dec.length == len(seq) - 1


def test_prompt_chunks_wider_than_a_verification_call(tiny_bundles):
    """On onnxruntime a prompt goes in chunks of up to max_prefill_t (one weight stream per
    chunk), with the same logits and cache as chunks of max_t; graphs with EAGLE feature IO
    keep max_t."""
    folder = tiny_bundles["none"]
    man = load_manifest(folder)
    wide = Decoder(OrtBackend(folder / man.target.graph, man.target))
    assert wide.max_prefill_t > wide.max_t == 9
    ids = (np.arange(40) * 7) % 50 + 3
    calls = []
    run = wide.backend.run
    wide.backend.run = lambda t, p, h=None, keep=None: (calls.append((len(t), keep)), run(t, p, h, keep))[1]
    got = wide.prefill(ids).copy()
    assert calls == [(40, 1)]  # one chunk, and only its last row through the LM head
    wide.reset()
    np.testing.assert_allclose(got, wide.prefill(ids, chunk=wide.max_t), atol=1e-4, rtol=0)
    np.testing.assert_allclose(wide.forward([5])[0], fresh_row(folder, man, list(ids) + [5]), atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="1..64"):
        wide.forward(np.arange(65) % 50)
    eagle = load_manifest(tiny_bundles["eagle"])
    assert OrtBackend(tiny_bundles["eagle"] / eagle.target.graph, eagle.target).max_prefill_t == eagle.target.max_tokens_per_call


def fresh_row(folder, man, ids):
    dec = Decoder(OrtBackend(folder / man.target.graph, man.target))
    row = None
    for t in ids:  # one token per call: no chunking at all
        row = dec.forward([t])[0].copy()
    return row


def test_auto_adaptive_learns_ngram_and_model_rounds_apart(tiny_bundles):
    pipe = specrt.load(tiny_bundles["good"])
    want = target_only(pipe, REPETITIVE, 40)
    got = [t for c in pipe.stream_ids(REPETITIVE, max_new_tokens=40, draft="auto", adaptive=True) for t in c]
    assert got == want
    assert {("auto:ngram", True), ("model", True)} <= set(pipe._learned)
    assert pipe._learned[("auto:ngram", True)][0].tried.sum() > 0  # the prompt repeats: copies were tried


def test_first_token_goes_out_before_the_draft_reads_the_prompt(tiny_bundles):
    """TTFT is the target's prefill alone; the draft's prompt prefill follows the first token
    and is counted in decode time (and reported as draft_prefill_ms)."""
    from specrt.runtime.speculate import Stats

    pipe = specrt.load(tiny_bundles["good"])
    want = target_only(pipe, PROMPTS[1], 20)
    st = Stats()
    gen = pipe.stream_ids(PROMPTS[1], max_new_tokens=20, k=4, stats=st)
    first = next(gen)
    assert pipe.draft_decoder.length == 0  # the draft has not seen the prompt yet
    assert first + [t for c in gen for t in c] == want
    assert st.draft_prefill_ms > 0 and st.prefill_ms > st.ttft_ms


def _target_rows(pipe, n):
    return [np.concatenate([a[:, :, :n].copy() for a in pipe.target.backend.kv_host(layer)])
            for layer in range(pipe.manifest.target.kv.layers)]


def test_self_draft_shares_the_targets_kv_and_never_writes_its_rows(tiny_bundles):
    """On the host a self-draft works in the target's own KV buffers: no copy, no second cache.
    It may only write rows at or past the target's length (the next verification overwrites
    them), so after a speculative run the target's rows are still the target's: equal to a
    target-only run's, and the output is exact."""
    from specrt.runtime.speculate import Stats

    pipe = specrt.load(tiny_bundles["int8"])
    drafter = pipe.drafter("model")
    assert drafter.kv_source is pipe.target and drafter.shared
    assert pipe.draft_decoder.backend.shares_kv(pipe.target.backend)
    assert specrt.load(tiny_bundles["good"]).drafter("model").kv_source is None  # a separate model: own cache
    want = target_only(pipe, PROMPTS[1], 30)
    n = pipe.target.length
    rows_target_only = _target_rows(pipe, n)
    # fixed k, adaptive k (k = 0 rounds and early stops), auto (n-gram rounds in between)
    for draft, adaptive in (("model", False), ("model", True), ("auto", False), ("auto", True)):
        st = Stats()
        got = [t for c in pipe.stream_ids(PROMPTS[1], max_new_tokens=30, k=3, draft=draft, adaptive=adaptive,
                                          stats=st) for t in c]
        assert got == want
        assert st.draft_prefill_ms < 50  # taken, not computed
        assert pipe.target.length == n
        for a, b in zip(_target_rows(pipe, n), rows_target_only, strict=True):
            np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)  # an int8 draft row would differ by ~1e-2
    # a shorter prompt next, then sampling: still the target's own rows and exact
    short = target_only(pipe, PROMPTS[0], 12)
    m = pipe.target.length
    rows_short = _target_rows(pipe, m)
    assert [t for c in pipe.stream_ids(PROMPTS[0], max_new_tokens=12, k=3) for t in c] == short
    for a, b in zip(_target_rows(pipe, m), rows_short, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
    sampled = [t for c in pipe.stream_ids(PROMPTS[1], max_new_tokens=20, k=3, temperature=0.8, seed=3) for t in c]
    assert len(sampled) >= 1
    # a draft decoder on the target's buffers is only usable with the target as its kv_source
    from specrt.runtime.drafters import ModelDrafter

    with pytest.raises(ValueError, match="kv_source"):
        ModelDrafter(pipe.draft_decoder)


def test_self_draft_with_its_own_cache_copies_the_targets_rows(tiny_bundles):
    """Where the buffers cannot be shared (device memory), the self-draft copies the target's
    prompt rows and the rows of every accepted token instead: its cache equals the target's over
    the committed tokens; output stays exact."""
    from specrt.runtime.backends.ort import OrtBackend
    from specrt.runtime.decoder import Decoder
    from specrt.runtime.speculate import Stats

    pipe = specrt.load(tiny_bundles["int8"])
    man = pipe.manifest
    pipe.draft_decoder = Decoder(OrtBackend(tiny_bundles["int8"] / man.draft.graph, man.draft), "draft")
    drafter = pipe.drafter("model")
    assert drafter.kv_source is pipe.target and not drafter.shared
    want = target_only(pipe, PROMPTS[1], 30)
    st = Stats()
    assert [t for c in pipe.stream_ids(PROMPTS[1], max_new_tokens=30, k=3, stats=st) for t in c] == want
    assert st.draft_prefill_ms < 50  # copied, not computed
    n = pipe.target.length  # committed tokens - 1
    assert pipe.draft_decoder.length >= n - 1
    for layer in (0, man.target.kv.layers - 1):
        for d, t in zip(pipe.draft_decoder.backend.kv_host(layer), pipe.target.backend.kv_host(layer), strict=True):
            np.testing.assert_array_equal(d[:, :, :n - 1], t[:, :, :n - 1])
