"""Structured output over HTTP on the real default bundle (its byte-level tokenizer drives
llguidance), through the official `openai` client: outputs validate against their schemas with
a real validator, speculative output equals constrained target-only output (a difference is
tolerated only at a near-tie of the *masked* logits, and the test says so), `parse()` with a
pydantic model works end to end, and a schema that cannot compile is a 400 naming it."""

from __future__ import annotations

import json
import re

import jsonschema
import numpy as np
import pydantic
import pytest

from specrt.runtime.sampling.grammar import Constraint, apply_mask

pytestmark = pytest.mark.slow

SCHEMAS = [
    {"type": "object", "required": ["city", "population"], "additionalProperties": False,
     "properties": {"city": {"type": "string", "maxLength": 40}, "population": {"type": "integer", "minimum": 0}}},
    {"type": "object", "required": ["name", "tags", "rating"], "additionalProperties": False,
     "properties": {"name": {"type": "string", "maxLength": 30},
                    "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 1, "maxItems": 3},
                    "rating": {"enum": ["good", "bad", "neutral"]}}},
    {"type": "object", "required": ["person"], "additionalProperties": False,
     "properties": {"person": {"type": "object", "required": ["first", "last", "age"], "additionalProperties": False,
                               "properties": {"first": {"type": "string", "maxLength": 20},
                                              "last": {"type": "string", "maxLength": 20},
                                              "age": {"type": "integer", "minimum": 0, "maximum": 130}}},
                    "verified": {"type": "boolean"}}},
]
PROMPTS = ["Give the largest city of France and its population as JSON.",
           "Review the movie Alien in JSON with a name, up to three tags and a rating.",
           "Describe a fictional person as JSON."]


@pytest.fixture(scope="module")
def srv(default_bundle):
    from test_serve import Server

    s = Server(default_bundle, max_batch=2, adaptive=False, hugepages=False)
    yield s
    s.stop()


def _masked_margin(pipe, prompt_ids, tokens, constraint, i) -> float:
    """Top-2 gap of the target's masked logits at position i of `tokens` (from scratch)."""
    from specrt.runtime.backends.harness import SequenceHarness
    from specrt.runtime.backends.ort import OrtBackend

    man = pipe.manifest
    dec = SequenceHarness(OrtBackend(pipe.folder / man.target.graph, man.target))
    logits = dec.prefill(list(prompt_ids) + list(tokens[:i]))
    m = pipe.grammars.matcher(pipe.grammars.compile(constraint))
    m.commit(tokens[:i])
    top = np.sort(apply_mask(logits[None], m.masks())[0])[-2:]
    return float(top[1] - top[0])


@pytest.mark.parametrize("i", range(len(SCHEMAS)))
def test_json_schema_outputs_validate_and_equal_target_only(srv, i):
    schema, prompt = SCHEMAS[i], PROMPTS[i]
    msgs = [{"role": "user", "content": prompt}]
    r = srv.client().chat.completions.create(
        model=srv.pipe.folder.name, messages=msgs, max_tokens=200, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}})
    text = r.choices[0].message.content
    jsonschema.validate(json.loads(text), schema)
    assert r.choices[0].finish_reason == "stop"
    pipe = srv.pipe
    ids = pipe.tokenizer.encode_messages(msgs)
    c = Constraint.json_schema(schema)
    got = pipe.tokenizer.tk.encode(text, add_special_tokens=False).ids
    ref = pipe.request(ids, max_new_tokens=200, draft="none", grammar=c)
    want = [t for ch in pipe.submit(ref) for t in ch]
    spec = pipe.request(ids, max_new_tokens=200, draft="model", grammar=c, k=5)
    toks = [t for ch in pipe.submit(spec) for t in ch]
    assert spec.stats.draft_tokens > 0
    if toks != want:
        j = next(j for j, (a, b) in enumerate(zip(toks, want, strict=False)) if a != b)
        margin = _masked_margin(pipe, ids, want, c, j)
        assert margin < 1e-4, f"constrained outputs differ at token {j} (masked margin {margin}): not a near-tie"
        pytest.skip(f"near-tie at token {j} (masked top-2 gap {margin:.2e}): the outputs may differ there")
    assert pipe.tokenizer.decode(want) == text or got == want


def test_json_object_choice_regex_and_parse(srv):
    c = srv.client()
    model = srv.pipe.folder.name
    msgs = [{"role": "user", "content": "List two colors as a JSON object."}]
    r = c.chat.completions.create(model=model, messages=msgs, max_tokens=80, temperature=0,
                                  response_format={"type": "json_object"})
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    r = c.chat.completions.create(model=model, messages=[{"role": "user", "content": "Is the sky blue?"}],
                                  max_tokens=10, temperature=0, extra_body={"guided_choice": ["yes", "no"]})
    assert r.choices[0].message.content in ("yes", "no")
    r = c.completions.create(model=model, prompt="The year the Eiffel Tower opened:", max_tokens=10, temperature=0,
                             extra_body={"guided_regex": r" [0-9]{4}"})
    assert re.fullmatch(r" [0-9]{4}", r.choices[0].text)

    class City(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=30)
        country: str = pydantic.Field(max_length=30)

    parsed = c.chat.completions.parse(model=model, messages=[{"role": "user", "content": "Name a city in Japan."}],
                                      max_tokens=60, temperature=0, response_format=City)
    assert isinstance(parsed.choices[0].message.parsed, City)


def test_a_schema_that_cannot_compile_is_a_400(srv):
    import openai

    with pytest.raises(openai.BadRequestError) as e:
        srv.client().chat.completions.create(
            model=srv.pipe.folder.name, messages=[{"role": "user", "content": "hi"}], max_tokens=5,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/nowhere"}}})
    err = e.value.body
    assert err["param"] == "response_format" and err["code"] == "invalid_grammar" and "nowhere" in err["message"]
    r = srv.client().chat.completions.create(model=srv.pipe.folder.name, messages=[{"role": "user", "content": "hi"}],
                                             max_tokens=5)
    assert r.choices[0].message.content is not None  # the server goes on
