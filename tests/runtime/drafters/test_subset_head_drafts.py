"""A draft whose LM head covers part of the vocabulary (export/vocab_subset.py: -inf logits
outside it) keeps speculation exact: greedy output is target-only's, sampled output follows the
target's distribution, and a row where the request's grammar leaves no subset token ends the
proposal there instead of proposing a token the draft gave no probability."""

from __future__ import annotations

import numpy as np
import pytest

from checks import assert_follows
from fakes import JSON_CHARS, constrained_reference, drive, reference_greedy
from specrt.runtime.sampling.draws import SamplingConfig, probs
from specrt.runtime.sampling.grammar import Constraint


def ids(text: str) -> list[int]:
    return [JSON_CHARS.index("\u0120" if c == " " else c) + 3 for c in text]


DIGITS = ids("0123456789")
NO_DIGITS = [t for t in range(3 + len(JSON_CHARS)) if t not in DIGITS]  # <unk> <s> </s>, punctuation, letters


@pytest.fixture
def make(make):
    return lambda **kw: make(json_tokens=True, draft="separate", noise=0.3, **kw)


@pytest.mark.parametrize("draft,adaptive", [("model", False), ("auto", False), ("model", True)])
def test_greedy_output_is_the_target_only_output(make, draft, adaptive):
    pipe = make(draft_vocab=NO_DIGITS)
    table = pipe.parts.target.table
    proposed = 0
    for prompt in ([1, 5, 9, 7], [1] + ids('{"a":1,"b":["cat"]} {"a":12')):
        r = pipe.request(prompt, max_new_tokens=40, k=4, draft=draft, adaptive=adaptive, ignore_eos=True)
        got = [t for c in pipe.submit(r) for t in c]
        assert got == reference_greedy(table, prompt, 40)
        proposed += r.stats.draft_tokens
    assert proposed > 0


def test_a_grammar_that_leaves_no_subset_token_ends_the_proposal(make):
    """Only digits are allowed and the draft has none: no token is proposed (before the drafter
    checked, greedy proposed token 0, which q gives no probability, and sampling divided by 0)."""
    pipe = make(draft_vocab=NO_DIGITS)
    c = Constraint.regex("[0-9]{6}")
    prompt = [1] + ids("123 456 ")
    want = constrained_reference(pipe, c, prompt, 10)
    r = pipe.request(prompt, max_new_tokens=10, k=4, draft="model", grammar=c)
    assert [t for c in pipe.submit(r) for t in c] == want
    assert r.stats.draft_tokens == 0
    outs = drive(pipe, [pipe.request(prompt, max_new_tokens=10, k=4, draft="model", grammar=c, seed=s,
                                     temperature=1.0) for s in range(20)])
    assert all(len(o) == len(want) and all(t in DIGITS for t in o[:6]) for o in outs)


def test_sampling_follows_the_target(make):
    """The second token over many seeds: sum_x p1(x) p2(. | x), while the draft proposes only
    from its half of the vocabulary."""
    half = list(range(0, 3 + len(JSON_CHARS), 2))
    pipe = make(draft_vocab=half, slots=64, plan_batches=False)
    table = pipe.parts.target.table
    assert np.isfinite(pipe.parts.draft.table.next_logits(prompt := [1] + ids('{"a":1,"b":'))).sum() == len(half)
    cfg = SamplingConfig(1.0)

    def dist(out):
        return probs(table.next_logits(prompt + out), cfg)

    p1 = dist([])
    exact = sum(p1[x] * dist([int(x)]) for x in np.flatnonzero(p1))
    n = 1500
    reqs = [pipe.request(prompt, max_new_tokens=3, k=3, draft="model", seed=s, temperature=1.0, ignore_eos=True)
            for s in range(n)]
    counts = np.bincount([out[1] for out in drive(pipe, reqs)], minlength=table.vocab)
    assert sum(r.stats.draft_tokens for r in reqs) >= n, "speculation barely ran"
    assert_follows(counts, exact, n)
