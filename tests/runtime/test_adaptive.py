"""Adaptive k and confidence early stop: decisions follow the cost model."""

import pytest

from specrt.runtime.adaptive import AcceptanceModel, AdaptivePolicy, Calibration, Costs

COSTS = Costs({1: 30.0, 2: 31.0, 3: 32.0, 5: 34.0, 9: 42.0, 17: 48.0}, draft_ms=3.0)  # c = 0.1


def test_costs_interpolate():
    assert COSTS.c == pytest.approx(0.1)
    assert COSTS.v(4) == pytest.approx(33.0 / 30.0)


def test_expected_tokens_per_position():
    m = AcceptanceModel(4, prior=0.5, weight=1e-9)
    m.ok[:] = [9, 4, 1, 0]
    m.tried[:] = [10, 8, 4, 2]  # rates .9 .5 .25 0
    assert m.expected_tokens(0) == 1
    assert m.expected_tokens(3) == pytest.approx(1 + 0.9 + 0.45 + 0.1125)


def test_choose_k_tracks_acceptance():
    p = AdaptivePolicy(COSTS, max_k=8, early_stop=False)
    for _ in range(40):
        p.update(8, 8, [])  # everything accepted: long drafts pay
    assert p.choose_k() == 8
    q = AdaptivePolicy(COSTS, max_k=8, early_stop=False)
    for _ in range(40):
        q.update(4, 1, [])  # second position always rejected
    assert q.choose_k() in (1, 2)


def test_falls_back_to_target_steps_and_reprobes():
    expensive = Costs(COSTS.target_ms, draft_ms=30.0)  # draft as slow as the target
    p = AdaptivePolicy(expensive, max_k=4, probe_every=5, early_stop=False)
    for _ in range(30):
        p.update(2, 0, [])
    ks = [p.choose_k() for _ in range(10)]
    assert ks.count(0) == 8 and ks[4] == ks[9] == 2  # plain steps, with a probe every 5th round


def test_calibration_learns_and_early_stop_uses_it():
    cal = Calibration(bins=10)
    for _ in range(200):
        cal.update([0.95, 0.15], accepted=1)  # confident token accepted, unsure one rejected
    assert cal.p(0.95) > 0.9 and cal.p(0.15) < 0.1
    p = AdaptivePolicy(COSTS, max_k=8, calibration=cal)
    for _ in range(20):
        p.update(4, 4, [])
    p.choose_k()
    assert p.continue_after(0, [0.95])  # confident: worth drafting on
    assert not p.continue_after(1, [0.95, 0.15])  # unsure: the next token will not pay
    assert not p.continue_after(7, [0.95] * 8)  # never past max_k
