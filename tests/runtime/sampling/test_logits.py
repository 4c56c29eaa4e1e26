"""Penalties, logit bias, min_tokens and logprobs (runtime/sampling/logits.py): hand-computed cases, then
the engine on the NumPy fake backend, where speculative output must equal target-only output
with the same settings — greedy token for token, sampling in distribution (chi-square), logprobs
number for number — for every drafter, fixed and adaptive k."""

from __future__ import annotations

import numpy as np
import pytest

from checks import assert_follows
from fakes import EOS, drive
from specrt.runtime.sampling.draws import SamplingConfig, probs
from specrt.runtime.sampling.logits import Penalties, apply_penalties, logprobs

MODES = [("model", False), ("ngram", False), ("auto", False), ("model", True), ("auto", True)]


def test_penalties_by_hand():
    rows = np.array([[1.0, -2.0, 3.0, 0.5], [1.0, -2.0, 3.0, 0.5], [1.0, -2.0, 3.0, 0.5]], dtype=np.float32)
    pen = Penalties(frequency=0.5, presence=0.25)
    # output [2, 2]; drafts [1, 2]: row 0 sees counts {2: 2}, row 1 {2: 2, 1: 1}, row 2 {2: 3, 1: 1}
    got = apply_penalties(rows, pen, prompt=[3], output=[2, 2], drafts=[1, 2], eos_ids=())
    want = rows.copy()
    want[0, 2] -= 0.5 * 2 + 0.25
    want[1, 2] -= 0.5 * 2 + 0.25
    want[1, 1] -= 0.5 * 1 + 0.25
    want[2, 2] -= 0.5 * 3 + 0.25
    want[2, 1] -= 0.5 * 1 + 0.25
    np.testing.assert_allclose(got, want)
    # repetition: prompt and output tokens; positive logits divided, negative multiplied
    got = apply_penalties(rows[:1], Penalties(repetition=2.0), prompt=[0], output=[1], drafts=[], eos_ids=())
    np.testing.assert_allclose(got, [[0.5, -4.0, 3.0, 0.5]])
    # bias and min_tokens: EOS (3) masked for the rows before min_tokens new tokens exist
    got = apply_penalties(rows, Penalties(logit_bias={0: -100.0, 1: 2.5}, min_tokens=2), prompt=[], output=[9],
                          drafts=[0, 0], eos_ids={3})
    assert got[0, 3] == -np.inf and got[1, 3] == 0.5 and got[2, 3] == 0.5
    np.testing.assert_allclose(got[:, :3], [[-99.0, 0.5, 3.0]] * 3)
    assert rows[0, 0] == 1.0  # the input is not touched


def test_penalty_settings_are_checked():
    for kw in ({"frequency": 2.5}, {"presence": float("nan")}, {"repetition": 0.0}, {"min_tokens": -1},
               {"logit_bias": {5: 101.0}}):
        with pytest.raises(ValueError):
            Penalties(**kw)
    assert not Penalties().active and Penalties(min_tokens=1).active
    with pytest.raises(ValueError, match="outside the vocabulary"):
        Penalties(logit_bias={40: 1.0}).check_vocab(32)


def test_logprobs_by_hand():
    row = np.log(np.array([[0.5, 0.25, 0.125, 0.125]]))
    (e,) = logprobs(row + 7.0, [2], 3)  # a shift changes nothing
    assert e.token == 2 and e.logprob == pytest.approx(np.log(0.125))
    assert [t for t, _ in e.top] == [0, 1, 2] and e.top[0][1] == pytest.approx(np.log(0.5))  # ties by index
    assert logprobs(row, [0], 0)[0].top == []


# --- the engine: speculative equals target-only with the same settings ------------------------

def reference(table, prompt, n, pen: Penalties, eos=()):
    """Target-only greedy with penalties straight from the fake's table."""
    seq, out = list(prompt), []
    for _ in range(n):
        row = apply_penalties(table.next_logits(seq)[None], pen, prompt, out, [], set(eos))[0]
        t = int(row.argmax())
        if t in eos:
            break
        seq.append(t)
        out.append(t)
    return out


REPETITIVE = [4, 9, 12, 4, 9, 12, 4, 9, 12, 4, 9, 12, 4, 9]
PEN = dict(frequency_penalty=0.8, presence_penalty=0.6, repetition_penalty=1.3, logit_bias={7: 3.0, 11: -5.0})


@pytest.mark.parametrize("draft,adaptive", MODES)
def test_penalties_under_speculation_equal_target_only(make, draft, adaptive):
    pipe = make(draft="self")
    table = pipe.parts.target.table
    pen = Penalties(0.8, 0.6, 1.3, {7: 3.0, 11: -5.0})
    for prompt in (REPETITIVE, [1, 5, 9, 7]):
        want = reference(table, prompt, 30, pen)
        plain = reference(table, prompt, 30, Penalties())
        assert want != plain  # the penalties change this output
        r = pipe.request(prompt, max_new_tokens=30, draft=draft, adaptive=adaptive, k=4, ignore_eos=True, **PEN)
        got = [t for c in pipe.submit(r) for t in c]
        assert got == want
        assert r.stats.draft_tokens > 0  # speculation ran (and was verified against penalized rows)


