"""Two bundles of the same pair side by side (e.g. kernel graphs on QMatMulGGML against QMatMul4/8,
docs/benchmarks.md §28): one request at a time, the bundles taking turns per prompt and arm.

    python tools/bundle_ab.py engines/coder engines/coder-q48 --workload configs/workloads/code.jsonl \
        --max-new-tokens 256 --out bench/bundle_ab.json

Arms per bundle: target-only (draft none) and speculative (the bundle's draft, its default k,
adaptive off: one request). Per prompt and arm: ms per new token over the whole request, TPOT
(decode ms per token after the first), TTFT, and whether speculative output equals that bundle's
target-only output (greedy: it must). Medians per bundle and arm, and each ratio B / A.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
from pathlib import Path

import specrt


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def run(pipe, prompt: str, draft: str, new: int) -> dict:
    res = pipe.generate(prompt, max_new_tokens=new, temperature=0.0, draft=draft, ignore_eos=True)
    s = res.stats
    return {"ms_per_token": 1000 / s.tokens_per_s if s.tokens_per_s else None, "tpot_ms": s.tpot_ms,
            "ttft_ms": s.ttft_ms, "tokens": list(res.token_ids), "acceptance": s.acceptance_rate}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--workload", default="configs/workloads/code.jsonl")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--out", default="bench/bundle_ab.json")
    args = ap.parse_args()
    prompts = [json.loads(line)["prompt"] for line in Path(args.workload).read_text().splitlines() if line.strip()]
    prompts = prompts[: args.prompts]
    pipes = {name: specrt.load(name, max_batch=1, adaptive=False) for name in (args.a, args.b)}
    forms = {name: p.parts.kernel_form for name, p in pipes.items()}
    rows = []
    for i, prompt in enumerate(prompts):
        for draft in ("none", "model"):
            order = (args.a, args.b) if i % 2 == 0 else (args.b, args.a)
            for name in order:
                r = run(pipes[name], prompt, draft, args.max_new_tokens)
                rows.append({"prompt": i, "bundle": name, "arm": draft, **r})
                print(f"prompt {i} {draft:5s} {name}: {r['ms_per_token']:.1f} ms/token, TPOT {r['tpot_ms']:.1f}", flush=True)
    summary = {}
    for name in (args.a, args.b):
        for draft in ("none", "model"):
            mine = [r for r in rows if r["bundle"] == name and r["arm"] == draft]
            summary[f"{name} {draft}"] = {k: statistics.median(r[k] for r in mine) for k in ("ms_per_token", "tpot_ms", "ttft_ms")}
        plain = {r["prompt"]: r["tokens"] for r in rows if r["bundle"] == name and r["arm"] == "none"}
        summary[f"{name} exact"] = all(r["tokens"] == plain[r["prompt"]] for r in rows
                                       if r["bundle"] == name and r["arm"] == "model")
    for draft in ("none", "model"):
        a, b = summary[f"{args.a} {draft}"], summary[f"{args.b} {draft}"]
        summary[f"B/A {draft}"] = {k: b[k] / a[k] for k in a}
    out = {"cpu": cpu_name(), "kernel_forms": forms, "args": vars(args), "summary": summary, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(json.dumps({"cpu": out["cpu"], "kernel_forms": forms, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
