"""Costs at a request's length (issue 38): the probe prices attention's growth with context, and
the per-request policy and the batch plan use the cost at each row's own length, so drafting
stops where verification over a long context does not pay and goes on where it does."""

from __future__ import annotations

import time

import numpy as np
import pytest

from fakes import drive, fake_parts, fake_pipeline
from specrt.runtime.policy.adaptive import AdaptivePolicy, Costs, measure_costs
from specrt.runtime.policy.plan import Row, plan, step_ms

# a plain step 10 ms; a 9-token verification 12 ms at the probe's 16 positions, +0.1 ms per
# position beyond (a plain step +0.002): drafting pays short, not at a few hundred positions
STEEP = Costs({1: 10.0, 2: 10.3, 5: 11.0, 9: 12.0}, draft_ms=0.5, rows_ms={1: 10.0, 2: 10.5, 4: 11.5},
              context=16, slope={1: 0.002, 2: 0.05, 5: 0.08, 9: 0.1})


def _learned(costs, rate=0.7, max_k=8):
    p = AdaptivePolicy(costs, max_k=max_k)
    for _ in range(40):
        p.update(4, int(4 * rate), [])
    return p


def test_costs_grow_with_context_past_the_probe():
    assert STEEP.verify_ms(9, 16) == STEEP.verify_ms(9) == 12.0
    assert STEEP.verify_ms(9, 8) == 12.0  # below the probe's context: as probed
    assert STEEP.verify_ms(9, 116) == pytest.approx(12.0 + 100 * 0.1)
    assert STEEP.verify_curve(9, 116)[8] == pytest.approx(STEEP.verify_ms(9, 116))
    assert STEEP.target_rows_ms(2, [116, 16]) == pytest.approx(10.5 + 100 * 0.002)


def test_the_policy_stops_drafting_where_verification_over_the_context_does_not_pay():
    p = _learned(STEEP)
    assert p.choose_k(20) > 0
    assert p.choose_k(400) == 0
    assert p.choose_k(20) > 0  # and resumes where it pays


def test_a_windowed_draft_step_stays_cheap_at_any_length():
    c = Costs({1: 10.0, 5: 11.0}, draft_ms=1.0, context=16, draft_slope=0.01)
    assert c.draft_extra_ms(1016) == pytest.approx(10.0)
    c.draft_window = 116
    assert c.draft_extra_ms(1016) == pytest.approx(1.0)


def test_a_long_request_does_not_read_as_a_loaded_machine():
    c = Costs(dict(STEEP.target_ms), 0.5, context=16, slope=dict(STEEP.slope))
    c.observe(4, 2.0, c.verify_ms(5, 300), context=300)  # exactly as priced at its length
    assert c.scale == pytest.approx(1.0)


def test_the_batch_plan_prices_each_row_at_its_own_length():
    # plain rows batch for nothing here (a target that runs each row alone): drafting pays short
    alone = Costs(dict(STEEP.target_ms), 0.5, rows_ms={1: 10.0, 2: 20.0}, context=16, slope=dict(STEEP.slope))
    e = np.array([1.0, 1.7, 2.2, 2.5, 2.7])
    short, long = Row(4, e, context=20), Row(4, e, context=600)
    ks = plan([short, long], alone)
    assert ks[0] > 0 and ks[1] == 0
    assert plan([short, Row(4, e, context=20)], alone) == [ks[0]] * 2
    assert step_ms([short, long], [0, 0], alone) == pytest.approx(alone.target_rows_ms(2, [20, 600]))
    assert step_ms([short, long], ks, alone) == pytest.approx(
        alone.verify_ms(ks[0] + 1, 20) + ks[0] * 0.5 + alone.target_rows_ms(1, [600]))


def test_the_batch_plan_charges_a_rows_catching_up_over_its_tokens_left():
    """Eight rows where drafting gains a few percent of the step: a draft that must first read
    ~100 prompt tokens (2.9 ms each) for 128 tokens left does not draft; the same rows caught up
    do; a row with thousands of tokens left pays its reading and drafts."""
    costs = Costs({1: 82.0, 2: 82.0, 3: 97.0, 5: 118.0, 9: 165.0, 17: 250.0}, draft_ms=17.0,
                  rows_ms={1: 82.0, 2: 82.0, 4: 110.0, 8: 165.0},
                  draft_rows_ms={1: 17.0, 2: 20.5, 4: 28.0, 8: 43.0}, draft_read_ms=2.9, packed=True)
    e = np.array([1.0, 1.9, 2.7, 3.4])
    caught_up = [Row(3, e, context=100) for _ in range(8)]
    assert any(plan(caught_up, costs))
    reading = [Row(3, e, context=100, read_per_token=costs.read_ms(100) / 128) for _ in range(8)]
    assert plan(reading, costs) == [0] * 8
    long = [Row(3, e, context=100, read_per_token=costs.read_ms(100) / 20000) for _ in range(8)]
    assert any(plan(long, costs))


