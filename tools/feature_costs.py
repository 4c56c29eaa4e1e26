"""What sampling controls and structured output cost per token, with and without speculation.

    python tools/feature_costs.py --engines engines/default --tokens 96 --repeats 3

One pipeline (one slot, fixed k = the bundle's), arms interleaved per prompt with the order
rotating, every arm warmed up once: target-only and speculative, each plain, with penalties
(frequency 0.5, presence 0.3, a logit bias), with logprobs (top 5), and under a JSON schema
(configs/workloads/json.jsonl asks for JSON the schema describes). Per arm: median ms per token
after the first (decode), acceptance; per pair: speculative / target-only speedup, and each
feature's cost against the plain arm of the same drafting. Grammar mask time is measured inside
the engine (the matcher's own calls, timed). Prints a table and writes JSON (--out).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

import specrt
from specrt.runtime.sampling.grammar import Constraint, Matcher

FEATURES = {
    "plain": {},
    "penalties": {"frequency_penalty": 0.5, "presence_penalty": 0.3, "logit_bias": {28: -5.0}},
    "logprobs": {"logprobs": 5},
}


def timed_masks():
    """Wrap Matcher.masks and Matcher.mask_after (the target's masks and the draft's) so the
    time spent computing grammar masks is counted."""
    spent = [0.0]

    def timed(original):
        def wrapper(self, tokens=()):
            t0 = time.perf_counter()
            try:
                return original(self, tokens)
            finally:
                spent[0] += time.perf_counter() - t0
        return wrapper

    Matcher.masks = timed(Matcher.masks)
    Matcher.mask_after = timed(Matcher.mask_after)
    return spent


def run(engines: Path, workload: Path, json_workload: Path, tokens: int, repeats: int) -> dict:
    pipe = specrt.load(engines, max_batch=1, adaptive=False, global_pool=True, prefix_cache=False)
    spent = timed_masks()
    chat = [json.loads(line)["prompt"] for line in workload.read_text().splitlines() if line.strip()][:4]
    jsonp = [json.loads(line) for line in json_workload.read_text().splitlines() if line.strip()]
    arms = [(f"{d}/{f}", d, kw, chat) for d in ("none", "model") for f, kw in FEATURES.items()]
    arms += [(f"{d}/json", d, "json", jsonp) for d in ("none", "model")]
    rows: dict[str, list] = {a[0]: [] for a in arms}
    for rep in range(repeats + 1):  # the first pass warms up
        order = arms[rep % len(arms):] + arms[: rep % len(arms)]
        for p in range(4):
            for name, draft, kw, prompts in order:
                item = prompts[p % len(prompts)]
                if kw == "json":
                    kw_ = {"grammar": Constraint.json_schema(item["schema"])}
                    prompt = item["prompt"]
                else:
                    kw_, prompt = kw, item
                spent[0] = 0.0
                res = pipe.generate(prompt, max_new_tokens=tokens, draft=draft, ignore_eos=kw != "json", **kw_)
                st = res.stats
                if rep and st.new_tokens > 1:
                    rows[name].append({"tpot_ms": st.tpot_ms, "tokens": st.new_tokens, "accept": st.acceptance_rate,
                                       "mask_ms_per_token": 1000 * spent[0] / st.new_tokens})
    pipe.close()
    out = {}
    for name, rs in rows.items():
        out[name] = {"tpot_ms": float(np.median([r["tpot_ms"] for r in rs])),
                     "tokens": float(np.mean([r["tokens"] for r in rs])),
                     "acceptance": float(np.mean([r["accept"] for r in rs])),
                     "mask_ms_per_token": float(np.median([r["mask_ms_per_token"] for r in rs])), "n": len(rs)}
    for f in (*FEATURES, "json"):
        out[f"model/{f}"]["speedup"] = out[f"none/{f}"]["tpot_ms"] / out[f"model/{f}"]["tpot_ms"]
        for d in ("none", "model"):
            out[f"{d}/{f}"]["cost_vs_plain"] = out[f"{d}/{f}"]["tpot_ms"] / out[f"{d}/plain"]["tpot_ms"]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engines", default="engines/default")
    ap.add_argument("--workload", default="configs/workloads/chat.jsonl")
    ap.add_argument("--json-workload", default="configs/workloads/json.jsonl")
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="bench/feature_costs.json")
    a = ap.parse_args()
    res = run(Path(a.engines), Path(a.workload), Path(a.json_workload), a.tokens, a.repeats)
    print(f"{'arm':<18} {'ms/token':>9} {'vs plain':>9} {'speedup':>8} {'accept':>7} {'mask ms/tok':>11} {'tokens':>7}")
    for name, r in res.items():
        print(f"{name:<18} {r['tpot_ms']:>9.2f} {r['cost_vs_plain']:>9.3f} {r.get('speedup', float('nan')):>8.2f} "
              f"{r['acceptance']:>7.2f} {r['mask_ms_per_token']:>11.3f} {r['tokens']:>7.0f}")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