def test_min_tokens_holds_eos_back(make):
    pipe = make(draft="self", noise=0.0)
    prompt = [1, 5, 9, 7]
    free = reference(pipe.parts.target.table, prompt, 40, Penalties())
    i = next(i for i in range(2, 40) if free[i] not in free[:i])  # a token first chosen at step i
    eos = free[i]
    pipe.tokenizer.eog_ids = {eos}
    short = [t for c in pipe.stream_ids(prompt, max_new_tokens=40, k=4) for t in c]
    assert short == free[:i] and i < 10
    want = reference(pipe.parts.target.table, prompt, 40, Penalties(min_tokens=10), eos={eos})
    r = pipe.request(prompt, max_new_tokens=40, k=4, min_tokens=10)
    got = [t for c in pipe.submit(r) for t in c]
    assert got == want and len(got) >= 10 and eos not in got


@pytest.mark.parametrize("draft,adaptive", MODES)
def test_logprobs_are_the_target_only_numbers(make, draft, adaptive):
    pipe = make(draft="separate")
    prompt = [int(t) for t in np.random.default_rng(2).integers(3, 32, size=20)]
    runs = {}
    for d in ("none", draft):
        r = pipe.request(prompt, max_new_tokens=25, draft=d, adaptive=adaptive, k=4, ignore_eos=True, logprobs=5,
                         temperature=0.7, seed=3)
        toks = [t for c in pipe.submit(r) for t in c]
        runs[d] = (toks, r.token_logprobs, r.stats)
    (t0, lp0, _), (t1, lp1, st) = runs["none"], runs[draft]
    assert st.draft_tokens > 0 and len(lp1) == len(t1) == 25
    table = pipe.parts.target.table
    seq = list(prompt)
    for t, e in zip(t1, lp1, strict=True):  # every reported number is the target's at that position
        x = table.next_logits(seq).astype(np.float64)
        ls = x - x.max() - np.log(np.exp(x - x.max()).sum())
        assert e.token == t and e.logprob == pytest.approx(ls[t], abs=1e-6)
        assert [j for j, _ in e.top] == list(np.argsort(-ls, kind="stable")[:5])
        seq.append(t)
    assert len(lp0) == len(t0) and all(e.token == t for e, t in zip(lp0, t0, strict=True))


def test_logprobs_reach_the_result(make):
    pipe = make(draft="self")
    res = pipe.generate("w5 w9 w7", chat=False, max_new_tokens=6, logprobs=2, ignore_eos=True)
    assert len(res.logprobs) == len(res.token_ids) == 6 and all(len(e.top) == 2 for e in res.logprobs)
    assert pipe.generate("w5 w9 w7", chat=False, max_new_tokens=6).logprobs is None


@pytest.mark.parametrize("draft", ["model", "ngram"])
def test_penalized_sampling_follows_the_target_distribution(make, draft):
    """The second new token's distribution under penalties, over many seeds, is the penalized
    target's own: sum_x p1(x) p2(. | x) with each row penalized by the tokens before it."""
    pipe = make(draft="self", slots=64, noise=0.5, plan_batches=False)
    table = pipe.parts.target.table
    cfg = SamplingConfig(1.0)
    pen = Penalties(frequency=1.5, presence=1.0, logit_bias={5: 2.0})
    prompt = [1, 5, 9, 5, 9, 5, 9]

    def dist(out):
        return probs(apply_penalties(table.next_logits(prompt + out)[None], pen, prompt, out, [], set())[0], cfg)

    p1 = dist([])
    exact = sum(p1[x] * dist([int(x)]) for x in np.flatnonzero(p1))
    n = 1500
    reqs = [pipe.request(prompt, max_new_tokens=3, k=4, draft=draft, seed=s, ignore_eos=True, temperature=1.0,
                         frequency_penalty=1.5, presence_penalty=1.0, logit_bias={5: 2.0}) for s in range(n)]
    counts = np.bincount([out[1] for out in drive(pipe, reqs)], minlength=table.vocab)
    assert sum(r.stats.draft_tokens for r in reqs) > n // 5, "speculation barely ran"  # n-gram rounds: ~1 in 4
    assert_follows(counts, exact, n)
    # and the penalties moved the distribution: unpenalized sampling would fail the same test
    plain = sum(probs(table.next_logits(prompt)[None], cfg)[0][x] * probs(table.next_logits(prompt + [int(x)]), cfg)
                for x in range(table.vocab))
    assert np.abs(plain - exact).sum() > 0.1


