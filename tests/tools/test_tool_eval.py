"""tools/tool_eval.py on the NumPy fake with a tool template (tests/toolfakes.py), and the shape
of its workload: every tool set compiles under every tool_choice, forced calls validate, the
rates are computed from the replies."""

from __future__ import annotations

import json

import pytest
from tool_eval import WORKLOAD, _messages, _table, evaluate, evaluate_http, summarize

from fakes import fake_pipeline
from specrt.runtime.text.toolcalls import plan
from toolfakes import MINI_TEMPLATE, tool_tokens
from toolfakes import ToolServer as _Server

BOUNDED = {"type": "object", "additionalProperties": False, "required": ["a"],
           "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}}}
TOOLS = [{"type": "function", "function": {"name": n, "parameters": BOUNDED}} for n in ("add", "mul", "neg")]
ROWS = [{"id": "a", "prompt": "add", "expect": "add", "tools": TOOLS},
        {"id": "b", "prompt": "mul", "expect": "mul", "tools": TOOLS},
        {"id": "c", "prompt": "say hi", "expect": None, "tools": TOOLS}]


def _rows():
    return [json.loads(line) for line in WORKLOAD.read_text().splitlines() if line.strip()]


def test_the_workload_has_enough_prompts_and_every_tool_set_compiles(tmp_path):
    rows = _rows()
    assert len(rows) >= 26 and all(len(r["tools"]) >= 3 for r in rows)
    assert sum(bool(r["expect"]) for r in rows) >= 20 and len({r["id"] for r in rows}) == len(rows)
    assert sum(not r["expect"] for r in rows) >= 10  # enough to measure "no call where none is needed"
    pipe = fake_pipeline(tmp_path, tokens=tool_tokens(MINI_TEMPLATE), draft=None)
    try:
        for r in rows:
            names = [t["function"]["name"] for t in r["tools"]]
            assert r["expect"] in names + [None]
            for choice in ("auto", "required", {"type": "function", "function": {"name": names[0]}}):
                pipe.grammars.compile(plan(r["tools"], choice).constraint)
    finally:
        pipe.close()


@pytest.mark.parametrize("draft", ["none", "model"])
def test_evaluate_scores_each_arm(tmp_path, draft):
    pipe = fake_pipeline(tmp_path, tokens=tool_tokens(MINI_TEMPLATE), draft="self")
    try:
        res = evaluate(pipe, ROWS, tokens=60, repeats=2, temperature=0.0, draft=draft, k=3)
    finally:
        pipe.close()
    s = res["summary"]
    for arm in ("required", "named"):  # forced calls: valid, and the reply ends after its one call
        assert s[arm]["schema_valid"] == 1.0 and s[arm]["proper_end"] == 1.0 and s[arm]["calls_mean"] == 1.0, s[arm]
    assert s["named"]["expected_function"] == 1.0  # the named call is the expected one
    assert s["named"]["replies"] == 4 and s["required"]["replies"] == 6  # named: prompts that expect a call
    assert s["named_nogrammar"]["replies"] == 4 and s["required_nogrammar"]["replies"] == 6
    for arm in ("plain", "auto", "auto_nogrammar", "required_nogrammar"):
        assert 0.0 <= s[arm]["called_where_needed"] <= 1.0 and s[arm]["tokens_per_s_median"] > 0
        assert 0.0 <= s[arm]["not_called_where_not"] <= 1.0
    assert s["plain"]["called_where_needed"] == 0.0 and s["plain"]["not_called_where_not"] == 1.0  # no tools
    assert s["required"]["mask_ms_per_token_median"] > 0 and s["plain"]["mask_ms_per_token_median"] == 0
    assert s["required_nogrammar"]["mask_ms_per_token_median"] == 0  # no grammar, no masks
    assert s["auto_tokens_per_s_vs_plain"] > 0 and s["auto_tokens_per_s_vs_auto_nogrammar"] > 0
    # a self-draft adopts the target's rows: it reads no prompt (a separate draft's reading is timed)
    assert s["plain"]["draft_reading_s_median"] == s["auto"]["draft_reading_s_median"] == 0


def test_the_grammars_own_cost_is_read_where_it_changed_no_reply():
    """auto against auto without the grammar over the prompts whose replies are the same under
    both (every repeat): a prompt where the grammar changed the reply is left out."""
    def reply(i, arm, content, tps, tokens=5):
        return {"id": i, "arm": arm, "content": content, "calls": [], "finish_reason": "stop", "valid": False,
                "expected": False, "tokens": tokens, "tokens_per_s": tps, "mask_ms_per_token": 0.0}

    replies = [reply("c", "auto", "hi", 9.0), reply("c", "auto_nogrammar", "hi", 10.0),
               reply("c", "auto", "hi", 9.0), reply("c", "auto_nogrammar", "hi", 10.0),
               reply("a", "auto", "x", 1.0), reply("a", "auto_nogrammar", "y", 20.0),  # another reply
               reply("b", "auto", "z", 1.0), reply("b", "auto_nogrammar", "z", 20.0, tokens=6)]  # other tokens
    s = summarize(replies, ROWS)
    assert s["auto_vs_nogrammar_same_replies"] == {"prompts": 1, "ratio": 0.9}
    assert "where the replies are the same (1 prompts): 0.900" in _table(s)


def test_a_system_message_goes_before_the_prompt_only_when_given():
    user = {"role": "user", "content": "add"}
    assert _messages(ROWS[0]) == [user]  # the template's own system prompt
    assert _messages({**ROWS[0], "system": "be brief"}) == [{"role": "system", "content": "be brief"}, user]


def test_the_same_prompts_against_a_server(tmp_path):
    """--base-url: the workload through the official client against a real server (here specrt
    serve over the fake; llama-server in the measurement); the arms a server has, same rates."""
    import openai

    s = _Server(fake_pipeline(tmp_path, tokens=tool_tokens(MINI_TEMPLATE), draft="self"))
    try:
        res = evaluate_http(s.client, "fake", ROWS, tokens=60)
        local = evaluate(s.pipe, ROWS, tokens=60, temperature=0.0, arms=("required", "named"))
    finally:
        s.stop()
    got = res["summary"]
    assert set(got) >= {"plain", "auto", "required", "named"} and "auto_nogrammar" not in got
    for arm in ("required", "named"):
        assert got[arm]["schema_valid"] == local["summary"][arm]["schema_valid"] == 1.0
        assert [(x["id"], x["calls"]) for x in res["replies"] if x["arm"] == arm] == [
            (x["id"], [{"name": c["name"], "arguments": c["arguments"]} for c in x["calls"]])
            for x in local["replies"] if x["arm"] == arm]
    assert isinstance(s.client, openai.OpenAI)
