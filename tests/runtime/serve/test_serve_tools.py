"""Tool calls over HTTP (runtime/serve/openai/tool_chat.py) through the official `openai` client, against a
real server on 127.0.0.1 over fake pipelines (tests/toolfakes.py: a template with a tool
section, a tokenizer with the tags): calls come back as `message.tool_calls` with schema-valid
arguments and finish_reason "tool_calls", equal to target-only decoding through `Pipeline.chat`;
the SDK's own stream accumulation gives the same calls as the whole reply; `parse()` with a
pydantic tool; a second turn carrying the tool's result; and a template without tools refuses
them with the 400 it always gave."""

from __future__ import annotations

import json

import jsonschema
import openai
import pydantic
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState

from fakes import fake_pipeline
from specrt.runtime.serve.app import ServerConfig
from specrt.runtime.text.chat import prepare
from toolfakes import MINI_TEMPLATE, OPEN_ID, tool_tokens
from toolfakes import ToolServer as _Server

ADD = {"type": "object", "additionalProperties": False, "required": ["a", "b"],
       "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                      "b": {"type": "integer", "minimum": 0, "maximum": 99}}}
WEATHER = {"type": "object", "additionalProperties": False, "required": ["city"],
           "properties": {"city": {"type": "string", "maxLength": 6}}}
TOOLS = [{"type": "function", "function": {"name": "add", "description": "a + b", "parameters": ADD}},
         {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER, "strict": True}}]
SCHEMAS = {"add": ADD, "get_weather": WEATHER}
MSGS = [{"role": "user", "content": "add two numbers"}]


class Add(pydantic.BaseModel):
    a: int = pydantic.Field(ge=0, le=99)
    b: int = pydantic.Field(ge=0, le=99)


def _biased(pipe):
    """The fake target opens a call after the prompt's last token (the draft does not know)."""
    ids, _ = prepare(pipe.tokenizer, MSGS, TOOLS)
    pipe.parts.target.table.A[ids[-1], OPEN_ID] += 30.0
    return pipe


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    s = _Server(_biased(fake_pipeline(tmp_path_factory.mktemp("tools"), tokens=tool_tokens(MINI_TEMPLATE),
                                      draft="self", noise=0.4)))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """A bundle whose template has no tool section."""
    s = _Server(fake_pipeline(tmp_path_factory.mktemp("plain"),
                              tokens=tool_tokens("{% for m in messages %}{{ m.content }}{% endfor %}")))
    yield s
    s.stop()


def _calls(message) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}, "auto"])
def test_a_call_over_http_is_schema_valid_and_equals_target_only(srv, choice):
    r = srv.client.chat.completions.create(model="fake", messages=MSGS, tools=TOOLS, tool_choice=choice,
                                           parallel_tool_calls=False, max_tokens=80, temperature=0)
    msg = r.choices[0].message
    assert msg.tool_calls and r.choices[0].finish_reason == "tool_calls" and msg.content is None
    for name, args in _calls(msg):
        jsonschema.validate(args, SCHEMAS[name])
        assert msg.tool_calls[0].id.startswith("call_") and msg.tool_calls[0].type == "function"
    if isinstance(choice, dict):
        assert [n for n, _ in _calls(msg)] == ["get_weather"]
    want = srv.pipe.chat(MSGS, tools=TOOLS, tool_choice=choice, parallel_tool_calls=False, max_new_tokens=80,
                         draft="none")
    assert _calls(msg) == [(c.name, json.loads(c.arguments)) for c in want.tool_calls]
    assert r.usage.completion_tokens == len(want.token_ids)


