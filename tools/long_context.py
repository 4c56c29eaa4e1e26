"""Speculation at long context (issue 38): target-only against the default (adaptive drafting)
and against other draft windows, on code prompts of 1k-14k tokens, arms interleaved per prompt.

    python tools/long_context.py --engines engines/coder --workload configs/workloads/long_code.jsonl \
        --windows 512,none --max-new-tokens 160 --out bench/long_context.json

Per prompt and arm: the whole request's ms per new token, TTFT (the target reading the prompt),
decode ms per token after the first (TPOT), the draft's own prompt reading, acceptance, tokens
per round, and whether the tokens equal target-only's (greedy: they must). One pipeline, no
prefix reuse (every arm reads its prompt cold); a window arm sets the drafter's window for its
requests only. Numbers go to docs/benchmarks.md §18.

--llama: llama.cpp's llama-server on the target's own GGUF (`make llama-server`; the file found
from the bundle's manifest) as one more arm: the same token ids to its /completion (no prompt
cache, greedy, n_predict the same, EOS ignored), its own timings (prompt_ms: TTFT; predicted_ms
over the tokens after the first: TPOT).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
import urllib.request
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


def start_llama(engines: str, ctx: int, threads: int = 2, port: int = 8097, binary: str | None = None):
    """llama-server (`binary`, default `make llama-server`'s) on the target's GGUF, one slot of
    `ctx` tokens. -> (process, url)."""
    from specrt.runtime.bench.arms import gguf_of, llama_server
    from specrt.runtime.bundle.manifest import load_manifest

    binary, gguf = binary or llama_server(), gguf_of(load_manifest(Path(engines)).target)
    if not binary or not gguf:
        raise SystemExit("--llama needs `make llama-server` and the target's GGUF under .cache/models")
    proc = subprocess.Popen([binary, "-m", gguf, "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
                             "-tb", str(threads), "-c", str(ctx), "--parallel", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit("llama-server did not start")


def run_llama(url: str, ids: list[int], new: int) -> dict:
    body = {"prompt": ids, "n_predict": new, "temperature": 0, "top_k": 1, "cache_prompt": False,
            "ignore_eos": True, "return_tokens": True}
    req = urllib.request.Request(url + "/completion", json.dumps(body).encode(), {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=3600) as r:
        out = json.load(r)
    wall = time.perf_counter() - t0
    t = out["timings"]
    n = max(1, t["predicted_n"])
    return {"tokens": out.get("tokens", []), "ms_per_token": 1000 * wall / n, "ttft_ms": t["prompt_ms"],
            "tpot_ms": t["predicted_ms"] / max(1, n - 1), "draft_prefill_ms": 0.0, "acceptance": 0.0,
            "per_round": 1.0, "rounds": n, "drafted": 0}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engines", default="engines/coder")
    ap.add_argument("--workload", default="configs/workloads/long_code.jsonl")
    ap.add_argument("--windows", default="512,none", help="draft windows of the speculative arms")
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--out", default="bench/long_context.json")
    ap.add_argument("--llama", action="store_true", help="llama-server on the target's GGUF as one more arm")
    ap.add_argument("--ids", default=None, help="comma-separated prompt ids of the workload to run")
    ap.add_argument("--llama-server", action="append", default=[],
                    help="a llama-server binary as an arm (repeat for several builds, e.g. native and AVX2-only; "
                         "implies --llama)")
    a = ap.parse_args()
    windows = [None if w == "none" else int(w) for w in a.windows.split(",")]
    pipe = specrt.load(a.engines, prefix_cache=False, hugepages=False)  # 4 slots: adaptive by default
    pipe.store.costs()  # the call-cost probe (or its cache) before any timed request
    prompts = [json.loads(line) for line in open(a.workload)]
    if a.ids:
        prompts = [p for p in prompts if p["id"] in a.ids.split(",")]
    binaries = a.llama_server or ([None] if a.llama else [])
    llamas = {("llama-server" if len(binaries) == 1 else f"llama-server ({Path(b).parent.parent.name})"):
              start_llama(a.engines, pipe.max_seq_len, port=8097 + i, binary=b) for i, b in enumerate(binaries)}
    rows = []
    for p in prompts[: a.limit]:
        ids = pipe.tokenizer.encode(p["prompt"], chat=True)
        if len(ids) + a.max_new_tokens > pipe.max_seq_len:
            print(f"{p['id']}: {len(ids)} tokens + {a.max_new_tokens} exceed max_seq_len {pipe.max_seq_len}: skipped")
            continue
        res = {name: run_one(pipe, ids, kw, w, a.max_new_tokens) for name, kw, w in arms(windows)}
        for name, (_, url) in llamas.items():
            res[name] = run_llama(url, ids, a.max_new_tokens)
        ref = res["target-only"]["tokens"]
        for name, r in res.items():
            r["same"] = r.pop("tokens") == ref
            rows.append({"id": p["id"], "prompt_tokens": len(ids), "arm": name, **r})
            print(json.dumps(rows[-1]), flush=True)
    pipe.close()
    for proc, _ in llamas.values():
        proc.terminate()
        proc.wait(30)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(rows, indent=1))
    print(table(rows))
    print(per_prompt(rows))


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


def per_prompt(rows: list[dict]) -> str:
    """Markdown: one line per prompt and arm, with prefill tokens/s (prompt tokens / TTFT)."""
    base = {r["id"]: r for r in rows if r["arm"] == "target-only"}
    lines = ["| prompt (tokens) | arm | whole request ms/token | vs target-only | TTFT s | prefill tok/s | TPOT ms | "
             "decode vs target-only | draft reading s | acceptance | tokens/round | same tokens |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        b = base[r["id"]]
        lines.append(f"| {r['id']} ({r['prompt_tokens']}) | {r['arm']} | {r['ms_per_token']:.1f} | "
                     f"{b['ms_per_token'] / r['ms_per_token']:.2f}x | {r['ttft_ms'] / 1000:.1f} | "
                     f"{1000 * r['prompt_tokens'] / r['ttft_ms']:.1f} | {r['tpot_ms']:.1f} | {b['tpot_ms'] / r['tpot_ms']:.2f}x | "
                     f"{r['draft_prefill_ms'] / 1000:.2f} | {r['acceptance']:.2f} | {r['per_round']:.2f} | "
                     f"{'✔' if r['same'] else '✘'} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