class _Drafter:
    def __init__(self, lag):
        self._lag = lag

    def route(self, seq):
        return "model"

    def lag(self, seq):
        return self._lag


class _Row:
    """What `Planner.choose_ks` reads of a request: its drafter, route policies, length, tokens left."""

    def __init__(self, costs, lag, remaining=128):
        self.drafter, self.seq, self.remaining, self.k, self.route = _Drafter(lag), list(range(100)), remaining, 3, None
        self.policies = {"model": _learned(costs, rate=0.85, max_k=3)}


def test_a_row_starts_catching_up_only_if_drafting_pays_beside_the_requests_still_reading():
    """One row decodes while seven requests read their prompts: alone, reading its 100-token
    prompt into the draft pays over 128 tokens; beside seven more rows, where it will spend them,
    it does not. A row already caught up keeps its own choice."""
    from specrt.runtime.policy.plan import Planner

    costs = Costs({1: 82.0, 2: 82.0, 3: 97.0, 5: 118.0, 9: 165.0, 17: 250.0}, draft_ms=17.0,
                  rows_ms={1: 82.0, 2: 82.0, 4: 110.0, 8: 165.0},
                  draft_rows_ms={1: 17.0, 2: 20.5, 4: 28.0, 8: 43.0}, draft_read_ms=2.9, packed=True)
    assert Planner().choose_ks([_Row(costs, lag=100)], costs, running=1).ks[0] > 0
    assert Planner().choose_ks([_Row(costs, lag=100)], costs, running=8).ks == [0]
    assert Planner().choose_ks([_Row(costs, lag=100), _Row(costs, lag=100)], costs, running=8).ks == [0, 0]
    assert Planner().choose_ks([_Row(costs, lag=0)], costs, running=8).ks[0] > 0


class Clock:
    """Virtual time for the probe (`perf_counter` is all it reads): a fake model's call advances
    it by exactly its cost, so the measured costs do not depend on how busy the host is."""

    def __init__(self):
        self.t = 0.0

    def perf_counter(self) -> float:
        return self.t


class Slow:
    """A fake model whose calls take longer the more context they attend to (and a verification
    call more than a plain step), as attention does: 1 ms + 0.02 ms per position per token past 1
    (on `clock` when given, else slept)."""

    def __init__(self, model, clock: Clock | None = None):
        self.model, self.clock = model, clock

    def __getattr__(self, name):
        return getattr(self.model, name)

    def run(self, slot, tokens, past_len, hidden=None, keep=None):
        ms = 1.0 + 0.02 * past_len * (len(tokens) - 1)
        if self.clock is not None:
            self.clock.t += ms / 1000
        else:
            time.sleep(ms / 1000)
        return self.model.run(slot, tokens, past_len, hidden, keep)


def test_the_probe_measures_the_growth_and_the_policy_follows_it(tmp_path, monkeypatch):
    from specrt.runtime.policy import adaptive

    parts = fake_parts(tmp_path, draft="separate", slots=2)
    clock = Clock()
    monkeypatch.setattr(adaptive, "time", clock)
    costs = measure_costs(Slow(parts.target, clock), parts.draft, 0, 9, reps=3, context=16, far=240)
    assert costs.context == 16
    assert costs.slope[9] > costs.slope[1] >= 0  # measured, not told
    p = _learned(costs)
    assert p.choose_k(20) > 0 and p.choose_k(230) == 0


def test_a_long_prompt_is_decoded_plain_and_a_short_one_drafts(tmp_path):
    # the fake's draft agrees with its target nearly always: drafting pays until verification
    # over the context costs several plain steps
    steeper = Costs(dict(STEEP.target_ms), 0.5, rows_ms=dict(STEEP.rows_ms), context=16,
                    slope={1: 0.002, 2: 0.5, 5: 0.5, 9: 0.6})
    short, long = _short_then_long(tmp_path, draft="self", costs=steeper)
    assert sum(short.stats.k_history) > 0
    ks = long.stats.k_history  # plain steps, but for the policy's probe round (k = 2) every 8th
    assert set(ks) <= {0, 2} and ks.count(0) >= 7, ks


def _short_then_long(tmp_path, **kw):
    """A 10-token prompt, then a 200-token one, each alone through a two-slot fake pipeline,
    adaptive, 12 new tokens. -> the two finished requests."""
    pipe = fake_pipeline(tmp_path, slots=2, **kw)
    try:
        short = pipe.request(list(range(5, 15)), max_new_tokens=12, draft="model", adaptive=True, ignore_eos=True)
        long = pipe.request([int(t) for t in np.arange(200) % 20 + 5], max_new_tokens=12, draft="model", adaptive=True,
                            ignore_eos=True)
        drive(pipe, [short])
        drive(pipe, [long])
        return short, long
    finally:
        pipe.close()


# catching up (module docstring of runtime/policy/adaptive.py, "Catching up"): a plain step 10 ms,
# drafting at 0.7 acceptance roughly doubles the rate; reading a committed token costs 1 ms
READS = Costs({1: 10.0, 2: 10.3, 5: 11.0, 9: 12.0}, draft_ms=0.5, context=16, draft_read_ms=1.0)


