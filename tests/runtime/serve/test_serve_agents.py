"""The APIs coding agents speak, as translations onto chat completions (runtime/serve/
responses_api.py, messages_api.py), through the official `openai` (Responses) and `anthropic`
clients against a real server on 127.0.0.1 over a fake pipeline whose template has tools
(tests/toolfakes.py): plain and streamed replies, a tool call and a second turn carrying its
result, a call cut by the token budget, bad bodies answered in each API's own error shape,
count_tokens, seeds, cancellation on disconnect, and the output equal to target-only decoding
(`--draft none`) of the same conversation."""

from __future__ import annotations

import json
import time

import anthropic
import httpx
import jsonschema
import openai
import pytest
from test_serve_tools import MSGS, SCHEMAS, TOOLS, _biased, _Server

from fakes import fake_pipeline
from specrt.runtime.text.chat import prepare
from toolfakes import MINI_TEMPLATE, tool_tokens

R_TOOLS = [{"type": "function", **t["function"]} for t in TOOLS]  # the Responses API's flat tools
A_TOOLS = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in TOOLS]
GREEDY = {"temperature": 0}  # the anthropic SDK no longer has the field: sent as an extra


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    s = _Server(_biased(fake_pipeline(tmp_path_factory.mktemp("agents"), tokens=tool_tokens(MINI_TEMPLATE),
                                      draft="self", noise=0.4)))
    port = s.client.base_url.port
    s.anthropic = anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}", api_key="x", max_retries=0)
    s.url = f"http://127.0.0.1:{port}"
    yield s
    s.stop()


def _target_only(srv, messages, tools=None, choice=None, n=60, **kw):
    """What `--draft none` decodes for the conversation (the chat endpoint's own path)."""
    return srv.pipe.chat(messages, tools=tools, tool_choice=choice, max_new_tokens=n, draft="none", **kw)


# ---- /v1/responses ----------------------------------------------------------------------------

def test_responses_plain_and_streamed_equal_target_only(srv):
    c = srv.client
    kw = dict(model="fake", instructions="be brief", input="hello there", max_output_tokens=20, temperature=0)
    r = c.responses.create(**kw)
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
    want = _target_only(srv, msgs, n=20)
    assert r.output_text == srv.pipe.tokenizer.decode(want.token_ids) and r.usage.output_tokens == len(want.token_ids)
    assert r.usage.input_tokens == len(prepare(srv.pipe.tokenizer, msgs)[0])
    assert (r.status, r.incomplete_details.reason) == ("incomplete", "max_output_tokens")  # the budget ended it
    with c.responses.stream(**kw) as st:  # (the SDK's get_final_response wants response.completed)
        events = list(st)
    kinds, final = [e.type for e in events], events[-1].response
    assert final.output_text == r.output_text and final.status == "incomplete"
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.incomplete"
    assert "response.output_text.delta" in kinds and final.usage.output_tokens == r.usage.output_tokens


@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "get_weather"}, "auto"])
def test_responses_function_call_is_schema_valid_and_equals_target_only(srv, choice):
    c = srv.client
    kw = dict(model="fake", input=MSGS[0]["content"], tools=R_TOOLS, tool_choice=choice, max_output_tokens=80,
              temperature=0)
    r = c.responses.create(**kw)
    with c.responses.stream(**kw) as st:
        streamed = st.get_final_response()
    calls = [o for o in r.output if o.type == "function_call"]
    assert r.status == "completed" and len(calls) == 1 and calls[0].call_id.startswith("call_")
    jsonschema.validate(json.loads(calls[0].arguments), SCHEMAS[calls[0].name])
    chat_choice = choice if isinstance(choice, str) else {"type": "function", "function": {"name": choice["name"]}}
    want = _target_only(srv, MSGS, TOOLS, chat_choice, 80)
    assert [(c.name, c.arguments) for c in calls] == [(w.name, w.arguments) for w in want.tool_calls]
    assert [(o.type, o.name, o.arguments) for o in streamed.output if o.type == "function_call"] == [
        ("function_call", c.name, c.arguments) for c in calls]


