"""Verification math: hand-computed cases and Monte Carlo against the target distribution."""

import numpy as np
import pytest
from scipy import stats as sps

from specrt.runtime.sampling.draws import InvalidSampling, SamplingConfig, probs, sample
from specrt.runtime.sampling.verify import verify_greedy, verify_sampling

ALPHA = 1e-3  # false-alarm rate of each chi-square test (fixed seeds make them deterministic)


def test_greedy_hand_computed():
    logits = np.array([[0, 5, 1], [9, 0, 0], [0, 0, 3], [1, 2, 0]], dtype=np.float32)  # argmax 1,0,2,1
    assert verify_greedy(np.array([1, 0, 2]), logits) == (3, 1)  # all accepted + bonus
    assert verify_greedy(np.array([1, 2, 2]), logits) == (1, 0)  # second rejected, target's 0
    assert verify_greedy(np.array([0, 0, 2]), logits) == (0, 1)
    assert verify_greedy(np.array([], dtype=np.int64), logits[:1]) == (0, 1)  # k = 0: plain step


def test_sampling_hand_computed():
    p = np.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    q = np.array([[0.25, 0.75, 0.0]])
    # draft 1: accept iff u < p/q = 2/3
    assert verify_sampling(np.array([1]), q, p, np.array([0.6]), 0.1) == (1, 0)  # bonus from p[1]: u=.1 -> 0
    assert verify_sampling(np.array([1]), q, p, np.array([0.6]), 0.9) == (1, 2)
    # rejected: residual max(0, p - q) = [0.25, 0, 0] -> always token 0
    assert verify_sampling(np.array([1]), q, p, np.array([0.7]), 0.99) == (0, 0)
    # one-hot draft: accept iff u < p(x); residual is p without x
    assert verify_sampling(np.array([2]), None, p[1:].repeat(2, 0), np.array([0.49]), 0.0) == (1, 0)
    n, tok = verify_sampling(np.array([2]), None, p[1:].repeat(2, 0), np.array([0.51]), 0.5)
    assert n == 0 and tok in (0, 1)


def test_sample_inverse_cdf_skips_zero_mass():
    p = np.array([0.0, 0.5, 0.0, 0.5])
    assert sample(p, 0.0) == 1 and sample(p, 0.49) == 1 and sample(p, 0.5) == 3 and sample(p, 0.999) == 3


def test_probs_top_k_top_p():
    logits = np.log(np.array([0.1, 0.4, 0.3, 0.2]))
    np.testing.assert_allclose(probs(logits, SamplingConfig(1.0)), [0.1, 0.4, 0.3, 0.2])
    np.testing.assert_allclose(probs(logits, SamplingConfig(1.0, top_k=2)), [0, 4 / 7, 3 / 7, 0])
    # top-p 0.6: 0.4 (<0.6, keep) then 0.3 crosses 0.6 (kept), 0.2 dropped
    np.testing.assert_allclose(probs(logits, SamplingConfig(1.0, top_p=0.6)), [0, 4 / 7, 3 / 7, 0])
    np.testing.assert_allclose(probs(logits, SamplingConfig(1.0, top_p=0.4)), [0, 1, 0, 0])
    t = probs(logits, SamplingConfig(0.5))
    np.testing.assert_allclose(t, np.array([0.01, 0.16, 0.09, 0.04]) / 0.30)


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(temperature=float("nan")), dict(top_k=-2),
                                 dict(top_p=0.0), dict(top_p=1.5), dict(top_k=1.5)])
def test_invalid_sampling_settings(bad):
    with pytest.raises(InvalidSampling):
        SamplingConfig(**{"temperature": 1.0, **bad})


def _emitted_first_tokens(p_rows, q_rows, one_hot, n, seed):
    """Run verification n times with fresh draws; return the first emitted token each time."""
    rng = np.random.default_rng(seed)
    k, V = q_rows.shape
    out = np.empty(n, dtype=np.int64)
    for t in range(n):
        if one_hot:
            draft = np.array([int(np.argmax(q_rows[i])) for i in range(k)])
            q = None
        else:
            draft = np.array([sample(q_rows[i], rng.random()) for i in range(k)])
            q = q_rows
        n_ok, nxt = verify_sampling(draft, q, p_rows, rng.random(k), rng.random())
        out[t] = draft[0] if n_ok > 0 else nxt
    return out