def test_bad_settings_are_refused(make):
    pipe = make(draft="self")
    for kw in ({"frequency_penalty": 3.0}, {"logit_bias": {99: 1.0}}, {"logprobs": 21},
               {"min_tokens": 50, "max_new_tokens": 10}):
        with pytest.raises(ValueError):
            pipe.request([1, 5, 9], **{"max_new_tokens": 20, **kw})
    assert EOS not in REPETITIVE


@pytest.mark.parametrize("kind", ["self", "separate"])
def test_the_draft_proposes_from_the_penalized_distribution(make, kind):
    """A draft equal to the target, shaped by the same penalties over the tokens before each of
    its proposals, proposes exactly the penalized target's choices: every proposal is accepted
    (unshaped, the penalties would reject it wherever they move the argmax)."""
    pipe = make(draft=kind, noise=0.0)
    r = pipe.request(REPETITIVE, max_new_tokens=40, k=4, ignore_eos=True, **PEN)
    got = [t for c in pipe.submit(r) for t in c]
    assert got == reference(pipe.parts.target.table, REPETITIVE, 40, Penalties(0.8, 0.6, 1.3, {7: 3.0, 11: -5.0}))
    assert r.stats.draft_tokens > 20 and r.stats.acceptance_rate == 1.0


@pytest.mark.parametrize("draft", ["model", "ngram"])
def test_stop_strings_cut_ids_and_logprobs_as_target_only(make, draft):
    """A speculative round commits several tokens at once; the tokens after a stop string's end
    must not be counted or reported (ids, logprobs, hence usage), as target-only decoding would
    not have produced them."""
    pipe = make(draft="self", noise=0.0)
    full = pipe.generate("w5 w9 w11", max_new_tokens=12, draft="none", chat=False)
    stop = " " + full.text.split()[4]
    ref = pipe.generate("w5 w9 w11", max_new_tokens=12, draft="none", chat=False, stop=[stop], logprobs=1)
    got = pipe.generate("w5 w9 w11", max_new_tokens=12, draft=draft, k=4, chat=False, stop=[stop], logprobs=1)
    assert got.text == ref.text and got.token_ids == ref.token_ids and len(ref.token_ids) < 12
    assert [e.token for e in got.logprobs] == ref.token_ids
    assert got.stats.stop_reason == ref.stats.stop_reason == "stop"


def test_any_integer_seed_reproduces(make):
    """OpenAI's and vLLM's seeds may be negative; numpy's generators take non-negative ones."""
    pipe = make(draft="self")
    kw = dict(max_new_tokens=12, temperature=1.0, k=3, ignore_eos=True)
    a = [t for c in pipe.stream_ids([1, 5, 9], seed=-5, **kw) for t in c]
    assert a == [t for c in pipe.stream_ids([1, 5, 9], seed=-5, **kw) for t in c]
    assert len(pipe.choices("w5 w9", 2, chat=False, seed=-7, **kw)) == 2


def _dense_penalties(rows, pen, prompt, output, drafts):
    """The penalties over the whole vocabulary, row by row (the definition, no sparsity)."""
    out = rows.astype(np.float32).copy()
    ids = np.fromiter(pen.logit_bias.keys(), dtype=np.int64)
    out[:, ids] += np.fromiter(pen.logit_bias.values(), dtype=np.float32)
    V = rows.shape[1]
    for i in range(len(rows)):
        counts = np.bincount(np.concatenate((output, drafts[:i])).astype(np.int64), minlength=V).astype(np.float32)
        seen = np.isin(np.arange(V), prompt) | (counts > 0)
        row = out[i]
        row[seen] = np.where(row[seen] > 0, row[seen] / pen.repetition, row[seen] * pen.repetition)
        row -= pen.frequency * counts + pen.presence * (counts > 0)
    return out


def test_penalties_touch_only_seen_tokens_and_equal_the_dense_definition():
    """The sparse arithmetic (only seen ids) is bit for bit the dense definition."""
    g = np.random.default_rng(5)
    for _ in range(100):
        V, T = int(g.integers(5, 200)), int(g.integers(1, 8))
        rows = (g.normal(size=(T, V)) * 3).astype(np.float32)
        prompt, output = g.integers(0, V, size=int(g.integers(1, 20))), g.integers(0, V, size=int(g.integers(0, 20)))
        drafts = g.integers(0, V, size=T - 1)
        pen = Penalties(float(g.choice([0, 0.1, 0.7])), float(g.choice([0, 0.2, -1.1])), float(g.choice([1.0, 1.3, 0.8])),
                        {int(g.integers(V)): 2.5})
        assert np.array_equal(apply_penalties(rows, pen, prompt, output, drafts, ()),
                              _dense_penalties(rows, pen, prompt, output, drafts))
