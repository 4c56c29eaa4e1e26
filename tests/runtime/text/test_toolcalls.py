"""Tool calls (runtime/text/toolcalls.py, toolstream.py, chat.py) on the Qwen2.5 chat template and a
byte-level tokenizer whose tags are added tokens (tests/toolfakes.py): rendering of tools and
tool history, the grammar of each tool_choice on a real llguidance matcher, parsing and
streaming reassembly under any split of the text, and the engine on the NumPy fake: greedy
output with tools, speculative (every drafter, fixed and adaptive k) = constrained target-only
computed straight from the fake's table, and what it parses to validates against the schema."""

from __future__ import annotations

import contextlib
import json
import random

import jsonschema
import pytest

from fakes import constrained_reference
from specrt.runtime.text.chat import prepare
from specrt.runtime.text.toolcalls import (
    Function,
    ToolError,
    plan,
    renders_tools,
    template_has_tools,
    template_messages,
    tool_grammar,
)
from specrt.runtime.text.toolstream import CallParser, parse
from toolfakes import EOS, MINI_TEMPLATE, OPEN_ID, QWEN25_TEMPLATE, ids, tool_tokens

WEATHER = {"type": "object", "additionalProperties": False, "required": ["city"],
           "properties": {"city": {"type": "string", "maxLength": 6}, "unit": {"enum": ["c", "f"]}}}
ADD = {"type": "object", "additionalProperties": False, "required": ["a", "b"],
       "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                      "b": {"type": "integer", "minimum": 0, "maximum": 99}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city.",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "add", "parameters": ADD, "strict": True}}]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
NAMES = frozenset(SCHEMAS)
MODES = [("none", False), ("model", False), ("ngram", False), ("auto", False), ("model", True), ("auto", True)]
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 22}}\n</tool_call>'
CALL2 = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "paris"}}\n</tool_call>'
BARE = '{"name": "add", "arguments": {"a": 1, "b": 2}}'  # a call without tags (Qwen2.5-Coder writes them)
PRETTY = '{\n  "name": "add",\n  "arguments": {"a": 1, "b": 2}\n}'  # the same, pretty-printed (issue 36)


@pytest.fixture
def make(make):
    """Fake pipelines whose tokenizer writes tool calls and whose template renders tools."""
    return lambda template=QWEN25_TEMPLATE, **kw: make(tokens=tool_tokens(template), **kw)


# ---- rendering ------------------------------------------------------------------------------