def _chi2_ok(samples, p, seed_note=""):
    V = len(p)
    counts = np.bincount(samples, minlength=V)
    mask = p > 0
    assert counts[~mask].sum() == 0, f"emitted tokens with zero target probability {seed_note}"
    exp = p[mask] * len(samples)
    stat, pval = sps.chisquare(counts[mask], exp)
    assert pval > ALPHA, f"chi-square p={pval:.2e} {seed_note}"


def _random_dist(rng, V, cfg):
    return probs(rng.standard_normal(V) * 2.0, cfg)


@pytest.mark.parametrize("cfg", [SamplingConfig(1.0), SamplingConfig(0.7, top_k=5), SamplingConfig(1.3, top_p=0.8)])
@pytest.mark.parametrize("one_hot", [False, True])
def test_first_token_follows_target(cfg, one_hot):
    rng = np.random.default_rng(42)
    V, k = 8, 3
    p = np.stack([_random_dist(rng, V, cfg) for _ in range(k + 1)])
    q = np.stack([_random_dist(rng, V, cfg) for _ in range(k)])
    _chi2_ok(_emitted_first_tokens(p, q, one_hot, 20000, seed=7), p[0], f"cfg={cfg} one_hot={one_hot}")


def test_bonus_token_follows_target():
    """Draft == target at positions 0..k-1 accepts everything; the bonus comes from p_k."""
    rng = np.random.default_rng(3)
    V, k = 6, 2
    p = np.stack([_random_dist(rng, V, SamplingConfig(1.0)) for _ in range(k + 1)])
    r = np.random.default_rng(11)
    bonus = []
    for _ in range(20000):
        draft = np.array([sample(p[i], r.random()) for i in range(k)])
        n_ok, nxt = verify_sampling(draft, p[:k], p, r.random(k), r.random())
        assert n_ok == k
        bonus.append(nxt)
    _chi2_ok(np.array(bonus), p[k], "bonus")


def test_second_position_joint_distribution():
    """Tokens at position 2 (given any first token) follow the target too: check the marginal
    of the second emitted token against sum_x p0(x) p1(.|x) with p1 independent of x here.
    Every second token comes out of verify_sampling: after a rejection at position 1 the engine
    starts a new round there (draft [d1], rows [p1, p2]), and so does this test."""
    rng = np.random.default_rng(5)
    V, k = 6, 2
    cfg = SamplingConfig(1.0)
    p = np.stack([_random_dist(rng, V, cfg) for _ in range(k + 1)])
    q = np.stack([_random_dist(rng, V, cfg) for _ in range(k)])
    r = np.random.default_rng(9)
    second, rejected_first = [], 0
    for _ in range(20000):
        draft = np.array([sample(q[i], r.random()) for i in range(k)])
        n_ok, nxt = verify_sampling(draft, q, p, r.random(k), r.random())
        if n_ok >= 1:  # first token came from the draft; the second is draft[1] or the residual/bonus
            second.append(draft[1] if n_ok >= 2 else nxt)
            continue
        rejected_first += 1  # the first token was the residual's: the next round drafts position 2
        d1 = np.array([sample(q[1], r.random())])
        n1, nxt1 = verify_sampling(d1, q[1:], p[1:], r.random(1), r.random())
        second.append(d1[0] if n1 else nxt1)
    assert rejected_first > 2000  # the branch is exercised
    _chi2_ok(np.array(second), p[1], "second position")


@pytest.mark.parametrize("top_p", [0.05, 0.5, 0.9, 0.99, 0.999999])
def test_top_p_fast_path_equals_full_sort(top_p):
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((4, 5000)) * np.array([[0.5], [2.0], [8.0], [0.0]])  # last row: all ties
    got = probs(logits, SamplingConfig(1.0, top_p=top_p))
    x = logits - logits.max(-1, keepdims=True)
    p = np.exp(x) / np.exp(x).sum(-1, keepdims=True)
    for r in range(4):
        order = np.argsort(-p[r], kind="stable")
        before = np.cumsum(p[r][order]) - p[r][order]
        want = np.zeros_like(p[r])
        keep = order[before < top_p]
        want[keep] = p[r][keep] / p[r][keep].sum()
        np.testing.assert_allclose(got[r], want, rtol=1e-12, atol=1e-15)
