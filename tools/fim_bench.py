"""Fill-in-the-middle as editors use it, measured over HTTP: specrt's `/infill` per `--draft` arm
against llama-server's `/infill` on the same GGUF (the same request bodies, the same n_predict).

The workload is one real code file (default: this Python's own `queue.py`, ~2.3k Qwen tokens),
the cursor at several places, two kinds of completion per place:
- line: the cursor a third of the way into a line, the rest of the line removed (n_predict 32);
- block: the cursor on the first line of an indented block (its indentation typed), the block's
  lines removed (n_predict 128);
each sent twice: first, then after a "keystroke" (the first character of the removed text typed,
the same file). Bodies are llama.vscode's: input_prefix = the lines before the cursor's line,
prompt = the cursor's line so far, input_suffix = the rest of the file, greedy. Both servers cut
the file to the same window around the cursor: llama-server's /infill keeps 3/4 of its batch
(`--batch`) of the prefix and 1/4 of the suffix, and specrt gets `--fim-window` to match.

Per arm, kind and phase: median time to the first token (TTFT), time to a complete line (the
first line break, or the end if none), decode tokens/s (after the first token) and cached
prompt tokens. The specrt arms' texts must be equal (greedy speculative = target-only); a
difference is reported and makes the exit status 1.

    python tools/fim_bench.py --engines engines/coder --arms model,ngram,auto,none \\
        --llama-server .cache/llama.cpp/build/bin/llama-server --gguf .cache/models/<target>.gguf \\
        [--llama-draft .cache/models/<draft>.gguf] --out bench/fim.json
"""

from __future__ import annotations

import argparse
import json
import os
import queue as _queue_module
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from specrt.runtime.bench.serve_load import start_server

N_PREDICT = {"line": 32, "block": 128}


@dataclass
class Case:
    kind: str  # "line" | "block"
    line: int  # the cursor's line (0-based)
    prefix: str  # whole lines before the cursor's line
    typed: str  # the cursor's line so far
    suffix: str  # after the cursor
    removed: str  # the text the completion should write

    def body(self, keystroke: bool) -> dict:
        typed = self.typed + (self.removed[:1] if keystroke else "")
        return {"input_prefix": self.prefix, "prompt": typed, "input_suffix": self.suffix,
                "n_predict": N_PREDICT[self.kind], "temperature": 0, "cache_prompt": True, "stream": True,
                "stream_options": {"include_usage": True}}


def _indent(s: str) -> int:
    return len(s) - len(s.lstrip(" \t"))


