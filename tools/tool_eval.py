"""How well tool calls come out on a bundle whose template has tools (issues 28 and 36).

    python tools/tool_eval.py --engines engines/coder --tokens 256 --out bench/tool_eval.json
    python tools/tool_eval.py --base-url http://127.0.0.1:8080/v1 --out bench/tool_eval_llama.json

Over configs/workloads/tools.jsonl (prompts with several tools each; `expect`: the function a
prompt needs, null when it needs none), greedy, one user turn each. The first form runs the
bundle in this process through `Pipeline.chat` (runtime/text/chat.py), each tool_choice with
the grammar and without it (`tool_grammar=False`: the model unaided, the same prompt); the
second runs the same prompts against any OpenAI-compatible server (llama-server `--jinja`,
specrt serve) through the official client. Per arm (tool_choice x grammar):
  * schema_valid: on prompts that need a call, the share of replies with calls that all name an
    offered function and validate against its schema (jsonschema); goal 100% for required and
    named;
  * proper_end: the share of replies that ended by themselves (finish_reason not "length"):
    a reply of calls after its calls, text at EOS; goal 100% for required and named;
  * called_where_needed / expected_function: on prompts that need a call, the share with a
    parsed call / whose first call is the expected function (goal >= 90% for auto);
  * not_called_where_not: on prompts that need none, the share answered without a call (goal
    >= 90% for auto); calls_mean: calls per reply;
  * tokens_per_s_median, and auto against the same prompts without tools (the goal: tools cost
    <= 5% of tokens/s), and auto against auto without the grammar (the grammar's own cost where
    both write the same reply); in-process also the time spent on grammar masks per token (the
    target's and the draft's). Tokens/s is decode time, which includes a separate draft's reading
    of the prompt in its first round (the tool definitions make a prompt ~400 tokens longer;
    docs/benchmarks.md §20): in-process, `draft_reading_s_median` is that reading.
Arms run interleaved per prompt (A B ... B A over the repeats), so machine load hits them alike.
Prints a table and writes JSON (--out) with every reply.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import jsonschema
from feature_costs import timed_masks  # tools/ runs as files: its folder is on sys.path

WORKLOAD = Path(__file__).resolve().parent.parent / "configs" / "workloads" / "tools.jsonl"
CHOICES = ("auto", "required", "named")
ARMS = ("plain", "auto", "auto_nogrammar", "required", "required_nogrammar", "named", "named_nogrammar")


def _arm_kw(arm: str, row: dict) -> dict | None:
    """The tools arguments of one arm (None: the arm does not apply to this prompt)."""
    if arm == "plain":
        return {}
    choice = arm.removesuffix("_nogrammar")
    if choice == "named":
        if not row.get("expect"):
            return None
        choice = {"type": "function", "function": {"name": row["expect"]}}
    return {"tools": row["tools"], "tool_choice": choice, "tool_grammar": not arm.endswith("_nogrammar")}


def _valid(calls: list[tuple[str, str]], row: dict) -> bool:
    """Calls were made, each names an offered function and its arguments validate."""
    schemas = {t["function"]["name"]: t["function"].get("parameters") or {} for t in row["tools"]}
    try:
        for name, arguments in calls:
            jsonschema.validate(json.loads(arguments), schemas[name])
    except (KeyError, ValueError, jsonschema.ValidationError):
        return False
    return bool(calls)


def _reply(row: dict, arm: str, content, calls, finish: str, n: int, tokens_per_s: float, **extra) -> dict:
    return {"id": row["id"], "arm": arm, "content": content, "finish_reason": finish,
            "calls": [{"name": c, "arguments": a} for c, a in calls], "valid": _valid(calls, row),
            "expected": bool(calls) and calls[0][0] == row["expect"], "tokens": n, "tokens_per_s": tokens_per_s,
            **extra}


def _messages(row: dict) -> list[dict]:
    """The conversation: the prompt as one user turn, after the row's system message if it has one
    (--system; none: the template's default system prompt)."""
    user = [{"role": "user", "content": row["prompt"]}]
    return [{"role": "system", "content": row["system"]}, *user] if row.get("system") else user


def run_one(pipe, row: dict, arm: str, tokens: int, spent: list, **kw) -> dict | None:
    """One prompt under one arm, in this process."""
    tool_kw = _arm_kw(arm, row)
    if tool_kw is None:
        return None
    before = spent[0]
    r = pipe.chat(_messages(row), max_new_tokens=tokens, **tool_kw, **kw)
    n = len(r.token_ids)
    return _reply(row, arm, r.content, [(c.name, c.arguments) for c in r.tool_calls], r.finish_reason, n,
                  r.stats.tokens_per_s, mask_ms_per_token=1e3 * (spent[0] - before) / max(n, 1),
                  acceptance=r.stats.acceptance_rate, draft_reading_s=r.stats.draft_prefill_ms / 1e3)


def run_http(client, model: str, row: dict, arm: str, tokens: int) -> dict | None:
    """One prompt under one arm against an OpenAI-compatible server (no grammar switch there:
    the server's own behaviour; tokens/s over the whole request)."""
    tool_kw = _arm_kw(arm, row)
    if tool_kw is None or not tool_kw.pop("tool_grammar", True):
        return None
    t0 = time.perf_counter()
    r = client.chat.completions.create(model=model, messages=_messages(row),
                                       max_tokens=tokens, temperature=0, **tool_kw)
    wall = time.perf_counter() - t0
    msg, n = r.choices[0].message, r.usage.completion_tokens
    calls = [(c.function.name, c.function.arguments) for c in msg.tool_calls or []]
    return _reply(row, arm, msg.content, calls, r.choices[0].finish_reason, n, n / wall if wall > 0 else 0.0,
                  mask_ms_per_token=0.0)


def _share(flags: list[bool]) -> float | None:
    return sum(flags) / len(flags) if flags else None


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


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
            "schema_valid": _share([x["valid"] for x in call]),
            "proper_end": _share([x["finish_reason"] != "length" for x in got]),
            "called_where_needed": _share([bool(x["calls"]) for x in call]),
            "expected_function": _share([x["expected"] for x in call]),
            "not_called_where_not": _share([not x["calls"] for x in free]),
            "calls_mean": statistics.mean(len(x["calls"]) for x in got),
            "tokens_per_s_median": _median([x["tokens_per_s"] for x in got]),
            "mask_ms_per_token_median": _median([x["mask_ms_per_token"] for x in got]),
            "draft_reading_s_median": _median([x["draft_reading_s"] for x in got if "draft_reading_s" in x]),
        }
    for base in ("plain", "auto_nogrammar"):  # tools against none; the grammar against the same prompt without
        if base in out and "auto" in out and out[base]["tokens_per_s_median"]:
            out[f"auto_tokens_per_s_vs_{base}"] = out["auto"]["tokens_per_s_median"] / out[base]["tokens_per_s_median"]
    same = _same_replies(replies, "auto", "auto_nogrammar")
    if same:  # the grammar's own cost: the prompts where it changed nothing in the reply
        a, b = ([x["tokens_per_s"] for x in replies if x["arm"] == arm and x["id"] in same]
                for arm in ("auto", "auto_nogrammar"))
        out["auto_vs_nogrammar_same_replies"] = {"prompts": len(same), "ratio": _median(a) / _median(b)}
    return out