# Qwen's own function-calling example (qwen.readthedocs.io), as OpenAI clients send it:
# arguments as JSON strings; and what transformers renders for it with the Qwen2.5 template
QWEN_TOOLS = [
    {"type": "function", "function": {"name": "get_current_temperature",
                                      "description": "Get current temperature at a location.",
                                      "parameters": {"type": "object", "properties": {
                                          "location": {"type": "string", "description": "The location."},
                                          "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                                          "required": ["location"]}}}]
QWEN_MESSAGES = [
    {"role": "system", "content": "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."},
    {"role": "user", "content": "What's the temperature in San Francisco now?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_current_temperature", "arguments": '{"location": "San Francisco, CA, USA"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 26.1, "unit": "celsius"}'},
    {"role": "tool", "tool_call_id": "call_2", "content": '{"ok": true}'},
]
QWEN_RENDERED = (
    '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n# Tools\n\n'
    'You may call one or more functions to assist with the user query.\n\n'
    'You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n'
    '{"type": "function", "function": {"name": "get_current_temperature", "description": "Get current temperature '
    'at a location.", "parameters": {"type": "object", "properties": {"location": {"type": "string", "description": '
    '"The location."}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["location"]}}}\n'
    '</tools>\n\nFor each function call, return a json object with function name and arguments within '
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    '</tool_call><|im_end|>\n<|im_start|>user\nWhat\'s the temperature in San Francisco now?<|im_end|>\n'
    '<|im_start|>assistant\n<tool_call>\n{"name": "get_current_temperature", "arguments": {"location": '
    '"San Francisco, CA, USA"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n'
    '{"temperature": 26.1, "unit": "celsius"}\n</tool_response>\n<tool_response>\n{"ok": true}\n'
    '</tool_response><|im_end|>\n<|im_start|>assistant\n')


def test_tools_and_tool_history_render_as_transformers_does(make):
    pipe = make(draft=None)
    tok = pipe.tokenizer
    assert renders_tools(tok) and template_has_tools(QWEN25_TEMPLATE)
    p = plan(QWEN_TOOLS, "auto")
    assert tok.render_messages(template_messages(QWEN_MESSAGES), p.tools) == QWEN_RENDERED
    assert QWEN_MESSAGES[2]["tool_calls"][0]["function"]["arguments"].startswith("{")  # the input is left as is
    ids_, _ = prepare(tok, QWEN_MESSAGES, QWEN_TOOLS)
    assert ids_ == tok.tk.encode(QWEN_RENDERED, add_special_tokens=False).ids
    assert plan(QWEN_TOOLS, "none").tools is None  # "none": the template renders no tools
    assert "# Tools" not in tok.render_messages(QWEN_MESSAGES[:2], plan(QWEN_TOOLS, "none").tools)
    with pytest.raises(ToolError) as e:
        template_messages([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}])
    assert e.value.param == "messages[0].tool_calls[0].function.arguments"


def test_a_template_without_tools_refuses_them(make):
    pipe = make(template="{% for m in messages %}{{ m['content'] }}{% endfor %}", draft=None)
    assert not renders_tools(pipe.tokenizer)
    for kw, param in [(dict(tools=TOOLS), "tools"), (dict(tools=TOOLS, tool_choice="required"), "tools")]:
        with pytest.raises(ToolError, match="no tool calling") as e:
            pipe.chat([{"role": "user", "content": "hi"}], max_new_tokens=4, **kw)
        assert e.value.param == param
    with pytest.raises(ToolError) as e:
        pipe.chat(QWEN_MESSAGES[:4], max_new_tokens=4)
    assert e.value.param == "messages[2]"
    # tools with tool_choice "none" are not rendered: plain text, as without tools
    r = pipe.chat([{"role": "user", "content": "hi"}], tools=TOOLS, tool_choice="none", max_new_tokens=4)
    assert r.tool_calls == [] and r.finish_reason in ("stop", "length")


@pytest.mark.parametrize("tools,choice,param", [
    ([{"type": "function", "function": {"name": "a b"}}], "auto", "tools[0].function.name"),
    ([{"type": "retrieval"}], "auto", "tools[0]"),
    (TOOLS + TOOLS[:1], "auto", "tools[2].function.name"),
    (TOOLS, {"type": "function", "function": {"name": "nope"}}, "tool_choice.function.name"),
    (None, "required", "tool_choice"),
    (TOOLS, "sometimes", "tool_choice"),
])
def test_bad_tools_name_their_param(tools, choice, param):
    with pytest.raises(ToolError) as e:
        plan(tools, choice)
    assert e.value.param == param


# ---- the grammar of each tool_choice ----------------------------------------------------------

def _accepts(pipe, c, text: str) -> bool:
    g = pipe.grammars
    m = g.matcher(g.compile(c))
    t = ids(text)
    return m.valid_prefix(t) == len(t) and (m.commit(t) or bool(m.masks()[0][EOS]))


@pytest.mark.parametrize("choice,parallel,accepted,refused", [
    ("auto", True, ["just text", CALL, "ok " + CALL, CALL + "\n" + CALL2, BARE, "```json\n" + BARE + "\n```",
                    PRETTY, "```json\n" + PRETTY + "\n```", '```\n{ "name" : "add" , "arguments" : {"a": 1, "b": 2} }```',
                    '{"title": "x"}', "```python\nx\n```"],
     ['<tool_call>\n{"name": "mul", "arguments": {}}', '<tool_call>\n{"name": "add", "arguments": {"a": 1}}',
      CALL + " more", '<tool_call>\n{"name": "add", "arguments": {"a": 100, "b": 1}}',
      '{"name": "mul", "arguments": {}}', '```json\n{"name": "add", "arguments": {"a": 1}}', BARE + " and text",
      "```json\n" + PRETTY, PRETTY + "\n" + BARE, '{\n  "name": "mul"', '{\n\n\n\n\n\n\n\n\n\n"name": "add"',
      '{"name": "add", "arguments": {"a": 1, "b": 2}' + "\n" * 12 + "}"]),
    ("auto", False, ["text", CALL], [CALL + "\n" + CALL2]),
    ("auto", None, ["text", CALL], [CALL + "\n" + CALL2]),  # unset: one call (plan's default)
    ("required", True, [CALL, CALL2 + "\n" + CALL], ["text", "", "a" + CALL]),
    ("required", False, [CALL2], [CALL + "\n" + CALL2]),
    ({"type": "function", "function": {"name": "add"}}, True, [CALL], [CALL2, CALL + "\n" + CALL, "x"]),
])
def test_each_tool_choice_constrains_the_output(make, choice, parallel, accepted, refused):
    pipe = make(draft=None)
    c = (plan(TOOLS, choice) if parallel is None else plan(TOOLS, choice, parallel)).constraint
    for text in accepted:
        assert _accepts(pipe, c, text), text
    for text in refused:
        assert not _accepts(pipe, c, text), text


def test_tags_spelled_as_text_open_a_constrained_call_too(default_bundle):
    """A tokenizer without tag tokens (the default bundle's): the tag is text, the call starts
    at its first occurrence (a lazy lexeme), and free text cannot hold it otherwise."""
    from specrt.runtime.bundle.manifest import load_manifest
    from specrt.runtime.sampling.grammar import Constraint, Grammars

    man = load_manifest(default_bundle)
    g = Grammars(default_bundle / man.tokenizer.file, man.target.vocab_size, man.tokenizer.eos_token_ids)
    from tokenizers import Tokenizer

    hf = Tokenizer.from_file(str(default_bundle / man.tokenizer.file))
    for choice, text, ok in [("auto", "hi " + CALL, True), ("auto", "plain", True), ("required", CALL, True),
                             ("auto", '<tool_call>\n{"name": "mul", "arguments": {}}', False),
                             ("required", "hi", False)]:
        c = Constraint.lark(tool_grammar([Function("add", ADD)], choice, True, tag_tokens=False))
        m = g.matcher(g.compile(c))
        t = hf.encode(text, add_special_tokens=False).ids
        assert (m.valid_prefix(t) == len(t)) == ok, (choice, text)


# ---- parsing and streaming ----------------------------------------------------------------------

def _ids():
    n = iter(range(100))
    return lambda: f"call_{next(n)}"


TEXTS = [
    "plain text, no call",
    CALL,
    "Let me add.\n" + CALL,
    CALL + "\n" + CALL2 + "\n",
    "  lead " + CALL2 + " tail",
    '<tool_call>\n{"name": "mul", "arguments": {"x": 1}}\n</tool_call>',  # not offered: content
    '<tool_call>\n{"name": "add", "arguments": {"a": 1,}}\n</tool_call>',  # not JSON: content
    '<tool_call>\n{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}\n</tool_call>',  # arguments as a string
    '<tool_call>{"name":"add","arguments":{"a":1,"b":{"c":"}\\""}}}</tool_call>',  # compact, braces in a string
    '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}',  # no closing tag: the end closes it
    "text with <tool_ca",  # a partial tag at the end is content
    '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b"',  # cut off by the token budget
    "a < b and <tool> </tool_call>",
    "```json\n" + BARE + "\n```",  # a bare call, fenced: one call
    "  " + BARE + "\nthen text",  # bare at the start: a call, the rest content
    '```json\n{"name": "mul", "arguments": {}}\n```',  # not offered: content
    "Here: " + BARE,  # not at the start: content
    "```json\n" + PRETTY + "\n```",  # pretty-printed and fenced: one call
    "\n" + PRETTY + "\nok",  # pretty-printed, bare
    '```json\n{\n  "name": "add",\n  "arguments": {"a": 1, "b',  # a bare call cut by the budget: content
    '```python\nprint(1)\n```',  # another fence: content
    '{"b": 1}',  # another object: content
]


def _split(text: str, rng) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(0, 12)))) if len(text) > 1 else []
    return [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)]