def line_case(lines: list[str], i: int) -> Case:
    line = lines[i].rstrip("\n")
    cut = _indent(line) + max(1, (len(line) - _indent(line)) // 3)
    return Case("line", i, "".join(lines[:i]), line[:cut], "\n" + "".join(lines[i + 1 :]), line[cut:] + "\n")


def block_case(lines: list[str], i: int) -> Case:
    """i: a line ending with ':'; the block is the lines after it indented deeper."""
    head = _indent(lines[i])
    j = i + 1
    while j < len(lines) and (not lines[j].strip() or _indent(lines[j]) > head):
        j += 1
    first = lines[i + 1]
    pad = first[: _indent(first)]
    return Case("block", i + 1, "".join(lines[: i + 1]), pad, "\n" + "".join(lines[j:]),
                "".join(lines[i + 1 : j])[len(pad) :])


def make_cases(src: str, cursors: int) -> list[Case]:
    """`cursors` places spread over the file's second to last tenth; a line and a block case at each."""
    lines = src.splitlines(keepends=True)
    code = [i for i, ln in enumerate(lines) if len(ln.strip()) > 12 and not ln.strip().startswith(("#", '"', "'"))]
    heads = [i for i, ln in enumerate(lines[:-1]) if ln.rstrip().endswith(":") and lines[i + 1].strip()
             and _indent(lines[i + 1]) > _indent(ln)]
    out = []
    for c in range(cursors):
        at = len(lines) * (1 + c * 8 // max(1, cursors)) // 10
        out.append(line_case(lines, min(code, key=lambda i: abs(i - at))))
        out.append(block_case(lines, min(heads, key=lambda i: abs(i - at))))
    return out


def measure(url: str, body: dict, headers: dict | None = None) -> dict:
    """One streamed /infill -> its times (s), content and counts."""
    t0 = time.perf_counter()
    ttft = t_line = None
    content, final = "", {}
    with httpx.stream("POST", url + "/infill", json=body, headers=headers, timeout=600) as r:
        r.raise_for_status()
        for ln in r.iter_lines():
            if not ln.startswith("data: {"):
                continue
            chunk = json.loads(ln[6:])
            piece = chunk.get("content", "")
            now = time.perf_counter()
            if piece and ttft is None:
                ttft = now - t0
            content += piece
            if t_line is None and "\n" in content.lstrip("\n"):
                t_line = now - t0
            if "tokens_predicted" in chunk:
                final = chunk
    end = time.perf_counter() - t0
    n = final.get("tokens_predicted", 0)
    ttft = end if ttft is None else ttft
    return {"ttft": ttft, "t_line": end if t_line is None else t_line, "total": end, "tokens": n,
            "tps": (n - 1) / (end - ttft) if n > 1 and end > ttft else None, "cached": final.get("tokens_cached"),
            "content": content}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(arm: str, a) -> tuple[subprocess.Popen, str]:
    port = _port()
    if arm == "llama":
        cmd = [a.llama_server, "-m", a.gguf, "--port", str(port), "-c", str(a.ctx), "-np", "1", "-b", str(a.batch),
               "-ub", str(a.batch), "--cache-reuse", "256", "-t", str(a.threads or os.cpu_count())]
        cmd += ["-md", a.llama_draft] if a.llama_draft else []
    else:
        cmd = [sys.executable, "-m", "specrt.cli", "serve", "--engines", a.engines, "--port", str(port), "--draft",
               arm, "--max-batch", "2", "--fim-window", a.fim_window or f"{3 * (a.batch // 4)},{a.batch // 4}"]
        cmd += ["--threads", str(a.threads)] if a.threads else []
    try:
        return start_server(arm, cmd, port, 900)
    except RuntimeError as e:
        raise SystemExit(str(e)) from None


def run_arm(arm: str, cases: list[Case], a) -> list[dict]:
    proc, url = start(arm, a)
    try:
        measure(url, {**cases[0].body(False), "n_predict": 4})  # load pages, warm the kernels
        rows = []
        for ci, case in enumerate(cases):
            for phase in ("first", "keystroke"):
                rows.append({"arm": arm, "case": ci, "kind": case.kind, "phase": phase,
                             **measure(url, case.body(phase == "keystroke"))})
        return rows
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def summarize(rows: list[dict]) -> list[dict]:
    def med(xs):
        xs = [x for x in xs if x is not None]
        return statistics.median(xs) if xs else None

    out = []
    for key in sorted({(r["arm"], r["kind"], r["phase"]) for r in rows}):
        sel = [r for r in rows if (r["arm"], r["kind"], r["phase"]) == key]
        out.append({"arm": key[0], "kind": key[1], "phase": key[2], "n": len(sel),
                    "ttft_ms": 1000 * med([r["ttft"] for r in sel]), "line_ms": 1000 * med([r["t_line"] for r in sel]),
                    "tok_s": med([r["tps"] for r in sel]), "cached": med([r["cached"] for r in sel])})
    return out


def mismatches(rows: list[dict]) -> list[str]:
    """specrt arms whose text differs from --draft none's (or the first arm's) on a request."""
    spec = [r for r in rows if r["arm"] != "llama"]
    ref_arm = "none" if any(r["arm"] == "none" for r in spec) else (spec[0]["arm"] if spec else None)
    ref = {(r["case"], r["phase"]): r["content"] for r in spec if r["arm"] == ref_arm}
    return [f"{r['arm']} case {r['case']} {r['phase']}" for r in spec if r["content"] != ref[(r["case"], r["phase"])]]


def table(summary: list[dict]) -> str:
    lines = [f"{'arm':7} {'kind':6} {'phase':10} {'n':>3} {'TTFT ms':>9} {'line ms':>9} {'tok/s':>7} {'cached':>7}"]
    for s in summary:
        tps = f"{s['tok_s']:7.1f}" if s["tok_s"] is not None else "      -"
        cached = f"{s['cached']:7.0f}" if s["cached"] is not None else "      -"
        lines.append(f"{s['arm']:7} {s['kind']:6} {s['phase']:10} {s['n']:3d} {s['ttft_ms']:9.0f} {s['line_ms']:9.0f} "
                     f"{tps} {cached}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engines", default="engines/coder")
    ap.add_argument("--arms", default="model,ngram,auto,none", help="specrt --draft arms, comma separated")
    ap.add_argument("--file", default=_queue_module.__file__, help="the code file (1-3k tokens)")
    ap.add_argument("--cursors", type=int, default=4)
    ap.add_argument("--llama-server", default=None, help="llama-server binary: adds the 'llama' arm")
    ap.add_argument("--gguf", default=None, help="the target GGUF llama-server loads")
    ap.add_argument("--llama-draft", default=None, help="a draft GGUF for llama-server (-md)")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=1024,
                    help="llama-server's -b/-ub; its /infill keeps 3/4 of it of the prefix and 1/4 of the suffix, so "
                         "specrt's --fim-window is set to the same unless --fim-window is given")
    ap.add_argument("--fim-window", default=None, help="specrt's --fim-window (PREFIX,SUFFIX or none)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default="bench/fim.json")
    a = ap.parse_args(argv)
    cases = make_cases(Path(a.file).read_text(), a.cursors)
    arms = [x for x in a.arms.split(",") if x] + (["llama"] if a.llama_server else [])
    rows = [row for arm in arms for row in run_arm(arm, cases, a)]
    summary, bad = summarize(rows), mismatches(rows)
    print(table(summary))
    print("specrt arms equal token for token" if not bad else "DIFFERENT TEXT: " + "; ".join(bad))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"file": a.file, "arms": arms, "summary": summary, "rows": rows,
                                       "mismatches": bad}, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
