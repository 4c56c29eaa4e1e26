"""Speculation at long context (issue 38): target-only against the default (adaptive drafting)
and against other draft windows, on code prompts of 1k-14k tokens, arms interleaved per prompt.

    python tools/long_context.py --engines engines/coder --workload configs/workloads/long_code.jsonl \
        --windows 512,none --max-new-tokens 160 --out bench/long_context.json

Per prompt and arm: the whole request's ms per new token, TTFT (the target reading the prompt),
decode ms per token after the first (TPOT), the draft's own prompt reading, acceptance, tokens
per round, and whether the tokens equal target-only's (greedy: they must). One pipeline, no
prefix reuse (every arm reads its prompt cold); a window arm sets the drafter's window for its
requests only. Numbers go to docs/benchmarks.md §18.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

import specrt


def arms(windows: list[int | None]) -> list[tuple[str, dict, int | None]]:
    out = [("target-only", {"draft": "none"}, None)]
    out += [(f"window {w or 'none'}", {}, w) for w in windows]
    return out


def run_one(pipe, ids: list[int], kw: dict, window: int | None, new: int) -> dict:
    pipe.scheduler.make_drafter.window = pipe.store.draft_window = window  # this arm's requests only (serial)
    st = specrt.runtime.Stats()
    t0 = time.perf_counter()
    toks = [t for c in pipe.stream_ids(ids, max_new_tokens=new, ignore_eos=True, stats=st, **kw) for t in c]
    wall = time.perf_counter() - t0
    return {"tokens": toks, "ms_per_token": 1000 * wall / len(toks), "ttft_ms": st.ttft_ms, "tpot_ms": st.tpot_ms,
            "draft_prefill_ms": st.draft_prefill_ms, "acceptance": st.acceptance_rate,
            "per_round": st.mean_accepted_per_round, "rounds": st.rounds, "drafted": st.draft_tokens}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engines", default="engines/coder")
    ap.add_argument("--workload", default="configs/workloads/long_code.jsonl")
    ap.add_argument("--windows", default="512,none", help="draft windows of the speculative arms")
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--out", default="bench/long_context.json")
    a = ap.parse_args()
    windows = [None if w == "none" else int(w) for w in a.windows.split(",")]
    pipe = specrt.load(a.engines, prefix_cache=False, hugepages=False)  # 4 slots: adaptive by default
    pipe.store.costs()  # the call-cost probe (or its cache) before any timed request
    prompts = [json.loads(line) for line in open(a.workload)]
    rows = []
    for p in prompts[: a.limit]:
        ids = pipe.tokenizer.encode(p["prompt"], chat=True)
        if len(ids) + a.max_new_tokens > pipe.max_seq_len:
            print(f"{p['id']}: {len(ids)} tokens + {a.max_new_tokens} exceed max_seq_len {pipe.max_seq_len}: skipped")
            continue
        res = {name: run_one(pipe, ids, kw, w, a.max_new_tokens) for name, kw, w in arms(windows)}
        ref = res["target-only"]["tokens"]
        for name, r in res.items():
            r["same"] = r.pop("tokens") == ref
            rows.append({"id": p["id"], "prompt_tokens": len(ids), "arm": name, **r})
            print(json.dumps(rows[-1]), flush=True)
    pipe.close()
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(rows, indent=1))
    print(table(rows))


def table(rows: list[dict]) -> str:
    """Markdown: per arm, the means over prompts and the ratios against target-only."""
    base = {r["id"]: r for r in rows if r["arm"] == "target-only"}
    lines = ["| arm | whole request ms/token | vs target-only | TTFT s | TPOT ms | decode vs target-only | "
             "draft reading s | acceptance | tokens/round | same tokens |", "|---|---|---|---|---|---|---|---|---|---|"]
    for arm in dict.fromkeys(r["arm"] for r in rows):
        rs = [r for r in rows if r["arm"] == arm]
        whole = np.mean([base[r["id"]]["ms_per_token"] / r["ms_per_token"] for r in rs])
        dec = np.mean([base[r["id"]]["tpot_ms"] / r["tpot_ms"] for r in rs])
        lines.append(f"| {arm} | {np.mean([r['ms_per_token'] for r in rs]):.1f} | {whole:.2f}x | "
                     f"{np.mean([r['ttft_ms'] for r in rs]) / 1000:.1f} | {np.mean([r['tpot_ms'] for r in rs]):.1f} | "
                     f"{dec:.2f}x | {np.mean([r['draft_prefill_ms'] for r in rs]) / 1000:.2f} | "
                     f"{np.mean([r['acceptance'] for r in rs]):.2f} | {np.mean([r['per_round'] for r in rs]):.2f} | "
                     f"{sum(r['same'] for r in rs)}/{len(rs)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
