"""A seed means one output (runtime/sampling/draws.py `Draws`): seeded sampled output is the same on
every repeat, and the same as target-only decoding with that seed, token for token — for every
drafter, fixed and adaptive k, prefix cache on and off, alone and beside other requests. On the
NumPy fake (exact logits: equality is exact); the real bundles: tests/runtime/engine/test_speculate.py."""

from __future__ import annotations

import numpy as np
import pytest

from checks import assert_follows
from fakes import drive, run_request
from specrt.runtime.sampling.draws import Draws, SamplingConfig, probs

MODES = [("model", False), ("ngram", False), ("auto", False), ("model", True), ("auto", True)]
PROMPTS = [[1, 5, 9, 7], [4, 4, 4, 9, 12, 30, 6, 4, 4, 4, 9],
           [int(t) for t in np.random.default_rng(1).integers(3, 32, size=40)]]
SETTINGS = [dict(temperature=0.9), dict(temperature=0.7, top_p=0.9), dict(temperature=1.0, top_k=8),
            dict(temperature=0.8, frequency_penalty=0.7, presence_penalty=0.3)]


def _out(pipe, prompt, seed, **kw):
    return run_request(pipe, prompt, max_new_tokens=24, seed=seed, ignore_eos=True, **kw)


@pytest.mark.parametrize("kind", ["self", "separate"])
@pytest.mark.parametrize("draft,adaptive", MODES)
@pytest.mark.parametrize("prefix_cache", [True, False])
def test_seeded_speculation_equals_seeded_target_only(make, kind, draft, adaptive, prefix_cache):
    pipe = make(draft=kind, noise=0.5, prefix_cache=prefix_cache)
    drafted = accepted = 0
    for i, (prompt, sampling) in enumerate(zip(PROMPTS * 2, SETTINGS * 2, strict=False)):
        want, _ = _out(pipe, prompt, 7 + i, draft="none", **sampling)
        for _ in range(2):  # a repeat finds the prompt cached (prefix_cache) and adaptive k moved on
            got, st = _out(pipe, prompt, 7 + i, draft=draft, adaptive=adaptive, k=4, **sampling)
            assert got == want, (prompt, sampling, st.k_history)
            drafted, accepted = drafted + st.draft_tokens, accepted + st.accepted_tokens
    assert 0 < accepted < drafted  # speculation ran, with rejections


def test_seeded_requests_at_once_each_get_their_target_only_output(make):
    """Eight seeded requests decoding together over four slots (batched rows, the batch plan,
    deferred admissions), every drafter mode: each one's target-only output with its seed."""
    pipe = make(draft="self", slots=4, noise=0.5)
    g = np.random.default_rng(3)
    prompts = [[int(t) for t in g.integers(3, 32, size=int(g.integers(2, 20)))] for _ in range(8)]
    sampling = [SETTINGS[i % len(SETTINGS)] for i in range(8)]
    want = [run_request(pipe, p, max_new_tokens=16, seed=100 + i, ignore_eos=True, draft="none", **sampling[i])[0]
            for i, p in enumerate(prompts)]
    reqs = [pipe.request(p, max_new_tokens=16, seed=100 + i, ignore_eos=True, k=3, draft=MODES[i % len(MODES)][0],
                         adaptive=MODES[i % len(MODES)][1], **sampling[i]) for i, p in enumerate(prompts)]
    assert drive(pipe, reqs) == want


def test_choices_reproduce_per_seed_and_differ_from_each_other(make):
    pipe = make(draft="self", noise=0.5)
    a = [pipe.request([1, 5, 9], max_new_tokens=12, temperature=1.0, seed=5, sibling=i, ignore_eos=True, k=3)
         for i in range(3)]
    b = [pipe.request([1, 5, 9], max_new_tokens=12, temperature=1.0, seed=5, sibling=i, ignore_eos=True, draft="none")
         for i in range(3)]
    first, second = drive(pipe, a), drive(pipe, b)
    assert first == second
    assert len({tuple(x) for x in first}) == 3


def test_unseeded_requests_are_independent(make):
    pipe = make(draft="self", noise=0.5)
    outs = {tuple(_out(pipe, [1, 5, 9], None, temperature=1.0, k=3)[0]) for _ in range(6)}
    assert len(outs) > 1


def test_coupled_draws_are_exact_samples():
    """argmax p / E with E ~ Exp(1) keyed by (seed, position) follows p (chi-square over seeds), a
    position's token depends only on its key, and the cache of noise is dropped on forget."""
    p = probs(np.random.default_rng(0).normal(size=40) * 2, SamplingConfig(1.0))
    n = 4000
    counts = np.bincount([Draws(s, 10).pick(p, 13) for s in range(n)], minlength=40)
    assert_follows(counts, p, n)
    d = Draws(9, 10)
    first = [d.pick(p, 10 + t) for t in range(5)]
    again = Draws(9, 10)
    assert [again.pick(p, 10 + t) for t in reversed(range(5))][::-1] == first  # order of draws is irrelevant
    assert Draws([9, 0], 10).pick(p, 12) == first[2] and Draws([9, 1], 10).key != d.key
    d.forget(13)
    assert sorted(d._noise) == [3, 4]