def test_reading_a_lag_is_priced_against_the_tokens_left_to_save_on():
    p = _learned(READS)
    assert p.choose_k(20) > 0
    # what a drafting round saves a token here: 1/R(0) - 1/R(k) ~ 10 - 4.6 ms; 256 tokens of
    # reading (254 ms) pay over 100 tokens (~540 ms saved), not over 10 (~54 ms)
    assert _learned(READS).choose_k(20, lag=256, remaining=100) > 0
    assert _learned(READS).choose_k(20, lag=256, remaining=10) == 0
    # a normal round's catch-up (one or two tokens) is part of its draft step: never priced
    assert _learned(READS).choose_k(20, lag=2, remaining=1) > 0
    # remaining unknown: not priced
    assert _learned(READS).choose_k(20, lag=256) > 0


def test_a_probe_round_waits_while_its_reading_is_dear():
    # acceptance 0: plain rounds; every `probe_every` of them a probe round (k = 2)
    def plain_policy():
        p = AdaptivePolicy(Costs(dict(READS.target_ms), draft_ms=2.0, context=16, draft_read_ms=1.0), max_k=8,
                           probe_every=4)
        for _ in range(40):
            p.update(4, 0, [])
        return p

    cheap, dear = plain_policy(), plain_policy()
    assert [cheap.choose_k(20, lag=3, remaining=1000) for _ in range(4)] == [0, 0, 0, 2]
    # 256 tokens of reading (254 ms) against 5% of 100 plain tokens (50 ms): no probe
    assert [dear.choose_k(20, lag=256, remaining=100) for _ in range(8)] == [0] * 8
    assert dear.choose_k(20, lag=256, remaining=10_000) == 2  # where it is cheap against what is left


class SlowRead(Slow):
    """A fake draft whose calls take 0.5 ms + 0.2 ms per token past the first."""

    def run(self, slot, tokens, past_len, hidden=None, keep=None):
        time.sleep((0.5 + 0.2 * (len(tokens) - 1)) / 1000)
        return self.model.run(slot, tokens, past_len, hidden, keep)


def test_the_probe_prices_a_separate_drafts_reading(tmp_path):
    parts = fake_parts(tmp_path, draft="separate", slots=2, max_prefill_t=64)
    costs = measure_costs(parts.target, SlowRead(parts.draft), 0, 9, reps=3, context=16)
    assert 0.15 <= costs.draft_read_ms <= 1.0  # 0.2 ms a token, measured (sleeps only run long)
    shared = fake_parts(tmp_path / "s", draft="self", slots=2, max_prefill_t=64)
    assert measure_costs(shared.target, SlowRead(shared.draft), 0, 9, reps=2, context=16).draft_read_ms == 0.0


def test_a_long_prompt_whose_reading_would_not_pay_is_decoded_plain(tmp_path):
    # a separate draft reads a 200-token prompt's last 200 (window 256) at 2 ms a token: 396 ms,
    # against ~5 ms saved on each of 12 tokens; a 10-token prompt's 16 ms pays
    reads = Costs({1: 10.0, 2: 10.2, 5: 10.8, 9: 11.6}, draft_ms=0.5, rows_ms={1: 10.0, 2: 10.5}, draft_read_ms=2.0)
    short, long = _short_then_long(tmp_path, draft="separate", costs=reads)
    assert sum(short.stats.k_history) > 0
    assert set(long.stats.k_history) == {0}, long.stats.k_history
    assert long.stats.draft_prefill_ms == 0  # the draft never read the prompt


class Blocky(Slow):
    """A fake target whose calls cost 10 ms a block of 16 rows plus 0.1 ms a row, as the AMX form
    passes over the weights once a block of 16 rows (on `clock`)."""

    def run(self, slot, tokens, past_len, hidden=None, keep=None):
        self.clock.t += (10.0 * -(-len(tokens) // 16) + 0.1 * len(tokens)) / 1000
        return self.model.run(slot, tokens, past_len, hidden, keep)


def test_the_probe_prices_the_last_width_before_the_next_block_of_rows(tmp_path, monkeypatch):
    """A 16-row call is priced as measured (11.6 ms), not on the line from 9 rows (10.9 ms) to 17
    (21.7 ms): 20.35 at 16, which made 4 requests at k = 3 (16 rows) look dearer than they are."""
    from specrt.runtime.policy import adaptive

    parts = fake_parts(tmp_path, draft="separate", slots=2, max_t=17, max_prefill_t=17)
    clock = Clock()
    monkeypatch.setattr(adaptive, "time", clock)
    costs = measure_costs(Blocky(parts.target, clock), parts.draft, 0, 17, reps=3, context=16)
    assert costs.verify_ms(16) == pytest.approx(11.6)
    assert costs.verify_ms(17) == pytest.approx(21.7)
    assert costs.verify_curve(17)[15] == pytest.approx(11.6)
