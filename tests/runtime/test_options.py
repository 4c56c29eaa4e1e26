"""RequestOptions and LoadOptions (runtime/options.py): what each checks alone and the option
each refusal names, the forms RequestOptions normalises, and the pipeline taking either in place
of keyword arguments."""

from __future__ import annotations

import dataclasses

import pytest

from fakes import VOCAB, fake_parts, fake_pipeline
from specrt.runtime import InvalidRequest, InvalidSampling, RequestOptions
from specrt.runtime.backends.kvpool import ContextOverflow
from specrt.runtime.options import LoadOptions, default_draft, load_options, request_options
from specrt.runtime.sampling.grammar import Constraint


@pytest.mark.parametrize("kw,param", [
    ({"timeout_s": 0}, "timeout_s"),
    ({"logprobs": 21}, "logprobs"),
    ({"logprobs": -1}, "logprobs"),
    ({"frequency_penalty": 2.5}, "frequency_penalty"),
    ({"presence_penalty": -3}, "presence_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"logit_bias": {5: 101}}, "logit_bias"),
    ({"min_tokens": -1}, "min_tokens"),
    ({"min_tokens": 4, "max_new_tokens": 3}, "min_tokens"),
    ({"temperature": -1}, "temperature"),
    ({"top_k": -1}, "top_k"),
    ({"top_p": 0}, "top_p"),
    ({"grammar": Constraint.regex("a+"), "ignore_eos": True}, "ignore_eos"),
    ({"grammar": Constraint.regex("a+"), "min_tokens": 1}, "min_tokens"),
    ({"max_new_tokens": 0}, "max_new_tokens"),
])
def test_refusals_name_their_option(kw, param):
    with pytest.raises(InvalidRequest) as e:
        RequestOptions(**kw)
    assert e.value.param == param and isinstance(e.value, ValueError)
    if param in ("temperature", "top_k", "top_p"):
        assert isinstance(e.value, InvalidSampling)  # the sampling module's own error, with its param


def test_normal_forms_and_frozen():
    o = RequestOptions(stop=["", "x", "END"], logit_bias={7: -100})
    assert o.stop == ("x", "END") and o.logit_bias == {7: -100}
    assert RequestOptions(stop="END").stop == ("END",)  # one string is one stop string
    assert RequestOptions(stop=None).stop == ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.temperature = 1.0
    assert not RequestOptions().penalties().active
    pen = RequestOptions(frequency_penalty=0.5, logit_bias={3: 1.0}, min_tokens=2).penalties()
    assert (pen.frequency, pen.logit_bias, pen.min_tokens, pen.active) == (0.5, {3: 1.0}, 2, True)
    s = RequestOptions(temperature=0.7, top_k=5, top_p=0.9).sampling()
    assert (s.temperature, s.top_k, s.top_p) == (0.7, 5, 0.9)


def test_overrides_replace_fields_and_are_checked():
    base = RequestOptions(temperature=0.5, seed=3)
    assert request_options() == RequestOptions()
    assert request_options(None, top_k=4) == RequestOptions(top_k=4)
    assert request_options(base) is base
    assert request_options(base, seed=9) == RequestOptions(temperature=0.5, seed=9)
    with pytest.raises(InvalidRequest, match="max_new_tokens"):
        request_options(base, max_new_tokens=0)
    with pytest.raises(TypeError):
        request_options(base, temprature=1.0)  # a misspelt option is not silently dropped


def test_stream_seeds():
    assert RequestOptions(seed=5).stream_seed() == 5
    assert RequestOptions(seed=-1).stream_seed() == 2**64 - 1  # any int, reduced mod 2**64
    assert RequestOptions(seed=5).stream_seed(2) == [5, 2]
    assert RequestOptions(seed=None).stream_seed(1) is None


def test_default_draft():
    assert default_draft(None, True) == "model" and default_draft(None, False) == "none"
    assert default_draft("ngram", True) == "ngram"


@pytest.fixture
def pipe(tmp_path):
    p = fake_pipeline(tmp_path, draft="self")
    yield p
    p.close()


def test_the_pipeline_takes_options_or_keywords_alike(pipe):
    opts = RequestOptions(max_new_tokens=12, temperature=0.8, top_k=20, seed=11, k=2, draft="model")
    a = pipe.generate("w3 w4 w5", opts, chat=False)
    b = pipe.generate("w3 w4 w5", chat=False, max_new_tokens=12, temperature=0.8, top_k=20, seed=11, k=2,
                      draft="model")
    c = pipe.generate("w3 w4 w5", opts, chat=False, seed=12)  # a keyword replaces that field of opts
    assert a.token_ids == b.token_ids and len(a.token_ids) > 0
    d = pipe.generate("w3 w4 w5", dataclasses.replace(opts, seed=12), chat=False)
    assert c.token_ids == d.token_ids
    r = pipe.request(prompt_ids=[4, 5], options=opts, seed=3)  # every argument by name, as before
    assert (r.max_new_tokens, r.cfg.temperature, r.seed, r.draft) == (12, 0.8, 3, "model")
    assert [r.token_ids for r in pipe.choices("w3 w4", 2, opts, chat=False)] == [
        r.token_ids for r in pipe.choices("w3 w4", 2, chat=False, **dataclasses.asdict(opts))]


def test_what_needs_the_bundle_is_checked_by_the_pipeline_and_named(pipe):
    ids = [4, 5, 6]
    cases = [
        (dict(logit_bias={VOCAB + 3: 1.0}), "logit_bias", "outside the vocabulary"),
        (dict(k=pipe.max_k + 1), "k", "k must be between"),
        (dict(max_new_tokens=pipe.max_seq_len), "max_new_tokens", "exceeds"),
        (dict(draft="sometimes"), "draft", "draft must be one of"),
    ]
    for kw, param, words in cases:
        with pytest.raises(InvalidRequest, match=words) as e:
            pipe.request(ids, RequestOptions(**kw))
        assert e.value.param == param
    with pytest.raises(ContextOverflow):
        pipe.request(ids, max_new_tokens=pipe.max_seq_len)
    with pytest.raises(InvalidRequest) as e:
        pipe.request([], max_new_tokens=3)
    assert e.value.param is None and "empty prompt" in str(e.value)


# ---- LoadOptions: how a bundle is loaded and run -----------------------------------------------

@pytest.mark.parametrize("kw,words", [
    (dict(draft="sometimes"), "draft must be one of"),
    (dict(device="gpu"), "device must be one of"),
    (dict(max_batch=0), "max_batch must be a positive integer or 'auto'"),
    (dict(max_batch="lots"), "max_batch must be a positive integer or 'auto'"),
    (dict(max_batch=True), "max_batch must be a positive integer or 'auto'"),
    (dict(k=-1), "k must be an integer >= 0"),
    (dict(threads=-1), "threads must be an integer >= 0"),
    (dict(max_queue=-1), "max_queue must be >= 0"),
    (dict(memory_fraction=0), "memory fraction must be in"),
    (dict(memory_fraction=1.5), "memory fraction must be in"),
])
def test_load_options_are_checked_once_when_made(kw, words):
    with pytest.raises(ValueError, match=words):
        LoadOptions(**kw)
    with pytest.raises(ValueError, match=words):  # replacing a field checks again
        dataclasses.replace(LoadOptions(), **kw)


def test_every_load_option_has_a_default_and_a_comment():
    import inspect

    from specrt.runtime import options

    src = inspect.getsource(options.LoadOptions)
    for f in dataclasses.fields(LoadOptions):
        line = next(ln for ln in src.splitlines() if ln.strip().startswith(f"{f.name}:"))
        assert "=" in line and "  # " in line, line
    assert load_options() == LoadOptions()
    assert load_options(LoadOptions(k=2), max_queue=3) == LoadOptions(k=2, max_queue=3)


def test_load_takes_options_or_todays_keywords_alike(tmp_path):
    """`Pipeline(folder, **kw)` (and `specrt.load`) as before, or `options=`; keywords replace
    its fields; a misspelt one is a TypeError, never ignored."""
    from specrt.runtime.pipeline import Pipeline

    kw = dict(max_batch=2, max_queue=5, prefix_cache=False, adaptive=True, k=3, hugepages=False, cost_cache=False)
    made = [Pipeline(tmp_path, parts=fake_parts(tmp_path / "a", slots=2), **kw),
            Pipeline(tmp_path, LoadOptions(**kw), parts=fake_parts(tmp_path / "b", slots=2)),
            Pipeline(tmp_path, LoadOptions(k=9, **{n: v for n, v in kw.items() if n != "k"}),
                     parts=fake_parts(tmp_path / "c", slots=2), k=3)]
    try:
        for p in made:
            assert p.options == LoadOptions(**kw)
            assert (p.engine.max_queue, p.scheduler.prefix_cache, p.default_adaptive, p.default_k) == (5, False, True, 3)
        with pytest.raises(TypeError, match="unexpected keyword"):
            Pipeline(tmp_path, parts=fake_parts(tmp_path / "d"), max_batches=2)
    finally:
        for p in made:
            p.close()
