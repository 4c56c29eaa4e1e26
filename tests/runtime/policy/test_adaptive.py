"""Adaptive k and confidence early stop: decisions follow the cost model."""

from types import SimpleNamespace

import pytest

from specrt.runtime.policy.adaptive import AcceptanceModel, AdaptivePolicy, Calibration, Costs
from specrt.runtime.policy.store import PolicyStore
from specrt.runtime.sampling.draws import SamplingConfig

COSTS = Costs({1: 30.0, 2: 31.0, 3: 32.0, 5: 34.0, 9: 42.0, 17: 48.0}, draft_ms=3.0)  # c = 0.1


def test_costs_interpolate():
    assert COSTS.c == pytest.approx(0.1)
    assert COSTS.v(4) == pytest.approx(33.0 / 30.0)


def test_expected_tokens_per_position():
    m = AcceptanceModel(4, prior=0.5, weight=1e-9)
    m.ok[:] = [9, 4, 1, 0]
    m.tried[:] = [10, 8, 4, 2]  # rates .9 .5 .25 0
    assert m.expected()[0] == 1
    assert m.expected()[3] == pytest.approx(1 + 0.9 + 0.45 + 0.1125)


def test_choose_k_tracks_acceptance():
    p = AdaptivePolicy(COSTS, max_k=8)
    for _ in range(40):
        p.update(8, 8, [])  # everything accepted: long drafts pay
    assert p.choose_k() == 8
    q = AdaptivePolicy(COSTS, max_k=8)
    for _ in range(40):
        q.update(4, 1, [])  # second position always rejected
    assert q.choose_k() in (1, 2)


def test_falls_back_to_target_steps_and_reprobes():
    expensive = Costs(COSTS.target_ms, draft_ms=30.0)  # draft as slow as the target
    p = AdaptivePolicy(expensive, max_k=4, probe_every=5)
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


def test_early_stop_with_an_expensive_accurate_draft():
    """c = 0.45 and every token accepted so far (an int8 self-draft). A confidence bin without
    data must fall back to the position's acceptance rate: a fixed 0.5 prior stopped every round
    after one token (0.5 * a_1 < rate * cost). A bin that has learned "usually rejected" stops."""
    costs = Costs({1: 30.0, 2: 30.5, 3: 31.0, 5: 32.0, 9: 40.0, 17: 46.0}, draft_ms=13.5)
    p = AdaptivePolicy(costs, max_k=16, calibration=Calibration(bins=10))
    for _ in range(60):
        p.update(6, 6, [])
    assert p.choose_k() >= 4
    assert 0.5 * p.acc.rates()[1] < p.rate * (costs.draft_ms + costs.verify_ms(3) - costs.verify_ms(2))
    assert p.continue_after(0, [0.55]) and p.continue_after(1, [0.55, 0.35])
    for _ in range(200):
        p.cal.update([0.55, 0.05], accepted=1)  # very low confidence: rejected
    assert not p.continue_after(1, [0.55, 0.05])


def test_observed_call_times_rescale_every_width():
    costs = Costs({1: 30.0, 5: 36.0, 17: 60.0}, draft_ms=10.0)
    for _ in range(100):
        costs.observe(4, 40.0, 72.0)  # the machine got 2x slower; only T = 5 is observed
    assert costs.verify_ms(5) == pytest.approx(72.0, rel=1e-3)
    assert costs.verify_ms(17) == pytest.approx(120.0, rel=1e-3)  # followed without being observed
    assert costs.draft_ms == pytest.approx(10.0)
    assert costs.v(17) == pytest.approx(2.0)


def _store(base: Costs, monkeypatch) -> PolicyStore:
    """A PolicyStore over stand-in parts whose cost probe returns `base` (no models, no cache)."""
    from specrt.runtime.backends.kvpool import KVPool
    from specrt.runtime.bundle.manifest import KVLayout
    from specrt.runtime.policy import store as policies

    pool = KVPool(KVLayout(layers=1, kv_heads=1, head_dim=1, dtype="float32", max_seq_len=8), 1, allocate=False)
    model = dict(pool=pool, max_tokens=0, graph=None, kernels=False)  # what the store reads of a PoolModel
    parts = SimpleNamespace(draft=SimpleNamespace(**model), target=SimpleNamespace(**model),
                            manifest=SimpleNamespace(draft=None))
    monkeypatch.setattr(policies, "measure_costs", lambda *a, **k: base)
    return PolicyStore(parts, 8, threads=None, device="cpu", global_pool=False, hugepages=False, cost_cache=False)