def test_responses_second_turn_carries_the_function_output(srv):
    c = srv.client
    first = c.responses.create(model="fake", input=MSGS[0]["content"], tools=R_TOOLS, tool_choice="required",
                               max_output_tokens=80, temperature=0)
    call = next(o for o in first.output if o.type == "function_call")
    items = [{"role": "user", "content": MSGS[0]["content"]},
             {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
             {"type": "function_call_output", "call_id": call.call_id, "output": "42"}]
    r = c.responses.create(model="fake", input=items, tools=R_TOOLS, tool_choice="none", max_output_tokens=8,
                           temperature=0)
    history = MSGS + [{"role": "assistant", "content": "", "tool_calls": [
        {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "42"}]
    assert r.usage.input_tokens == len(prepare(srv.pipe.tokenizer, history, TOOLS, "none")[0])
    assert r.usage.input_tokens_details.cached_tokens > 0  # the first turn's rows, reused
    assert r.output_text == srv.pipe.tokenizer.decode(_target_only(srv, history, n=8).token_ids)


@pytest.mark.parametrize("body,param", [
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"store": True}, "store"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0]"),
    ({"tools": [{"type": "web_search"}]}, "tools[0]"),
    ({"temperature": 3}, "temperature"),
    ({"max_output_tokens": 100000}, "max_output_tokens"),
    ({"input": 5}, "input"),
])
def test_responses_bad_bodies_are_openai_errors(srv, body, param):
    r = httpx.post(f"{srv.url}/v1/responses", json={"model": "fake", "input": "hi"} | body, timeout=30)
    err = r.json()["error"]
    assert r.status_code == 400 and err["type"] == "invalid_request_error" and err["param"] == param, err


# ---- /v1/messages -----------------------------------------------------------------------------

def test_messages_plain_and_streamed_equal_target_only(srv):
    a = srv.anthropic
    kw = dict(model="fake", system="be brief", max_tokens=20, messages=[{"role": "user", "content": "hello there"}],
              extra_body=GREEDY)
    r = a.messages.create(**kw)
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
    want = _target_only(srv, msgs, n=20)
    assert r.content[0].text == srv.pipe.tokenizer.decode(want.token_ids) and r.stop_reason == "max_tokens"
    assert r.usage.output_tokens == len(want.token_ids) and r.id.startswith("msg_")
    with a.messages.stream(**kw) as st:
        kinds = [e.type for e in st]
        final = st.get_final_message()
    assert final.content[0].text == r.content[0].text and final.stop_reason == "max_tokens"
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert "content_block_delta" in kinds
    n = a.messages.count_tokens(model="fake", system="be brief", messages=kw["messages"]).input_tokens
    assert n == len(prepare(srv.pipe.tokenizer, msgs)[0])


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "get_weather"}, {"type": "auto"}])
def test_messages_tool_use_is_schema_valid_and_equals_target_only(srv, choice):
    a = srv.anthropic
    kw = dict(model="fake", max_tokens=80, messages=MSGS, tools=A_TOOLS, tool_choice=choice, extra_body=GREEDY)
    r = a.messages.create(**kw)
    with a.messages.stream(**kw) as st:
        streamed = st.get_final_message()
    uses = [b for b in r.content if b.type == "tool_use"]
    assert r.stop_reason == "tool_use" and len(uses) == 1 and uses[0].id.startswith("toolu_")
    jsonschema.validate(uses[0].input, SCHEMAS[uses[0].name])
    chat_choice = {"any": "required", "auto": "auto"}.get(choice["type"]) or {
        "type": "function", "function": {"name": choice["name"]}}
    want = _target_only(srv, MSGS, TOOLS, chat_choice, 80)
    assert [(u.name, u.input) for u in uses] == [(w.name, json.loads(w.arguments)) for w in want.tool_calls]
    assert [(b.name, b.input) for b in streamed.content if b.type == "tool_use"] == [(u.name, u.input) for u in uses]
    tokens = a.messages.count_tokens(model="fake", messages=MSGS, tools=A_TOOLS).input_tokens
    assert tokens == r.usage.input_tokens + r.usage.cache_read_input_tokens == len(prepare(srv.pipe.tokenizer, MSGS,
                                                                                            TOOLS)[0])


def test_messages_second_turn_carries_the_tool_result(srv):
    a = srv.anthropic
    first = a.messages.create(model="fake", max_tokens=80, messages=MSGS, tools=A_TOOLS, tool_choice={"type": "any"},
                              extra_body=GREEDY)
    use = first.content[-1]
    turn = MSGS + [{"role": "assistant", "content": [use.model_dump(exclude_none=True)]},
                   {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "42"}]}]
    r = a.messages.create(model="fake", max_tokens=8, messages=turn, tools=A_TOOLS, tool_choice={"type": "none"},
                          extra_body=GREEDY)
    history = MSGS + [{"role": "assistant", "content": "", "tool_calls": [
        {"id": use.id, "type": "function", "function": {"name": use.name, "arguments": json.dumps(use.input)}}]},
        {"role": "tool", "tool_call_id": use.id, "content": "42"}]
    assert r.usage.input_tokens + r.usage.cache_read_input_tokens == len(prepare(srv.pipe.tokenizer, history)[0])
    assert r.content[0].text == srv.pipe.tokenizer.decode(_target_only(srv, history, n=8).token_ids)


