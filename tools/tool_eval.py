"""How well tool calls come out on a bundle whose template has tools (issue 28's goals).

    python tools/tool_eval.py --engines engines/coder --tokens 256 --out bench/tool_eval.json

Over configs/workloads/tools.jsonl (prompts with several tools each; `expect`: the function a
prompt needs, null when it needs none), greedy, through `Pipeline.chat` (runtime/text/chat.py):
  * "required" and "named" (the expected function): the share of replies whose calls all
    validate against their function's schema (jsonschema) — the goal is 100%;
  * "auto" with the grammar and "auto" without it (`tool_grammar=False`: the model unaided):
    on prompts that need a call, the share with a parsed call and with the expected function
    (goal >= 90% with the grammar); on prompts that need none, the share answered in text;
  * cost: decode tokens/s of "auto" against the same prompts without tools, and the time spent
    computing grammar masks per token (the goal: tools cost <= 5% of tokens/s).
Arms run interleaved per prompt (A B B A over the repeats), so machine load hits them alike.
Prints a table and writes JSON (--out) with every reply.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import jsonschema
from feature_costs import timed_masks  # tools/ runs as files: its folder is on sys.path

WORKLOAD = Path(__file__).resolve().parent.parent / "configs" / "workloads" / "tools.jsonl"
ARMS = ("plain", "auto", "auto_nogrammar", "required", "named")


def _arm_kw(arm: str, row: dict) -> dict | None:
    """The tools arguments of one arm (None: the arm does not apply to this prompt)."""
    if arm == "plain":
        return {}
    if arm == "named":
        return None if not row.get("expect") else {
            "tools": row["tools"], "tool_choice": {"type": "function", "function": {"name": row["expect"]}}}
    choice = "auto" if arm.startswith("auto") else arm
    return {"tools": row["tools"], "tool_choice": choice, "tool_grammar": arm != "auto_nogrammar"}


def _valid(calls, row: dict) -> bool:
    """Every call names an offered function and its arguments validate against its schema."""
    schemas = {t["function"]["name"]: t["function"].get("parameters") or {} for t in row["tools"]}
    try:
        for c in calls:
            jsonschema.validate(json.loads(c.arguments), schemas[c.name])
    except (KeyError, ValueError, jsonschema.ValidationError):
        return False
    return bool(calls)


def run_one(pipe, row: dict, arm: str, tokens: int, spent: list, **kw) -> dict | None:
    tool_kw = _arm_kw(arm, row)
    if tool_kw is None:
        return None
    before = spent[0]
    r = pipe.chat([{"role": "user", "content": row["prompt"]}], max_new_tokens=tokens, **tool_kw, **kw)
    n = len(r.token_ids)
    return {"id": row["id"], "arm": arm, "content": r.content, "finish_reason": r.finish_reason,
            "calls": [{"name": c.name, "arguments": c.arguments} for c in r.tool_calls],
            "valid": _valid(r.tool_calls, row), "expected": bool(r.tool_calls) and r.tool_calls[0].name == row["expect"],
            "tokens": n, "tokens_per_s": r.stats.tokens_per_s, "mask_ms_per_token": 1e3 * (spent[0] - before) / max(n, 1),
            "acceptance": r.stats.acceptance_rate}


def _share(flags: list[bool]) -> float | None:
    return sum(flags) / len(flags) if flags else None


def summarize(replies: list[dict], rows: list[dict]) -> dict:
    """Rates and costs per arm (see the module docstring)."""
    needs = {r["id"] for r in rows if r.get("expect")}
    out = {}
    for arm in ARMS:
        got = [x for x in replies if x["arm"] == arm]
        if not got:
            continue
        call = [x for x in got if x["id"] in needs]
        free = [x for x in got if x["id"] not in needs]
        out[arm] = {
            "replies": len(got),
            "schema_valid": sum(x["valid"] for x in call) / max(len(call), 1),
            # the same among replies the token budget did not cut (a cut call cannot validate)
            "schema_valid_when_complete": _share([x["valid"] for x in call if x["finish_reason"] != "length"]),
            "parsed_call": sum(bool(x["calls"]) for x in call) / max(len(call), 1),
            "expected_function": sum(x["expected"] for x in call) / max(len(call), 1),
            "text_where_no_call_needed": sum(not x["calls"] for x in free) / len(free) if free else None,
            "tokens_per_s_median": statistics.median(x["tokens_per_s"] for x in got),
            "mask_ms_per_token_median": statistics.median(x["mask_ms_per_token"] for x in got),
        }
    if "plain" in out and "auto" in out:
        out["auto_tokens_per_s_vs_plain"] = out["auto"]["tokens_per_s_median"] / out["plain"]["tokens_per_s_median"]
    return out


def evaluate(pipe, rows: list[dict], tokens: int, repeats: int = 1, arms=ARMS, **kw) -> dict:
    spent = timed_masks()
    replies = []
    for rep in range(repeats):
        order = list(arms) if rep % 2 == 0 else list(reversed(arms))  # A B B A
        for j, row in enumerate(rows):
            for arm in order:
                x = run_one(pipe, row, arm, tokens, spent, **kw)
                if x is not None:
                    replies.append(x)
            print(f"  repeat {rep + 1}/{repeats}, prompt {j + 1}/{len(rows)} ({row['id']})", file=sys.stderr, flush=True)
    return {"summary": summarize(replies, rows), "replies": replies}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engines", default="engines/coder")
    ap.add_argument("--workload", default=str(WORKLOAD))
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--draft", default=None, help="model | none | ngram | auto (default: the bundle's)")
    ap.add_argument("--limit", type=int, default=None, help="only the first N prompts")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)

    import specrt

    rows = [json.loads(line) for line in Path(a.workload).read_text().splitlines() if line.strip()][: a.limit]
    with specrt.load(a.engines, draft=a.draft, max_batch=1, hugepages=False) as pipe:
        if not pipe.tokenizer.has_tools:
            raise SystemExit(f"{a.engines}: its chat template has no tool calling (specrt inspect says so)")
        result = evaluate(pipe, rows, a.tokens, a.repeats, temperature=0.0)
    for arm, s in result["summary"].items():
        print(f"{arm:>24}: {s}")
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
