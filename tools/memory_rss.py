"""RSS at load against runtime/bundle/memory.py's prediction, one fresh process per (slots, context),
and a soak: RSS before and after many requests through one loaded Pipeline.

    python tools/memory_rss.py table --slots 1,4,16 --seq 2048,512      # markdown rows
    python tools/memory_rss.py soak --slots 4 --requests 200

Numbers go to docs/benchmarks.md ("Memory").
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

BUNDLE = "engines/default"
PROMPTS = ["Explain KV caches in two sentences.", "Write a haiku about the sea.", "Name three planets.",
           "What is 12 times 12?", "Give a tip for writing tests.", "Describe a cat in one line."]


def vm_rss(field: str = "VmRSS") -> int:
    """Resident set (bytes) of this process now (VmHWM: its peak since exec)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def one(bundle: str, slots: int, seq: int) -> dict:
    """Load in this process; RSS before, after load and after one request, and the prediction."""
    import specrt

    base = vm_rss()
    t0 = time.perf_counter()
    pipe = specrt.load(bundle, max_batch=slots, max_seq_len=seq)
    load_s = time.perf_counter() - t0
    loaded = vm_rss()
    peak = vm_rss("VmHWM")
    pipe.generate(PROMPTS[0], max_new_tokens=32)
    after = vm_rss()
    pipe.close()
    plan = pipe.parts.sizing.plan
    return {"slots": slots, "seq": seq, "base": base, "loaded": loaded, "peak": peak, "after_request": after,
            "predicted": plan.steady(slots, seq), "predicted_peak": plan.peak(slots, seq), "load_s": load_s}


def fresh(bundle: str, slots: int, seq: int) -> dict:
    """`one` in a process of its own: what a load adds is measured over a bare interpreter, not
    over whatever the calling process already holds (or frees meanwhile)."""
    out = subprocess.run([sys.executable, __file__, "one", "--bundle", bundle, "--slots", str(slots), "--seq", str(seq)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def table(bundle: str, slots: list[int], seqs: list[int]) -> None:
    print("| slots | context | predicted (GB) | RSS after load (GB) | predicted / RSS | peak RSS (GB) | "
          "predicted peak (GB) | RSS after a request (GB) |")
    print("|---|---|---|---|---|---|---|---|")
    for seq in seqs:
        for n in slots:
            r = fresh(bundle, n, seq)
            # the prediction counts what the load adds: compare with RSS above the interpreter's own
            added = r["loaded"] - r["base"]
            print(f"| {n} | {seq} | {r['predicted'] / 1e9:.2f} | {added / 1e9:.2f} | {r['predicted'] / added:.3f} | "
                  f"{(r['peak'] - r['base']) / 1e9:.2f} | {r['predicted_peak'] / 1e9:.2f} | "
                  f"{(r['after_request'] - r['base']) / 1e9:.2f} |", flush=True)


def soak(bundle: str, slots: int, requests: int) -> None:
    """`requests` requests, `slots` at a time (threads), through one Pipeline; RSS after the
    first round and at the end."""
    from concurrent.futures import ThreadPoolExecutor

    import specrt

    pipe = specrt.load(bundle, max_batch=slots)
    work = [PROMPTS[i % len(PROMPTS)] for i in range(requests)]

    def run(p):
        return pipe.generate(p, max_new_tokens=64, adaptive=True).stats.new_tokens

    with ThreadPoolExecutor(slots) as ex:
        tokens = sum(ex.map(run, work[:slots]))
        first = vm_rss()
        t0 = time.perf_counter()
        tokens += sum(ex.map(run, work[slots:]))
    end = vm_rss()
    pipe.close()
    print(f"{requests} requests ({tokens} tokens, {time.perf_counter() - t0:.0f} s) at {slots} slots: RSS after the "
          f"first {slots} {first / 1e9:.3f} GB, at the end {end / 1e9:.3f} GB ({(end - first) / 2**20:+.1f} MiB)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["table", "one", "soak"])
    ap.add_argument("--bundle", default=BUNDLE)
    ap.add_argument("--slots", default="1,4,16")
    ap.add_argument("--seq", default="2048,512")
    ap.add_argument("--requests", type=int, default=200)
    a = ap.parse_args()
    slots, seqs = [int(x) for x in a.slots.split(",")], [int(x) for x in a.seq.split(",")]
    if a.mode == "one":
        print(json.dumps(one(a.bundle, slots[0], seqs[0])))
    elif a.mode == "table":
        table(a.bundle, slots, seqs)
    else:
        soak(a.bundle, slots[0], a.requests)


if __name__ == "__main__":
    main()