def test_a_call_cut_by_the_budget_is_no_call_in_either_api(srv):
    r = srv.client.responses.create(model="fake", input=MSGS[0]["content"], tools=R_TOOLS, tool_choice="required",
                                    max_output_tokens=12, temperature=0)
    assert r.status == "incomplete" and not [o for o in r.output if o.type == "function_call"]
    assert r.output_text.startswith("<tool_call>")  # the cut text, as content
    with srv.anthropic.messages.stream(model="fake", max_tokens=12, messages=MSGS, tools=A_TOOLS,
                                       tool_choice={"type": "any"}, extra_body=GREEDY) as st:
        m = st.get_final_message()
    assert m.stop_reason == "max_tokens" and [b.type for b in m.content] == ["text"]


def test_stop_sequences_and_seeds_hold_through_messages(srv):
    a = srv.anthropic
    kw = dict(model="fake", max_tokens=30, messages=[{"role": "user", "content": "tell me"}],
              extra_body={"temperature": 0.9, "seed": 7})
    replies = [a.messages.create(**kw) for _ in range(2)]
    sampled = [r.content[0].text for r in replies]
    want = _target_only(srv, kw["messages"], n=30, temperature=0.9, seed=7)
    assert sampled[0] == sampled[1] == srv.pipe.tokenizer.decode(want.token_ids)  # a seed means one output
    assert replies[0].stop_reason in ("end_turn", "max_tokens") and replies[0].stop_sequence is None
    stop = sampled[0][5:7]
    r = a.messages.create(**kw, stop_sequences=["\x00never", stop])
    assert r.content[0].text == sampled[0][: sampled[0].index(stop)]
    assert (r.stop_reason, r.stop_sequence) == ("stop_sequence", stop)  # the entry that matched, not the first
    with a.messages.stream(**kw, stop_sequences=["\x00never", stop]) as st:
        delta = [e for e in st if e.type == "message_delta"][0].delta
        final = st.get_final_message()
    assert (delta.stop_reason, delta.stop_sequence) == ("stop_sequence", stop)
    assert final.content[0].text == r.content[0].text and final.stop_sequence == stop


