"""specrt-cpp against the Python runtime on the same bundle (issue 51's goal): one request, greedy,
the same token ids, the two taking turns per prompt and drafter.

    python tools/cpp_speed.py engines/coder --prompts 4 --max-new-tokens 128 --out bench/cpp_speed.json

Python: `specrt.load(bundle, max_batch=1, prefix_cache=False)` with its default graphs; C++:
`.cache/cpp/specrt-cpp` (make cpp) with its defaults (the same graphs). Per drafter: median ms
per new token over the whole request (prompt included), the
C++ / Python ratio, and whether the tokens are the same. Each side times its own generate call
(C++: its stats' total_ms; the process start and the bundle's open are not counted).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from functools import partial
from pathlib import Path

import specrt
from specrt.runtime.bundle.manifest import load_manifest
from specrt.runtime.bundle.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parent.parent
CPP = ROOT / ".cache" / "cpp" / "specrt-cpp"


def python_run(pipe, ids: list[int], draft: str, new: int) -> tuple[float, list[int]]:
    t = time.perf_counter()
    out = [x for chunk in pipe.stream_ids(ids, max_new_tokens=new, draft=draft, ignore_eos=True) for x in chunk]
    return 1000 * (time.perf_counter() - t) / len(out), out


def cpp_run(bundle: str, ids: list[int], draft: str, new: int) -> tuple[float, list[int]]:
    r = subprocess.run([str(CPP), bundle, "--prompt-ids", ",".join(map(str, ids)), "--max-new-tokens", str(new),
                        "--draft", draft, "--ignore-eos"], capture_output=True, text=True, check=True)
    d = json.loads(r.stdout)  # its own generate call's time, as Python's is timed: the bundle's open apart
    return d["stats"]["total_ms"] / len(d["token_ids"]), d["token_ids"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle")
    ap.add_argument("--workload", default=str(ROOT / "configs/workloads/code.jsonl"))
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--drafts", default="model,none")
    ap.add_argument("--out", default="bench/cpp_speed.json")
    args = ap.parse_args()
    tok = Tokenizer(Path(args.bundle), load_manifest(Path(args.bundle)).tokenizer)
    texts = [json.loads(x)["prompt"] for x in Path(args.workload).read_text().splitlines() if x.strip()]
    prompts = [tok.encode(t, chat=True) for t in texts[: args.prompts]]
    pipe = specrt.load(args.bundle, max_batch=1, prefix_cache=False)
    rows = []
    for draft in args.drafts.split(","):
        for i, ids in enumerate(prompts):
            sides = [("python", partial(python_run, pipe, ids, draft, args.max_new_tokens)),
                     ("cpp", partial(cpp_run, args.bundle, ids, draft, args.max_new_tokens))]
            for side, fn in sides if i % 2 == 0 else sides[::-1]:
                ms, out = fn()
                rows.append({"draft": draft, "prompt": i, "side": side, "ms_per_token": ms, "tokens": out})
                print(f"{draft:5s} prompt {i} {side:6s} {ms:.1f} ms/token", flush=True)
    summary = {}
    for draft in args.drafts.split(","):
        med = {s: statistics.median(r["ms_per_token"] for r in rows if r["draft"] == draft and r["side"] == s)
               for s in ("python", "cpp")}
        same = all(a["tokens"] == b["tokens"] for a in rows for b in rows if a["draft"] == b["draft"] == draft
                   and a["prompt"] == b["prompt"] and a["side"] == "python" and b["side"] == "cpp")
        summary[draft] = {**med, "cpp/python": med["cpp"] / med["python"], "same_tokens": same}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
