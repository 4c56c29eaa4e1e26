"""tools/tool_eval.py on the NumPy fake with a tool template (tests/toolfakes.py), and the shape
of its workload: every tool set compiles under every tool_choice, forced calls validate, the
rates are computed from the replies."""

from __future__ import annotations

import json

import pytest
from tool_eval import WORKLOAD, evaluate

from fakes import fake_pipeline
from specrt.runtime.text.toolcalls import plan
from toolfakes import MINI_TEMPLATE, tool_tokens

BOUNDED = {"type": "object", "additionalProperties": False, "required": ["a"],
           "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}}}


def _rows():
    return [json.loads(line) for line in WORKLOAD.read_text().splitlines() if line.strip()]


def test_the_workload_has_enough_prompts_and_every_tool_set_compiles(tmp_path):
    rows = _rows()
    assert len(rows) >= 20 and all(len(r["tools"]) >= 3 for r in rows)
    assert sum(bool(r["expect"]) for r in rows) >= 20 and len({r["id"] for r in rows}) == len(rows)
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
    tools = [{"type": "function", "function": {"name": n, "parameters": BOUNDED}} for n in ("add", "mul", "neg")]
    rows = [{"id": "a", "prompt": "add", "expect": "add", "tools": tools},
            {"id": "b", "prompt": "mul", "expect": "mul", "tools": tools},
            {"id": "c", "prompt": "say hi", "expect": None, "tools": tools}]
    pipe = fake_pipeline(tmp_path, tokens=tool_tokens(MINI_TEMPLATE), draft="self")
    try:
        res = evaluate(pipe, rows, tokens=60, repeats=2, temperature=0.0, draft=draft, k=3)
    finally:
        pipe.close()
    s = res["summary"]
    assert s["required"]["schema_valid"] == 1.0 and s["named"]["schema_valid"] == 1.0
    assert s["named"]["schema_valid_when_complete"] == 1.0
    assert s["named"]["expected_function"] == 1.0  # the named call is the expected one
    assert s["named"]["replies"] == 4 and s["required"]["replies"] == 6  # named: prompts that expect a call
    for arm in ("plain", "auto", "auto_nogrammar"):
        assert 0.0 <= s[arm]["parsed_call"] <= 1.0 and s[arm]["tokens_per_s_median"] > 0
    assert s["plain"]["parsed_call"] == 0.0  # no tools, no calls
    assert s["required"]["mask_ms_per_token_median"] > 0 and s["plain"]["mask_ms_per_token_median"] == 0
    assert s["auto_tokens_per_s_vs_plain"] > 0
