"""A target whose one-token calls compute other numbers than its wider calls (an int8-activation
graph: runtime/backends/ort.py `numerics_min_t`) never runs a one-token call: its decode steps,
prompt chunks and cache-hit remainders are widened (runtime/engine/calls.py `ModelCalls._widen`),
so target-only decoding and speculation read the same rows and stay equal token for token.

The fake target adds noise to every one-token call (`one_token_skew`); its wide rows are the
table's, so every output must be `reference_greedy`'s. A target that does not declare it
(`min_t=1`) shows the skew is real: its target-only output is another one."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from fakes import drive, reference_greedy, run_request
from specrt.runtime.engine.calls import ModelCalls

SKEW = 3.0
MODES = [("none", False), ("model", False), ("ngram", False), ("auto", False), ("model", True), ("auto", True)]
PROMPTS = [[1, 5, 9, 7], [4, 4, 4, 9, 12, 30, 6, 4, 4, 4, 9], [7],
           [int(t) for t in np.random.default_rng(1).integers(3, 32, size=40)]]


def _target_widths(pipe) -> set[tuple[str, int, int]]:
    return {(kind, t, rows) for kind, _, t, rows in pipe.parts.target.calls}


@pytest.mark.parametrize("kind", ["self", "separate"])
@pytest.mark.parametrize("draft,adaptive", MODES)
def test_greedy_output_is_the_wide_rows_whatever_the_drafter(make, kind, draft, adaptive):
    pipe = make(draft=kind, noise=0.5, one_token_skew=SKEW)
    table = pipe.parts.target.table
    for prompt in PROMPTS:
        want = reference_greedy(table, prompt, 20)
        for _ in range(2):  # the repeat finds the prompt cached: one token left to prefill
            got, _ = run_request(pipe, prompt, max_new_tokens=20, ignore_eos=True, draft=draft, adaptive=adaptive, k=3)
            assert got == want, (prompt, draft, adaptive)
    widths = _target_widths(pipe)
    assert widths and all(kind == "run" and t >= 2 for kind, t, _ in widths), widths


def test_a_target_that_does_not_declare_it_gives_another_output(make):
    """The test above can fail: with the skew undeclared, target-only decoding runs one-token
    calls and leaves the table's greedy path."""
    pipe = make(draft="self", one_token_skew=SKEW, min_t=1)
    table = pipe.parts.target.table
    outs = [run_request(pipe, p, max_new_tokens=20, ignore_eos=True, draft="none")[0] for p in PROMPTS]
    assert any(o != reference_greedy(table, p, 20) for o, p in zip(outs, PROMPTS, strict=True))


@pytest.mark.parametrize("draft,adaptive", [("model", False), ("auto", True)])
def test_seeded_sampling_equals_target_only(make, draft, adaptive):
    pipe = make(draft="self", noise=0.5, one_token_skew=SKEW)
    for i, prompt in enumerate(PROMPTS):
        want, _ = run_request(pipe, prompt, max_new_tokens=20, ignore_eos=True, seed=3 + i, temperature=0.9,
                              draft="none")
        got, _ = run_request(pipe, prompt, max_new_tokens=20, ignore_eos=True, seed=3 + i, temperature=0.9,
                             draft=draft, adaptive=adaptive, k=3)
        assert got == want


def test_requests_at_once_never_share_a_one_token_batched_call(make):
    pipe = make(draft="self", slots=4, noise=0.5, one_token_skew=SKEW)
    table = pipe.parts.target.table
    g = np.random.default_rng(5)
    prompts = [[int(t) for t in g.integers(3, 32, size=int(g.integers(1, 20)))] for _ in range(8)]
    reqs = [pipe.request(p, max_new_tokens=16, ignore_eos=True, k=3, draft=MODES[i % len(MODES)][0],
                         adaptive=MODES[i % len(MODES)][1]) for i, p in enumerate(prompts)]
    assert drive(pipe, reqs) == [reference_greedy(table, p, 16) for p in prompts]
    assert all(kind == "run" and t >= 2 for kind, t, _ in _target_widths(pipe))


def test_the_last_rows_of_the_buffer_widen_backwards(make):
    """Decoding up to S_max: the last one-token steps have no row after them for a filler, so the
    row before is recomputed instead."""
    pipe = make(draft=None, one_token_skew=SKEW)
    S = pipe.parts.target.max_seq_len
    prompt = [int(t) for t in np.random.default_rng(2).integers(3, 32, size=S - 6)]
    got, _ = run_request(pipe, prompt, max_new_tokens=6, ignore_eos=True, draft="none")
    assert got == reference_greedy(pipe.parts.target.table, prompt, 6)


def test_widen_places_the_call(make):
    pipe = make(draft=None, one_token_skew=SKEW)
    target = pipe.parts.target
    r = SimpleNamespace(seq=[5, 6, 7, 8])  # _widen reads the request's sequence only
    tok = np.array([8], dtype=np.int64)
    start, ids, before = ModelCalls._widen(target, r, tok, 3)
    assert (start, ids.tolist(), before) == (3, [8, 8], 0)  # forward: a filler after
    S = target.max_seq_len
    r.seq = list(range(3, 3 + S))
    start, ids, before = ModelCalls._widen(target, r, tok, S - 1)
    assert (start, ids.tolist(), before) == (S - 2, [r.seq[S - 2], 8], 1)  # backward at the end


def test_the_cost_probe_prices_a_plain_row_as_its_widened_call(make):
    from specrt.runtime.policy.adaptive import measure_costs

    pipe = make(draft="self", slots=4, one_token_skew=SKEW)
    target, draft = pipe.parts.target, pipe.parts.draft
    before = len(target.calls)
    costs = measure_costs(target, draft, slot=3, max_t=target.max_t, rows=4, reps=2)
    assert costs.target_ms[1] == costs.target_ms[2]
    assert set(costs.rows_ms) == {1}  # no batched one-token rows: plain rows run one by one
    assert costs.target_rows_ms(3) == pytest.approx(3 * costs.target_ms[2])
    assert not [c for c in target.calls[before:] if c[0] == "rows"]