def _same_replies(replies: list[dict], arm_a: str, arm_b: str) -> set[str]:
    """Prompts whose replies under both arms are one and the same (text, calls, token count)."""
    seen: dict[tuple[str, str], set] = {}
    for x in replies:
        if x["arm"] in (arm_a, arm_b):
            seen.setdefault((x["id"], x["arm"]), set()).add(
                (x["content"], json.dumps(x["calls"]), x["tokens"]))
    return {i for (i, arm), v in seen.items()
            if arm == arm_a and len(v) == 1 and seen.get((i, arm_b)) == v}


def _sweep(one, rows: list[dict], repeats: int, arms, progress=None) -> list[dict]:
    """progress(replies so far): called after each prompt (main writes --out then: a run cut
    short keeps what it measured)."""
    replies = []
    for rep in range(repeats):
        order = list(arms) if rep % 2 == 0 else list(reversed(arms))  # A B B A
        for j, row in enumerate(rows):
            replies += [x for x in (one(row, arm) for arm in order) if x is not None]
            print(f"  repeat {rep + 1}/{repeats}, prompt {j + 1}/{len(rows)} ({row['id']})", file=sys.stderr, flush=True)
            if progress is not None:
                progress(replies)
    return replies


def evaluate(pipe, rows: list[dict], tokens: int, repeats: int = 1, arms=ARMS, progress=None, **kw) -> dict:
    spent = timed_masks()
    replies = _sweep(lambda row, arm: run_one(pipe, row, arm, tokens, spent, **kw), rows, repeats, arms, progress)
    return {"summary": summarize(replies, rows), "replies": replies}