def _reassemble(deltas) -> tuple[str, list[dict]]:
    """What the openai SDK does with streamed deltas: content concatenated, calls by index."""
    content, calls = "", {}
    for d in deltas:
        content += d.content
        for c in d.calls:
            call = calls.setdefault(c.index, {"id": None, "name": None, "arguments": ""})
            assert (c.id is None) == (call["id"] is not None), "the id comes once, in the call's first delta"
            call["id"] = call["id"] or c.id
            call["name"] = call["name"] or c.name
            call["arguments"] += c.arguments
    assert sorted(calls) == list(range(len(calls)))  # a dense index from 0
    return content, [calls[i] for i in sorted(calls)]


@pytest.mark.parametrize("constrained", [False, True])
@pytest.mark.parametrize("text", TEXTS)
def test_streamed_pieces_reassemble_to_the_whole_parse(text, constrained):
    content, calls = parse(text, NAMES, constrained, _ids())
    want = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in calls]
    rng = random.Random(hash(text) % 1000)
    for _ in range(25):  # many-token steps: any split of the text, one piece per step
        p = CallParser(NAMES, constrained, _ids())
        got_content, got = _reassemble([p.push(piece) for piece in _split(text, rng)] + [p.flush()])
        assert got == want and got_content == (content or "")


PIECES = ["hi", " ", "\n", "  \n", "<tool_call>", "</tool_call>", "<tool_", "call>", '\n{"name": "add", "arguments": ',
          '{"a": 1, "b": 2}', "}\n", '{"x": "}\\""}', '{"name": "mul", "arguments": {}}', "<", ">", '"', "\\", "{", "}",
          "```json\n", "\n```", '{"name": "add"', ', "arguments": ', '{\n  "name": "add",\n  ', "```"]