def test_auto_request_learns_each_route_apart(monkeypatch):
    """auto: n-gram rounds (free, long exact copies) and model rounds (costly, short) must not
    share one acceptance model, or k is chosen for neither. A request gets one policy per route;
    what they learn is the prior of later requests (model rounds shared with `model` requests,
    n-gram copies of `auto` apart from an `ngram` request's, greedy apart from sampling)."""
    store = _store(Costs(COSTS.target_ms, draft_ms=15.0), monkeypatch)
    greedy, sampled = SamplingConfig(0.0), SamplingConfig(1.0)
    pols = store.policies(SimpleNamespace(draft="auto", cfg=greedy))
    assert set(pols) == {"ngram", "model"}
    for _ in range(40):
        pols["ngram"].update(8, 8, [])  # copies always accepted
        pols["model"].update(4, 0, [])  # the model always rejected
    assert pols["ngram"].choose_k() == 8 and pols["ngram"].costs.draft_ms < 1  # a lookup is next to free
    assert pols["model"].choose_k() == 0 and pols["model"].costs.draft_ms == 15.0
    # the next auto request starts from what this one learned, with costs of its own
    again = store.policies(SimpleNamespace(draft="auto", cfg=greedy))
    assert again["ngram"].acc is pols["ngram"].acc and again["model"].acc is pols["model"].acc
    assert again["model"].costs is not pols["model"].costs
    assert again["ngram"].choose_k() == 8 and again["model"].choose_k() == 0
    assert store.policies(SimpleNamespace(draft="model", cfg=greedy))["model"].acc is pols["model"].acc
    ngram = store.policies(SimpleNamespace(draft="ngram", cfg=greedy))
    assert set(ngram) == {"ngram"} and ngram["ngram"].acc is not pols["ngram"].acc
    assert store.policies(SimpleNamespace(draft="auto", cfg=sampled))["model"].acc is not pols["model"].acc


def test_a_draft_models_first_rounds_start_from_its_measured_agreement(monkeypatch):
    """Before any round, a draft model's acceptance prior is the agreement its export measured
    (parity.greedy_agreement_with_target), clipped to PRIOR_RANGE; n-gram lookups and bundles
    without the figure keep the default. With the costs below, the default prior (0.6) and one
    rejected first token leave a plain round next; the coder's measured 0.75 keeps drafting."""
    from specrt.runtime.policy.adaptive import AcceptanceModel
    from specrt.runtime.policy.store import PRIOR_RANGE

    costs = Costs({1: 100.0, 2: 113.0, 3: 126.0, 4: 139.0, 5: 152.0}, draft_ms=40.0)  # k = 1 pays from a_0 0.53
    greedy = SamplingConfig(0.0)
    k_after_a_rejection = {}
    for agreement, want in ((None, AcceptanceModel.prior), (0.75, 0.75), (0.999, PRIOR_RANGE[1]), (0.0, PRIOR_RANGE[0])):
        store = _store(costs, monkeypatch)
        if agreement is not None:
            store.parts.manifest = SimpleNamespace(draft=SimpleNamespace(parity={"greedy_agreement_with_target": agreement}))
        pols = store.policies(SimpleNamespace(draft="auto", cfg=greedy))
        assert pols["model"].acc.prior == pytest.approx(want)
        assert pols["ngram"].acc.prior == AcceptanceModel.prior
        pols["model"].update(1, 0, [])
        k_after_a_rejection[agreement] = pols["model"].choose_k()
    assert k_after_a_rejection[None] == 0 and k_after_a_rejection[0.75] > 0


def test_auto_drafter_routes_before_k_and_keeps_the_route():
    import numpy as np

    from specrt.runtime.drafters import AutoDrafter, DraftCall, NgramDrafter, Proposal

    class Model:  # a model drafter that proposes 7s after one draft call
        name = "model"

        def __init__(self):
            self.commits = []

        def start(self, seq, k, cfg, rng, policy=None):
            self.k = k
            return DraftCall(np.array([seq[-1]], dtype=np.int64), keep=1)

        def take(self, logits, hidden=None):
            return Proposal(np.full(self.k, 7, dtype=np.int64), None, [], "model")

        def commit(self, seq_len):
            self.commits.append(seq_len)

    model = Model()
    auto = AutoDrafter(model, NgramDrafter(max_proposal=8))
    seq = [1, 5, 9, 33, 2, 5, 9]  # "5 9" seen before: continues with 33 2 5 9
    assert auto.route(seq) == "ngram"
    out = auto.start(seq, 3, None, None)
    assert isinstance(out, Proposal) and out.drafter == "ngram" and out.tokens.tolist() == [33, 2, 5]
    assert auto.route([1, 2, 3]) == "model"
    call = auto.start([1, 2, 3], 2, None, None)
    assert isinstance(call, DraftCall)  # the model's call, run by the scheduler
    out = auto.take(np.zeros(4, np.float32))
    assert out.drafter == "model" and out.tokens.tolist() == [7, 7]
    auto.commit(5)
    assert model.commits == [5]  # the model's cache follows every commit, n-gram rounds included
    # a continuation shorter than min_match is not worth verifying instead of the model's
    assert auto.route([3, 5, 5]) == "model"  # "5" seen before, continues with just [5]
    assert isinstance(auto.start([3, 5, 5], 4, None, None), DraftCall)
    # the route decided before k is the one start() uses, even where k cuts the copy short
    seq = [1, 5, 9, 33, 2, 5, 9]
    assert auto.route(seq) == "ngram"
    assert auto.start(seq, 1, None, None).tokens.tolist() == [33]
    # without route() first, start() routes by itself
    assert auto.start(seq, 2, None, None).tokens.tolist() == [33, 2]