@pytest.mark.parametrize("body,param", [
    ({"max_tokens": None}, "max_tokens"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages[0].content[0]"),
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
    ({"tools": [{"type": "bash_20250124", "name": "bash"}]}, "tools[0]"),
    ({"temperature": 1.5}, "temperature"),
    ({"tool_choice": {"type": "tool", "name": "mul"}, "tools": A_TOOLS}, "tool_choice.name"),
    ({"output_config": {"effort": "high"}}, "output_config.effort"),
])
def test_messages_bad_bodies_are_anthropic_errors(srv, body, param):
    base = {"model": "fake", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(f"{srv.url}/v1/messages", json={k: v for k, v in (base | body).items() if v is not None},
                   timeout=30)
    got = r.json()
    assert r.status_code == 400 and got["type"] == "error", got
    assert got["error"]["type"] == "invalid_request_error" and param in got["error"]["message"], got
    with pytest.raises(anthropic.NotFoundError) as e:
        srv.anthropic.messages.create(model="nope", max_tokens=4, messages=[{"role": "user", "content": "x"}])
    assert e.value.body["error"]["type"] == "not_found_error"


def test_a_stream_closed_early_cancels_its_request(srv):
    """Each API's stream: the client leaves after the first events; the engine retires the
    request before its budget is spent."""
    run = {"ignore_eos": True}
    opened = [lambda: srv.client.responses.create(model="fake", input="go on", max_output_tokens=180, stream=True,
                                                  extra_body=run),
              lambda: srv.anthropic.messages.create(model="fake", max_tokens=180, stream=True, extra_body=run,
                                                    messages=[{"role": "user", "content": "go on"}])]
    for open_stream in opened:
        before = srv.pipe.counters()["tokens"]
        stream = open_stream()
        next(iter(stream))
        stream.close()
        deadline = time.time() + 20
        while srv.pipe.counters()["running"] and time.time() < deadline:
            time.sleep(0.05)
        assert srv.pipe.counters()["running"] == 0
        assert srv.pipe.counters()["tokens"] - before < 180  # cut short, not run to the end


def test_the_openai_error_shape_stays_on_openai_paths(srv):
    with pytest.raises(openai.NotFoundError) as e:
        srv.client.responses.create(model="nope", input="x")
    assert e.value.body["code"] == "model_not_found"


# ---- a tiny exported bundle through real onnxruntime ------------------------------------------

@pytest.fixture(scope="module")
def real(tiny_bundles):
    from test_serve import Server

    s = Server(tiny_bundles["int8"], max_batch=2, adaptive=False)  # the int8 self-draft, fixed k
    yield s
    s.stop()


def test_greedy_speculative_equals_draft_none_through_both_apis(real):
    """Both translated APIs, on a real bundle with a draft: the text of `--draft none`."""
    msgs = [{"role": "system", "content": "w9 w10"}, {"role": "user", "content": "w5 w6 w7"}]
    want = real.pipe.chat(msgs, max_new_tokens=24, draft="none")
    text = real.pipe.tokenizer.decode(want.token_ids)
    drafted = real.pipe.counters()["draft_tokens"]
    r = real.client().responses.create(model="int8", instructions="w9 w10", input="w5 w6 w7", max_output_tokens=24,
                                       temperature=0)
    assert r.output_text == text and r.usage.output_tokens == len(want.token_ids)
    a = anthropic.Anthropic(base_url=real.url, api_key="x", max_retries=0)
    with a.messages.stream(model="int8", system="w9 w10", max_tokens=24, extra_body=GREEDY,
                           messages=[{"role": "user", "content": "w5 w6 w7"}]) as st:
        m = st.get_final_message()
    assert "".join(b.text for b in m.content) == text and m.usage.output_tokens == len(want.token_ids)
    assert real.pipe.counters()["draft_tokens"] > drafted  # the server drafted: speculation was on


def test_messages_max_tokens_beyond_the_context_runs_to_its_end(srv):
    """Claude Code sends max_tokens 32000: a bound, not a demand; the reply ends at the context's end."""
    with srv.anthropic.messages.stream(model="fake", max_tokens=32000, messages=[{"role": "user", "content": "go"}],
                                       extra_body={"temperature": 0, "ignore_eos": True}) as st:  # (the SDK
        r = st.get_final_message()  # streams requests this long)
    used = r.usage.input_tokens + r.usage.cache_read_input_tokens + r.usage.output_tokens
    assert r.stop_reason == "max_tokens" and used == srv.pipe.max_seq_len


def test_the_outputs_travel_to_an_engine_replica(srv):
    """The Ray path pickles the chat request and the output shape (ray/deploy.py EngineRequest)."""
    import pickle

    from specrt.runtime.serve.anthropic.messages_api import MessagesOutput
    from specrt.runtime.serve.anthropic.schema_messages import MessagesChat, MessagesRequest
    from specrt.runtime.serve.openai.responses_api import ResponsesOutput
    from specrt.runtime.serve.openai.schema_responses import ResponsesChat, ResponsesRequest
    from specrt.runtime.serve.translate import to_chat

    m = MessagesRequest(model="fake", max_tokens=9, messages=MSGS, tools=A_TOOLS)
    r = ResponsesRequest(model="fake", input="x", tools=R_TOOLS, tool_choice="required")
    for chat in (to_chat(MessagesChat, m.to_chat()), to_chat(ResponsesChat, r.to_chat())):
        _, plan = prepare(srv.pipe.tokenizer, chat.chat_messages(), [t.model_dump(exclude_none=True) for t in chat.tools])
        for out in (MessagesOutput("fake", plan, 3), ResponsesOutput("fake", plan, 3, {})):
            out.piece(0, "<tool_call>")
            back = pickle.loads(pickle.dumps((chat, out)))
            assert back[0] == chat and back[1].blocks.parser.names == plan.names


def test_structured_output_through_both_apis(srv):
    """text.format / output_config.format are chat's response_format: the same grammar, the same output."""
    schema = SCHEMAS["add"]
    chat = srv.client.chat.completions.create(model="fake", messages=[{"role": "user", "content": "numbers"}],
                                              max_tokens=60, temperature=0, response_format={
                                                  "type": "json_schema", "json_schema": {"name": "add", "schema": schema}})
    r = srv.client.responses.create(model="fake", input="numbers", max_output_tokens=60, temperature=0,
                                    text={"format": {"type": "json_schema", "name": "add", "schema": schema}})
    m = srv.anthropic.messages.create(model="fake", max_tokens=60, messages=[{"role": "user", "content": "numbers"}],
                                      output_config={"format": {"type": "json_schema", "schema": schema}},
                                      extra_body=GREEDY)
    text = chat.choices[0].message.content
    assert r.output_text == m.content[0].text == text and text.lstrip().startswith("{")
    if chat.choices[0].finish_reason == "stop":
        jsonschema.validate(json.loads(text), schema)


def test_the_key_as_anthropic_clients_send_it(tmp_path):
    from fastapi.testclient import TestClient

    from specrt.runtime.serve.app import ServerConfig, build_app

    pipe = fake_pipeline(tmp_path, tokens=tool_tokens(MINI_TEMPLATE), draft=None)
    body = {"model": "fake", "messages": [{"role": "user", "content": "hi"}]}
    try:
        with TestClient(build_app(ServerConfig(model_id="fake", api_key="k"), lambda: pipe)) as c:
            deadline = time.time() + 30
            while c.get("/health").status_code != 200 and time.time() < deadline:
                time.sleep(0.05)
            assert c.post("/v1/messages/count_tokens", json=body, headers={"x-api-key": "k"}).status_code == 200
            assert c.post("/v1/messages/count_tokens", json=body, headers={"Authorization": "Bearer k"}).status_code == 200
            bad = c.post("/v1/messages/count_tokens", json=body, headers={"x-api-key": "nope"})
            assert bad.status_code == 401 and bad.json()["error"]["type"] == "authentication_error"
            assert c.post("/v1/responses", json={"model": "fake", "input": "hi"}).json()["error"]["code"] == "invalid_api_key"
    finally:
        pipe.close()


def _sse(lines) -> list[tuple[str | None, dict]]:
    """(event name, data) of an SSE body."""
    out, name = [], None
    for line in lines:
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            out.append((name, json.loads(line[6:])))
            name = None
    return out


def test_a_codex_style_request_end_to_end(srv):
    """The body Codex CLI sends (its wire format, not the SDK's): streamed and not."""
    body = {"model": "fake", "instructions": "You are a coding agent.", "store": False, "include": [],
            "prompt_cache_key": "0193-abc", "tool_choice": "auto", "parallel_tool_calls": False, "reasoning": None,
            "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "add two numbers"}]}],
            "tools": [{"type": "function", "strict": False, **t["function"]} for t in TOOLS], "temperature": 0}
    whole = httpx.post(f"{srv.url}/v1/responses", json=body, timeout=60).json()
    with httpx.stream("POST", f"{srv.url}/v1/responses", json=body | {"stream": True}, timeout=60) as r:
        events = _sse(r.iter_lines())
    assert [n for n, _ in events] == [d["type"] for _, d in events]  # every event named by its type
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    final = events[-1][1]["response"]
    assert events[-1][0] == "response.completed" and final["output"][0]["type"] == "function_call"
    strip = lambda items: [{k: v for k, v in i.items() if k not in ("id", "call_id")} for i in items]  # noqa: E731
    assert strip(final["output"]) == strip(whole["output"]) and whole["usage"]["output_tokens"] > 0


def test_a_claude_code_style_request_end_to_end(srv):
    """The body Claude Code sends: system blocks with cache_control, tools with $schema,
    max_tokens 32000, metadata, the beta query and headers; streamed and not."""
    tools = [{"name": t["function"]["name"], "description": "d",
              "input_schema": {"$schema": "http://json-schema.org/draft-07/schema#", **t["function"]["parameters"]}}
             for t in TOOLS]
    body = {"model": "fake", "max_tokens": 32000, "metadata": {"user_id": "u1"}, "tools": tools, "temperature": 0,
            "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "add two numbers",
                                                       "cache_control": {"type": "ephemeral"}}]}]}
    headers = {"x-api-key": "x", "anthropic-version": "2023-06-01", "anthropic-beta": "claude-code-20250219"}
    url = f"{srv.url}/v1/messages?beta=true"
    whole = httpx.post(url, json=body, headers=headers, timeout=60).json()
    with httpx.stream("POST", url, json=body | {"stream": True}, headers=headers, timeout=60) as r:
        events = _sse(r.iter_lines())
    names = [n for n, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    use = next(d["content_block"] for n, d in events if n == "content_block_start")
    args = json.loads(next(d["delta"]["partial_json"] for n, d in events if n == "content_block_delta"))
    assert whole["stop_reason"] == events[-2][1]["delta"]["stop_reason"] == "tool_use"
    assert (use["name"], args) == (whole["content"][0]["name"], whole["content"][0]["input"])