@pytest.mark.parametrize("constrained", [False, True])
def test_random_texts_parse_alike_under_any_split_and_keep_their_text(constrained):
    """Texts made of tags, headers, JSON pieces, whitespace: any split parses as the whole
    does, and a text with no call comes back as its content unchanged."""
    rng = random.Random(1)
    for _ in range(3000):
        text = "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 14)))
        content, calls = parse(text, NAMES, constrained, _ids())
        if not calls:
            assert content == text
        p = CallParser(NAMES, constrained, _ids())
        got_content, got = _reassemble([p.push(piece) for piece in _split(text, rng)] + [p.flush()])
        assert got == [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in calls], text
        assert got_content == (content or ""), text


def test_parse_results():
    assert parse(TEXTS[0], NAMES) == (TEXTS[0], [])
    content, calls = parse("Let me add.\n" + CALL, NAMES)
    assert content == "Let me add." and [(c.name, json.loads(c.arguments)) for c in calls] == [("add", {"a": 1, "b": 22})]
    content, calls = parse(CALL + "\n" + CALL2 + "\n", NAMES, True)
    assert content is None and [c.name for c in calls] == ["add", "get_weather"] and len({c.id for c in calls}) == 2
    for bad in TEXTS[5:7]:
        assert parse(bad, NAMES) == (bad, [])  # returned as plain content
    assert json.loads(parse(TEXTS[7], NAMES)[1][0].arguments) == {"a": 1, "b": 2}
    assert json.loads(parse(TEXTS[8], NAMES)[1][0].arguments) == {"a": 1, "b": {"c": '}"'}}
    assert parse(TEXTS[10], NAMES) == (TEXTS[10], [])
    for constrained in (True, False):  # a call cut by the budget is never a call (broken JSON): content
        assert parse(TEXTS[11], NAMES, constrained) == (TEXTS[11], [])
        assert parse(CALL + "\n" + TEXTS[11], NAMES, constrained)[1][0].name == "add"  # the whole call before it is
    for text in TEXTS[17:19]:
        assert [(c.name, json.loads(c.arguments)) for c in parse(text, NAMES)[1]] == [("add", {"a": 1, "b": 2})]
    assert parse(TEXTS[18], NAMES)[0] == "ok"
    for text in TEXTS[19:22]:
        assert parse(text, NAMES) == (text, [])
    for text, content in [(TEXTS[13], None), (TEXTS[14], "then text")]:
        got, calls = parse(text, NAMES)
        assert got == content and [(c.name, json.loads(c.arguments)) for c in calls] == [("add", {"a": 1, "b": 2})]
    assert parse(TEXTS[15], NAMES) == (TEXTS[15], []) and parse(TEXTS[16], NAMES) == (TEXTS[16], [])


def test_a_partial_tag_is_held_back_until_resolved():
    p = CallParser(NAMES, True)
    assert p.push("Sure <tool_").content == "Sure"
    d = p.push('call>\n{"name": "ad')
    assert d.content == "" and not d.calls  # the header may still name `add`
    d = p.push('d", "arguments": {"a": 3')
    assert not d  # the call goes out whole, once its arguments are complete JSON
    d = p.push(', "b": 4}}\n</tool_call>')
    assert [(c.index, c.name, c.arguments) for c in d.calls] == [(0, "add", '{"a": 3, "b": 4}')]
    assert d.calls[0].id and p.flush().content == ""
    p = CallParser(NAMES)
    assert p.push("x <tool").content == "x" and p.push("box>").content == " <toolbox>"


# ---- through the engine: exact under speculation ------------------------------------------------

