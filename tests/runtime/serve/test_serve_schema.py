"""The request models on their own (no server): what they accept, what they refuse, the param
each error names, and the conversion to engine settings."""

from __future__ import annotations

import logging

import pytest
from pydantic import ValidationError

from specrt.runtime.options import RequestOptions
from specrt.runtime.serve.errors import openai_error
from specrt.runtime.serve.openai.schema_chat import ChatCompletionRequest
from specrt.runtime.serve.openai.schema_completion import CompletionRequest
from specrt.runtime.serve.refusals import UNSUPPORTED


def chat(**kw):
    return ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}], **kw})


def completion(**kw):
    return CompletionRequest.model_validate({"model": "m", "prompt": "hi", **kw})


def error(make, **kw):
    """-> the OpenAI error the body gets."""
    with pytest.raises(ValidationError) as e:
        make(**kw)
    return openai_error(e.value.errors())


@pytest.mark.parametrize("make,kw,param", [
    (completion, {"temperature": -1}, "temperature"),
    (completion, {"temperature": 2.5}, "temperature"),
    (completion, {"temperature": float("nan")}, "temperature"),
    (completion, {"temperature": float("inf")}, "temperature"),
    (completion, {"temperature": True}, "temperature"),  # not 1
    (completion, {"temperature": "0.5"}, "temperature"),  # not 0.5
    (completion, {"temperature": 10**400}, "temperature"),  # too large for a float
    (completion, {"top_p": 0}, "top_p"),
    (completion, {"top_k": -1}, "top_k"),
    (completion, {"max_tokens": 0}, "max_tokens"),
    (completion, {"max_tokens": 10**400}, "max_tokens"),
    (completion, {"max_tokens": 5.5}, "max_tokens"),
    (completion, {"max_tokens": True}, "max_tokens"),
    (completion, {"max_tokens": "10"}, "max_tokens"),
    (chat, {"max_completion_tokens": 0}, "max_completion_tokens"),
    (completion, {"seed": False}, "seed"),
    (completion, {"n": 0}, "n"),
    (completion, {"stop": ["s"] * 17}, "stop"),
    (completion, {"stop": ["a", 3]}, "stop[1]"),
    (completion, {"stream": "yes"}, "stream"),
    (completion, {"ignore_eos": 1}, "ignore_eos"),
    (completion, {"prompt": 5}, "prompt"),
    (completion, {"prompt": ["a", "b"]}, "prompt"),
    (completion, {"prompt": ""}, "prompt"),
    (completion, {"model": ""}, "model"),
    (chat, {"messages": []}, "messages"),
    (chat, {"messages": ["hi"]}, "messages[0]"),
    (chat, {"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    (chat, {"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    (chat, {"messages": [{"role": "user"}]}, "messages[0]"),
    (chat, {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, "messages[0].content[0].text"),
    (chat, {"messages": [{"role": "user", "content": [{"type": "video"}]}]}, "messages[0].content[0].type"),
    (chat, {"stream_options": {"include_usage": "yes"}, "stream": True}, "stream_options.include_usage"),
    (chat, {"stream_options": {"include_usage": True}}, "stream_options"),  # only with stream: true
    (chat, {"top_logprobs": 2}, "top_logprobs"),  # only with logprobs: true
    # refused fields are still type- and range-checked, so lifting a refusal lifts nothing else
    (chat, {"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
    (completion, {"logprobs": 6}, "logprobs"),
    (chat, {"logprobs": 1}, "logprobs"),
    (chat, {"frequency_penalty": 2.5}, "frequency_penalty"),
    (chat, {"presence_penalty": -3}, "presence_penalty"),
    (chat, {"logit_bias": {"50": 101}}, "logit_bias.50"),
    (chat, {"logit_bias": {"hello": 1}}, "logit_bias.hello"),
    (chat, {"min_tokens": -1}, "min_tokens"),
    (chat, {"response_format": {"type": "xml"}}, "response_format.type"),
    (chat, {"response_format": {"type": "json_schema"}}, "response_format"),
    (chat, {"tool_choice": "sometimes"}, "tool_choice"),
    (chat, {"tools": [{"type": "function", "function": {}}]}, "tools[0].function.name"),
    # a forced tool choice needs tools (a template without tools refuses them: test_serve_tools.py)
    (chat, {"tool_choice": "required"}, "tool_choice"),
    (chat, {"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
    (completion, {"best_of": 0}, "best_of"),
])
def test_invalid_values_name_their_param(make, kw, param):
    err = error(make, **kw)
    assert err.param == param and err.type == "invalid_request_error" and err.code is None
    assert err.message.startswith(f"'{param}'")


def test_messages_say_what_to_change():
    assert "less than or equal to 2" in error(completion, temperature=5).message
    assert "(got 5)" in error(completion, temperature=5).message
    assert "finite" in error(completion, temperature=float("nan")).message
    assert error(chat, messages=[{"role": "user", "content": 5}]).message == (
        "'messages[0].content': must be a string or a list (got 5)")
    assert "'stream': true" in error(chat, stream_options={"include_usage": True}).message


# one request per entry of UNSUPPORTED, and the param its refusal names
REFUSED = [
    (completion, {"best_of": 2}, "best_of"),
    (chat, {"min_p": 0.1}, "min_p"),
    (completion, {"stop_token_ids": [2]}, "stop_token_ids"),
    (chat, {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                      {"type": "image_url", "image_url": {"url": "http://x"}}]}]},
     "messages[0].content[1]"),
    (chat, {"messages": [{"role": "user", "content": [{"type": "input_audio",
                                                       "input_audio": {"data": "AA==", "format": "wav"}}]}]},
     "messages[0].content[0]"),
    (chat, {"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    (chat, {"modalities": ["text", "audio"]}, "modalities"),
    (completion, {"echo": True}, "echo"),
]


@pytest.mark.parametrize("make,kw,param", REFUSED)
def test_unsupported_fields_are_refused_not_ignored(make, kw, param):
    err = error(make, **kw)
    assert (err.param, err.code, err.type) == (param, "unsupported_parameter", "invalid_request_error")
    assert "not supported by this server" in err.message


def test_every_refusal_is_tested():
    tested = {param.split("[")[0] for _, _, param in REFUSED}
    assert {u.field for u in UNSUPPORTED} == tested


@pytest.mark.parametrize("make,kw", [
    (chat, {"n": 1, "best_of": None, "logprobs": False, "top_logprobs": 0, "frequency_penalty": 0,
            "presence_penalty": 0.0, "repetition_penalty": 1, "logit_bias": {}, "min_tokens": 0, "min_p": 0,
            "stop_token_ids": [], "response_format": {"type": "text"}, "tools": [], "tool_choice": "none",
            "parallel_tool_calls": True, "modalities": ["text"]}),
    (chat, {"tool_choice": "auto"}),  # without tools: plain text, as "none"
    (completion, {"logprobs": None, "echo": False, "best_of": 1, "suffix": ""}),
])
def test_neutral_values_of_refused_fields_are_accepted(make, kw):
    """A refused field at its neutral value passes validation and asks for nothing: the engine
    gets what it gets without the field, one choice."""
    r = make(**kw)
    assert r.to_options(9) == make().to_options(9) and (r.n or 1) == 1


def test_unknown_fields_are_ignored_and_logged(caplog):
    with caplog.at_level(logging.DEBUG, logger="specrt.serve"):
        r = chat(user="u1", metadata={"a": "b"}, store=False)
    assert r.to_options(100) == chat().to_options(100)
    assert "['metadata', 'store', 'user']" in caplog.text
    # an endpoint's own field sent to the other endpoint is unknown there, not refused
    completion(tools=[{"type": "function"}])


def test_to_options_defaults_and_does_not_mutate():
    r = chat(temperature=0.3, top_k=5, seed=7, stop="END", ignore_eos=True)
    before = r.model_dump()
    p = r.to_options(room=100)
    assert r.model_dump() == before
    assert (p.max_new_tokens, p.temperature, p.top_p, p.top_k, p.seed, p.ignore_eos, p.stop) == (
        100, 0.3, 1.0, 5, 7, True, ("END",))
    assert chat().to_options(room=50).max_new_tokens == 50  # chat: to the end of the context
    assert completion().to_options(room=50).max_new_tokens == 16  # completions: 16, as OpenAI
    assert chat(max_tokens=5, max_completion_tokens=7).to_options(50).max_new_tokens == 7
    assert chat(max_tokens=5).to_options(50).max_new_tokens == 5
    p = completion(temperature=None, top_p=None, top_k=None, stop=["", "x"], max_tokens=3.0).to_options(9)
    assert (p.temperature, p.top_p, p.top_k, p.stop, p.max_new_tokens) == (1.0, 1.0, 0, ("x",), 3)
    assert p == RequestOptions(max_new_tokens=3, temperature=1.0, top_p=1.0, top_k=0, seed=None, stop=("x",),
                               ignore_eos=False, frequency_penalty=0.0, presence_penalty=0.0,
                               repetition_penalty=1.0, logit_bias={}, min_tokens=0, logprobs=None, grammar=None)
    p = chat(frequency_penalty=0.5, presence_penalty=-1, repetition_penalty=1.2, logit_bias={"7": -100, "9": 2.5},
             min_tokens=3, logprobs=True, top_logprobs=4).to_options(9)
    assert (p.frequency_penalty, p.presence_penalty, p.repetition_penalty, p.min_tokens) == (0.5, -1.0, 1.2, 3)
    assert p.logit_bias == {7: -100.0, 9: 2.5} and p.logprobs == 4
    assert chat(logprobs=True).to_options(9).logprobs == 0 and chat().to_options(9).logprobs is None
    assert completion(logprobs=2).to_options(9).logprobs == 2 and completion().to_options(9).logprobs is None


def test_structured_output_fields_become_one_constraint():
    from specrt.runtime.sampling.grammar import Constraint

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    cases = [
        (chat(response_format={"type": "json_object"}), Constraint.json_object(), "response_format"),
        (chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}),
         Constraint.json_schema(schema), "response_format"),
        (completion(guided_json=schema), Constraint.json_schema(schema), "guided_json"),
        (chat(guided_regex="a+"), Constraint.regex("a+"), "guided_regex"),
        (chat(guided_choice=["yes", "no"]), Constraint.choice(["yes", "no"]), "guided_choice"),
        (completion(guided_grammar="root ::= 'a'"), Constraint.gbnf("root ::= 'a'"), "guided_grammar"),
        (completion(grammar="root ::= 'a'"), Constraint.gbnf("root ::= 'a'"), "grammar"),
        (chat(json_schema=schema), Constraint.json_schema(schema), "json_schema"),
    ]
    for req, want, param in cases:
        assert (req.to_options(9).grammar, req.grammar_field()) == (want, param)
    assert chat(response_format={"type": "text"}).to_options(9).grammar is None
    err = error(chat, response_format={"type": "json_object"}, guided_regex="a+")
    assert err.param == "guided_regex" and "one grammar" in err.message


def test_messages_for_the_template():
    r = chat(messages=[{"role": "developer", "content": "be brief"},
                       {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                       {"role": "assistant", "content": None}])
    assert r.chat_messages() == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "ab"},
                                 {"role": "assistant", "content": ""}]
    assert completion(prompt=["one prompt"]).prompt == "one prompt"
    assert chat(stream=True, stream_options={"include_usage": True}).include_usage
    assert not chat(stream=True).include_usage


def test_a_failing_choice_stops_its_siblings_and_surfaces_its_own_error():
    """n > 1, not streamed: when one choice's events fail, the reply raises that error (not an
    'aclose(): generator already running' of a sibling), the sibling's request is cancelled, and
    nothing is left running."""
    import asyncio
    from types import SimpleNamespace

    from specrt.runtime.serve.openai.outputs import CompletionOutput
    from specrt.runtime.serve.streaming import Job, Reply
    from specrt.runtime.text.output import TextOutput

    cancelled, finalised = [], []

    class Tok:  # what a TextOutput reads of a tokenizer: every chunk is the text "x"
        token_text = str

        @staticmethod
        def stream():
            return SimpleNamespace(push=lambda ids: "x", flush=lambda: "")

    def req():  # what a TextOutput reads of a request
        return SimpleNamespace(logprobs=None, text_prefix="", stats=SimpleNamespace(stop_reason="eos", cached_tokens=0))

    def output(chunks):
        r = req()
        return TextOutput(r, chunks, Tok(), cancel=lambda: cancelled.append(r))

    async def failing():
        yield [1]
        await asyncio.sleep(0.01)
        raise RuntimeError("choice 0 failed")

    async def slow():
        try:
            for i in range(100):
                await asyncio.sleep(0.05)
                yield [i]
        finally:
            finalised.append(True)

    async def main():
        jobs = [Job(output(failing()), 0), Job(output(slow()), 1)]
        with pytest.raises(RuntimeError, match="choice 0 failed"):
            await Reply(jobs, CompletionOutput("m"), 3).collect()
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        return others

    assert asyncio.run(main()) == []
    assert len(cancelled) == 2 and finalised == [True]