@pytest.mark.parametrize("parallel", [False, True])
def test_the_sdks_stream_accumulation_gives_the_whole_replys_calls(srv, parallel):
    kw = dict(model="fake", messages=MSGS, tools=TOOLS, tool_choice="required", parallel_tool_calls=parallel,
              max_tokens=90, temperature=0)
    whole = srv.client.chat.completions.create(**kw)
    chunks = list(srv.client.chat.completions.create(stream=True, **kw))
    firsts = {}
    for ch in chunks:
        for d in (ch.choices[0].delta.tool_calls if ch.choices else None) or []:
            if d.index not in firsts:
                firsts[d.index] = d
                assert d.id and d.type == "function" and d.function.name  # the first piece names the call
            else:
                assert d.id is None and d.function.name is None
    assert sorted(firsts) == list(range(len(firsts))) and firsts  # a dense index
    for ch in chunks:  # a piece held back sends nothing, not an empty chunk
        c = ch.choices[0]
        assert c.delta.role or c.delta.content or c.delta.tool_calls or c.finish_reason, ch
    state = ChatCompletionStreamState()  # the SDK's own reassembly of deltas (its stream helper's)
    for ch in chunks:
        state.handle_chunk(ch)
    final = state.current_completion_snapshot  # (not parsed: the fake chains parallel calls to "length")
    def raw(message):
        return [(c.function.name, c.function.arguments) for c in message.tool_calls]

    assert raw(final.choices[0].message) == raw(whole.choices[0].message)
    assert final.choices[0].finish_reason == whole.choices[0].finish_reason
    assert (final.choices[0].message.content or None) == whole.choices[0].message.content
    if not parallel:
        assert len(raw(whole.choices[0].message)) == 1 and whole.choices[0].finish_reason == "tool_calls"
    else:  # the fake chains calls until the budget cuts one: that one is content, never a call
        assert whole.choices[0].finish_reason == "length" and '<tool_call>' in whole.choices[0].message.content
    for _, arguments in raw(whole.choices[0].message):
        json.loads(arguments)  # every call a client gets parses


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_cut_by_max_tokens_is_not_a_call(srv, stream):
    """The budget ends the reply inside the call's arguments: finish_reason "length", no
    tool_calls entry (its arguments would not parse), the cut text as content."""
    kw = dict(model="fake", messages=MSGS, tools=TOOLS, tool_choice="required", max_tokens=12, temperature=0)
    if stream:
        state = ChatCompletionStreamState()
        for ch in srv.client.chat.completions.create(stream=True, **kw):
            assert not (ch.choices and ch.choices[0].delta.tool_calls)
            state.handle_chunk(ch)
        choice = state.current_completion_snapshot.choices[0]
    else:
        choice = srv.client.chat.completions.create(**kw).choices[0]
    want = srv.pipe.tokenizer.decode(srv.pipe.chat(MSGS, tools=TOOLS, tool_choice="required", max_new_tokens=12,
                                                   draft="none").token_ids)
    assert choice.finish_reason == "length" and not choice.message.tool_calls
    assert choice.message.content == want and want.startswith("<tool_call>")


def test_parse_with_a_pydantic_tool(srv):
    r = srv.client.chat.completions.parse(model="fake", messages=MSGS, tools=[openai.pydantic_function_tool(Add)],
                                          tool_choice="required", parallel_tool_calls=False, max_tokens=60,
                                          temperature=0)
    call = r.choices[0].message.tool_calls[0]
    assert isinstance(call.function.parsed_arguments, Add) and call.function.name == "Add"


def test_a_second_turn_carries_the_tools_result(srv):
    first = srv.client.chat.completions.create(model="fake", messages=MSGS, tools=TOOLS, tool_choice="required",
                                               parallel_tool_calls=False, max_tokens=60, temperature=0)
    call = first.choices[0].message.tool_calls[0]
    history = MSGS + [first.choices[0].message.model_dump(exclude_none=True),
                      {"role": "tool", "tool_call_id": call.id, "content": "42"}]
    r = srv.client.chat.completions.create(model="fake", messages=history, tools=TOOLS, tool_choice="none",
                                           max_tokens=8, temperature=0)
    ids, _ = prepare(srv.pipe.tokenizer, history, TOOLS, "none")
    assert r.usage.prompt_tokens == len(ids) and r.choices[0].message.tool_calls is None
    rendered = srv.pipe.tokenizer.render_messages([{"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": call.function.name, "arguments": json.loads(call.function.arguments)}}]}])
    assert json.dumps(json.loads(call.function.arguments)) in rendered  # arguments rendered as an object