def _messages(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt}]


@contextlib.contextmanager
def _bias_to_call(pipe, prompt_ids, by: float = 30.0):
    """Make the fake target open a call after the prompt's last token (the draft, a noisy
    copy, does not know: its proposals there get rejected); undone on exit."""
    a = pipe.parts.target.table.A
    a[prompt_ids[-1], OPEN_ID] += by
    try:
        yield
    finally:
        a[prompt_ids[-1], OPEN_ID] -= by


def _check_calls(result) -> None:
    for c in result.tool_calls:
        jsonschema.validate(json.loads(c.arguments), SCHEMAS[c.name])


CHOICES = [("auto", True), ("required", True), ("required", False), ({"type": "function", "function": {"name": "add"}}, True)]


@pytest.mark.parametrize("kind", ["self", "separate"])
@pytest.mark.parametrize("draft,adaptive", MODES)
def test_greedy_speculation_with_tools_equals_target_only(make, kind, draft, adaptive):
    pipe = make(MINI_TEMPLATE, draft=kind, noise=0.4)
    drafted, outcomes = 0, set()
    for choice, parallel in CHOICES:
        for prompt, biased in (("add two numbers", True), ("weather in paris", False)):
            msgs = _messages(prompt)
            prompt_ids, p = prepare(pipe.tokenizer, msgs, TOOLS, choice, parallel)
            with _bias_to_call(pipe, prompt_ids) if biased else contextlib.nullcontext():
                want = constrained_reference(pipe, p.constraint, prompt_ids, 80)
                for _ in range(2):  # the second run reuses the first one's prompt rows (prefix cache)
                    r = pipe.chat(msgs, tools=TOOLS, tool_choice=choice, parallel_tool_calls=parallel,
                                  max_new_tokens=80, k=4, draft=draft, adaptive=adaptive)
                    assert r.token_ids == want, (pipe.tokenizer.decode(r.token_ids), pipe.tokenizer.decode(want))
                    _check_calls(r)
                    drafted += r.stats.draft_tokens
            outcomes.add((choice if isinstance(choice, str) else "named", bool(r.tool_calls)))
            if choice != "auto":
                assert r.tool_calls and (r.finish_reason == "tool_calls" or parallel)
                assert parallel or len(r.tool_calls) == 1
            if isinstance(choice, dict):
                assert {c.name for c in r.tool_calls} == {"add"}
    # the cases happened: auto answered text once and called once
    assert outcomes == {("auto", False), ("auto", True), ("required", True), ("named", True)}, outcomes
    assert drafted > 0 or draft == "none"


def test_auto_opens_a_call_where_the_model_does(make):
    pipe = make(MINI_TEMPLATE, draft="self", noise=0.3)
    msgs = _messages("add two numbers")
    prompt_ids, _ = prepare(pipe.tokenizer, msgs, TOOLS)
    plain = pipe.chat(msgs, tools=TOOLS, max_new_tokens=40, k=3)
    # either text, or a parsed call, or a call the budget cut (its text is content: never broken JSON)
    assert OPEN_ID not in plain.token_ids or plain.tool_calls or plain.finish_reason == "length"
    with _bias_to_call(pipe, prompt_ids):
        r = pipe.chat(msgs, tools=TOOLS, max_new_tokens=80, k=3)
    assert r.token_ids[0] == OPEN_ID and r.tool_calls and r.finish_reason in ("tool_calls", "length")
    _check_calls(r)


def test_stream_chat_reassembles_to_chat(make):
    pipe = make(MINI_TEMPLATE, draft="self", noise=0.3)
    msgs = _messages("add two numbers")
    prompt_ids, _ = prepare(pipe.tokenizer, msgs, TOOLS)
    with _bias_to_call(pipe, prompt_ids):
        whole = pipe.chat(msgs, tools=TOOLS, tool_choice="required", max_new_tokens=80, k=6)
        out: list = []
        deltas = list(pipe.stream_chat(msgs, tools=TOOLS, tool_choice="required", max_new_tokens=80, k=6,
                                       result=out))
    content, calls = _reassemble(deltas)
    assert [(c["name"], c["arguments"]) for c in calls] == [(c.name, c.arguments) for c in whole.tool_calls]
    assert (content or None) == whole.content and out[0].token_ids == whole.token_ids
    assert whole.tool_calls and all(len(d.calls) <= 1 for d in deltas)  # each call sent whole, once complete