def evaluate_http(client, model: str, rows: list[dict], tokens: int, repeats: int = 1, arms=ARMS,
                  progress=None) -> dict:
    replies = _sweep(lambda row, arm: run_http(client, model, row, arm, tokens), rows, repeats, arms, progress)
    return {"summary": summarize(replies, rows), "replies": replies}


def _table(summary: dict) -> str:
    cols = ("schema_valid", "proper_end", "called_where_needed", "expected_function", "not_called_where_not",
            "calls_mean", "tokens_per_s_median", "mask_ms_per_token_median", "draft_reading_s_median")
    fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    lines = [f"{'arm':>20} " + " ".join(f"{c[:14]:>14}" for c in cols)]
    for arm, s in summary.items():
        if arm in ARMS:
            lines.append(f"{arm:>20} " + " ".join(f"{fmt(s[c]):>14}" for c in cols))
    for base in ("plain", "auto_nogrammar"):
        if f"auto_tokens_per_s_vs_{base}" in summary:
            lines.append(f"auto tokens/s against {base}: {summary[f'auto_tokens_per_s_vs_{base}']:.3f}")
    if "auto_vs_nogrammar_same_replies" in summary:
        same = summary["auto_vs_nogrammar_same_replies"]
        lines.append(f"auto tokens/s against auto_nogrammar where the replies are the same ({same['prompts']} prompts): "
                     f"{same['ratio']:.3f}")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engines", default="engines/coder")
    ap.add_argument("--base-url", default=None, help="an OpenAI-compatible server instead (e.g. llama-server)")
    ap.add_argument("--model", default=None, help="with --base-url: the model name (default: the server's first)")
    ap.add_argument("--workload", default=str(WORKLOAD))
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--draft", default=None, help="model | none | ngram | auto (default: the bundle's)")
    ap.add_argument("--limit", type=int, default=None, help="only the first N prompts")
    ap.add_argument("--ids", default=None, help="only these prompts (comma-separated ids)")
    ap.add_argument("--draft-window", default=None,
                    help="N | none: committed tokens a separate draft reads to catch up (default: the library's)")
    ap.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    ap.add_argument("--system", default=None, help="a system message before every prompt (default: none, the "
                    "template's own)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)

    rows = [json.loads(line) for line in Path(a.workload).read_text().splitlines() if line.strip()][: a.limit]
    if a.ids:
        wanted = a.ids.split(",")
        missing = set(wanted) - {r["id"] for r in rows}
        if missing:
            raise SystemExit(f"--ids: not in the workload: {sorted(missing)}")
        rows = [r for r in rows if r["id"] in wanted]
    if a.system:
        rows = [{**r, "system": a.system} for r in rows]
    arms = [x for x in a.arms.split(",") if x]
    if set(arms) - set(ARMS):
        raise SystemExit(f"--arms: unknown {sorted(set(arms) - set(ARMS))}")

    def save(result: dict) -> None:
        if a.out:
            Path(a.out).parent.mkdir(parents=True, exist_ok=True)
            Path(a.out).write_text(json.dumps(result, indent=1))

    def progress(replies: list[dict]) -> None:
        save({"summary": summarize(replies, rows), "replies": replies, "partial": True})
    if a.base_url:
        import openai

        client = openai.OpenAI(base_url=a.base_url, api_key="x", max_retries=0, timeout=600)
        result = evaluate_http(client, a.model or client.models.list().data[0].id, rows, a.tokens, a.repeats, arms,
                               progress)
    else:
        import specrt
        from specrt.runtime.text.toolcalls import renders_tools

        window = {} if a.draft_window is None else {
            "draft_window": None if a.draft_window == "none" else int(a.draft_window)}
        with specrt.load(a.engines, draft=a.draft, max_batch=1, hugepages=False, **window) as pipe:
            if not renders_tools(pipe.tokenizer):
                raise SystemExit(f"{a.engines}: its chat template has no tool calling (specrt inspect says so)")
            result = evaluate(pipe, rows, a.tokens, a.repeats, arms, progress, temperature=0.0)
    print(_table(result["summary"]))
    save(result)


if __name__ == "__main__":
    main()