def test_none_renders_no_tools_and_answers_text(srv):
    r = srv.client.chat.completions.create(model="fake", messages=MSGS, tools=TOOLS, tool_choice="none",
                                           max_tokens=12, temperature=0)
    ids, _ = prepare(srv.pipe.tokenizer, MSGS, None)
    assert r.usage.prompt_tokens == len(ids) and r.choices[0].message.tool_calls is None
    assert r.choices[0].message.content == srv.pipe.tokenizer.decode(
        srv.pipe.chat(MSGS, max_new_tokens=12, draft="none").token_ids)


@pytest.mark.parametrize("kw,param,code", [
    (dict(tool_choice={"type": "function", "function": {"name": "mul"}}), "tool_choice.function.name", None),
    (dict(response_format={"type": "json_object"}), "response_format", None),
    (dict(tools=[{"type": "function", "function": {"name": "f", "strict": True,
                                                   "parameters": {"type": "object", "properties": {"a": {"$ref": "#/x"}}}}}]),
     "tools", "invalid_grammar"),
])
def test_bad_tool_requests_are_400s_naming_the_param(srv, kw, param, code):
    with pytest.raises(openai.BadRequestError) as e:
        srv.client.chat.completions.create(model="fake", messages=MSGS, **{"tools": TOOLS, **kw}, max_tokens=4)
    assert (e.value.param, e.value.code) == (param, code), e.value.body


def test_a_template_without_tools_refuses_them(plain):
    c = plain.client
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="fake", messages=MSGS, tools=TOOLS, max_tokens=4)
    assert (e.value.param, e.value.code) == ("tools", "unsupported_parameter") and "not supported" in e.value.message
    history = MSGS + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}]}]
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="fake", messages=history, max_tokens=4)
    assert e.value.param == "messages[1]"
    r = c.chat.completions.create(model="fake", messages=MSGS, tools=TOOLS, tool_choice="none", max_tokens=4)
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason in ("stop", "length")


def test_through_an_engine_replica_as_through_one_process(srv):
    """The Ray path without Ray: the ingress renders the prompt and picks the response shape,
    the request travels pickled (as Ray sends it) and an engine replica answers it."""
    import asyncio
    import pickle

    from specrt.runtime.serve.openai.schema_chat import ChatCompletionRequest
    from specrt.runtime.serve.openai.tool_chat import chat_prompt
    from specrt.runtime.serve.ray.deploy import EngineRequest, EngineServer, Head

    kw = dict(model="fake", messages=MSGS, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
              max_tokens=60, temperature=0)
    body = ChatCompletionRequest(**kw)
    ids, out = chat_prompt(body, srv.pipe.tokenizer)
    req = pickle.loads(pickle.dumps(EngineRequest(body, ids, "messages", out)))
    replica = EngineServer(ServerConfig(model_id="fake"), lambda: srv.pipe, "r0")

    async def run():
        return [item async for item in replica.generate(req)]

    items = asyncio.run(run())
    assert isinstance(items[0], Head) and items[0].error is None
    msg = items[1]["choices"][0]["message"]
    want = srv.client.chat.completions.create(**kw).choices[0].message
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in msg["tool_calls"]] == [
        (c.function.name, c.function.arguments) for c in want.tool_calls]
    assert items[1]["choices"][0]["finish_reason"] == "tool_calls" and msg["content"] is None


def test_n_choices_with_logprobs_each_parse_their_own_calls(srv):
    kw = dict(model="fake", messages=MSGS, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
              max_tokens=60, temperature=0, n=2, logprobs=True)
    whole = srv.client.chat.completions.create(**kw)
    state = ChatCompletionStreamState()
    for ch in srv.client.chat.completions.create(stream=True, **kw):
        state.handle_chunk(ch)
    streamed = state.current_completion_snapshot
    for w, s in zip(whole.choices, sorted(streamed.choices, key=lambda c: c.index), strict=True):
        assert _calls(w.message) == _calls(s.message) and _calls(w.message)
        assert len(w.logprobs.content) == len(s.logprobs.content) > 0  # held-back pieces still carry theirs
    assert whole.usage.completion_tokens == sum(len(c.logprobs.content) for c in whole.choices)
