"""Grammar-constrained decoding under speculation (runtime/sampling/grammar.py, llguidance).

The matcher's contract on a real grammar engine, then the engine on the NumPy fake backend with a
tokenizer of JSON characters: constrained speculative output equals constrained target-only
output computed straight from the fake's table (greedy token for token, sampling by chi-square),
for every drafter, fixed and adaptive k; and it is valid JSON for its schema."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest

from checks import assert_follows
from fakes import EOS, JSON_CHARS, constrained_reference, drive
from specrt.runtime.sampling.draws import SamplingConfig, probs
from specrt.runtime.sampling.grammar import Constraint, GrammarError, apply_mask

MODES = [("none", False), ("model", False), ("ngram", False), ("auto", False), ("model", True), ("auto", True)]
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["a", "b"],
          "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                         "b": {"type": "array", "items": {"enum": ["cat", "bee", "sun"]}, "minItems": 1, "maxItems": 3},
                         "c": {"type": "boolean"}}}


@pytest.fixture
def make(make):
    """Fake pipelines with a tokenizer of JSON characters (a grammar engine must read its bytes)."""
    return lambda **kw: make(json_tokens=True, **kw)


def ids(text: str) -> list[int]:
    return [JSON_CHARS.index("\u0120" if c == " " else c) + 3 for c in text]


def text(tokens) -> str:
    return "".join(" " if JSON_CHARS[t - 3] == "\u0120" else JSON_CHARS[t - 3] for t in tokens)


def test_matcher_masks_drafts_then_leaves_the_state(make):
    pipe = make(draft=None)
    g = pipe.grammars
    m = g.matcher(g.compile(Constraint.json_schema(SCHEMA)))
    good = ids('{"a":7,"b":["cat"]}')
    assert m.valid_prefix(good) == len(good)
    assert m.valid_prefix(ids('{"a":7,"b"')) == 10 and m.valid_prefix(ids('{"a":7,"u"')) == 8  # cut where forbidden
    rows = m.masks(good[:5])
    for i in range(6):  # row i = what a fresh matcher allows after good[:i]
        ref = g.matcher(g.compile(Constraint.json_schema(SCHEMA)))
        ref.commit(good[:i])
        np.testing.assert_array_equal(rows[i], ref.masks()[0])
    np.testing.assert_array_equal(m.masks()[0], rows[0])  # drafts did not move the state
    for i in range(6):  # a draft in progress: one mask after good[:i], the state left as it was
        np.testing.assert_array_equal(m.mask_after(good[:i]), rows[i])
    np.testing.assert_array_equal(m.masks()[0], rows[0])
    m.commit(good)
    assert m.done and np.flatnonzero(m.masks()[0]).tolist() == [EOS]  # only EOS after a complete object
    with pytest.raises(GrammarError, match="refused"):
        m.commit(ids("u"))


def test_masks_reuse_a_drafts_masks_until_the_next_commit(make):
    """Verification's rows 0..k-1 are the states a model draft masked (mask_after): reused, they
    are the masks a fresh matcher fills; after a commit nothing of the round before is reused."""
    pipe = make(draft=None)
    g = pipe.grammars
    grammar = g.compile(Constraint.json_schema(SCHEMA))

    def fresh(tokens):
        ref = g.matcher(grammar)
        ref.commit(tokens)
        return ref.masks()[0]

    good = ids('{"a":7,"b":["cat"]}')
    m = g.matcher(grammar)
    for start in (0, 4):  # a round from the first state, then one after a commit
        d = good[start : start + 5]
        for j in range(3):  # the draft filled the masks after d[:0..2] only
            np.testing.assert_array_equal(m.mask_after(d[:j]), fresh(good[: start + j]))
        for n in (3, 2, 5):  # the last row missing (filled alone), every row known, rows missing (one call)
            rows = m.masks(d[:n])
            for i in range(n + 1):
                np.testing.assert_array_equal(rows[i], fresh(good[: start + i]))
        m.commit(good[start : start + 4])
    np.testing.assert_array_equal(m.masks()[0], fresh(good[:8]))


@pytest.mark.parametrize("bad,match", [
    (Constraint.regex("a(b"), "regex"),
    (Constraint.json_schema({"type": "object", "properties": {"a": {"$ref": "#/nope"}}}), "nope"),
    (Constraint.lark("start: undefined_rule"), "undefined_rule"),
])
def test_a_grammar_that_cannot_compile_says_why(make, bad, match):
    pipe = make(draft=None)
    with pytest.raises(GrammarError, match=match):
        pipe.request([1, 3, 4], max_new_tokens=10, grammar=bad)
    with pytest.raises(GrammarError):
        Constraint("yaml", "x")
    with pytest.raises(ValueError, match="ignore_eos"):
        pipe.request([1, 3, 4], max_new_tokens=10, grammar=Constraint.json_object(), ignore_eos=True)
    with pytest.raises(ValueError, match="min_tokens"):  # a complete grammar allows only EOS
        pipe.request([1, 3, 4], max_new_tokens=10, grammar=Constraint.json_object(), min_tokens=5)


@pytest.mark.parametrize("kind", ["self", "separate"])
@pytest.mark.parametrize("draft,adaptive", MODES)
def test_greedy_constrained_speculation_equals_constrained_target_only(make, kind, draft, adaptive):
    pipe = make(draft=kind, noise=0.4)
    drafted = 0
    for prompt in ([1, 5, 9, 7], [1] + ids('{"a":1,"b":["cat"]} {"a":1,"b":["cat"]}')):
        want = constrained_reference(pipe, Constraint.json_schema(SCHEMA), prompt, 60)
        r = pipe.request(prompt, max_new_tokens=60, k=4, draft=draft, adaptive=adaptive,
                         grammar=Constraint.json_schema(SCHEMA))
        got = [t for c in pipe.submit(r) for t in c]
        assert got == want, (text(got), text(want))
        jsonschema.validate(json.loads(text(got)), SCHEMA)  # a real validator
        assert r.stats.stop_reason == "eos"  # ended by the grammar, not by the token budget
        drafted += r.stats.draft_tokens
    assert drafted > 0 or draft == "none"


def test_a_grammar_whose_only_continuation_is_eos_ends_the_request(make):
    pipe = make(draft="self")
    r = pipe.request([1, 5], max_new_tokens=30, k=4, grammar=Constraint.choice(["bee", "sun"]))
    got = [t for c in pipe.submit(r) for t in c]
    assert text(got) in ("bee", "sun") and r.stats.stop_reason == "eos"
    res = pipe.generate("ab", chat=False, max_new_tokens=30, grammar=Constraint.regex("[0-9]{3}"))
    assert len(res.text) == 3 and res.text.isdigit() and res.stats.stop_reason == "eos"


@pytest.mark.parametrize("draft", ["model", "ngram"])
def test_constrained_sampling_follows_the_constrained_target(make, draft):
    """The second token's distribution over many seeds is the masked target's:
    sum_x p1(x) p2(. | x), each masked by the grammar after the tokens before it."""
    pipe = make(draft="self", slots=64, noise=0.5, plan_batches=False)
    table, g = pipe.parts.target.table, pipe.grammars
    cfg = SamplingConfig(1.0)
    c = Constraint.regex("[a-f][0-9a-u]+[0-9]")
    prompt = [1] + ids("a1b2c3e4f5 ")  # each first token's n-gram continuation is a grammar-valid digit

    def dist(out):
        m = g.matcher(g.compile(c))
        m.commit(out)
        return probs(apply_mask(table.next_logits(prompt + out)[None], m.masks())[0], cfg)

    p1 = dist([])
    exact = sum(p1[x] * dist([int(x)]) for x in np.flatnonzero(p1))
    n = 1200
    reqs = [pipe.request(prompt, max_new_tokens=4, k=3, draft=draft, seed=s, temperature=1.0, grammar=c)
            for s in range(n)]
    counts = np.bincount([out[1] for out in drive(pipe, reqs)], minlength=table.vocab)
    assert sum(r.stats.draft_tokens for r in reqs) > n // 4, "speculation barely ran"
    assert counts[exact == 0].sum() == 0  # nothing the grammar forbids
    assert_follows(counts, exact, n)


def test_a_grammar_that_fails_mid_run_ends_its_request_alone(make):
    """A matcher that raises (an engine bug, a resource limit) fails its own request; the others
    decoding beside it finish with their normal output."""
    pipe = make(draft="self", slots=3)
    prompt = [1] + ids('{"a":1,"b":["cat"]}')
    want = constrained_reference(pipe, Constraint.json_schema(SCHEMA), prompt, 40)
    reqs = [pipe.request(prompt, max_new_tokens=40, k=3, grammar=Constraint.json_schema(SCHEMA)) for _ in range(3)]
    calls = [0]
    broken = reqs[1].grammar
    real = broken.masks

    def masks(drafts=()):
        calls[0] += 1
        if calls[0] > 3:
            raise RuntimeError("matcher failed")
        return real(drafts)

    broken.masks = masks
    with pytest.raises(RuntimeError, match="matcher failed"):
        drive(pipe, reqs)
    assert reqs[1].stats.stop_reason == "error"
    for r in (reqs[0], reqs[2]):
        while r.state != "done":
            pipe.scheduler.step()
    for r in (reqs[0], reqs[2]):
        assert r.seq[len(prompt):] == want and r.stats.stop_reason in ("eos", "length")
