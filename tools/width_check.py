"""Does a bundle's target compute the same rows whatever the width of the call? (docs/design.md,
"One-token calls of int8-activation graphs"; docs/benchmarks.md §16.)

Per prompt: N greedy positions decoded by one-token calls, then the same positions recomputed by
calls of T tokens (T in --widths) from the same prefix. Prints, per width, the largest logit
difference against the one-token rows and against the first wide width, and argmax flips. The
runtime's own calls are used as they are (no widening: this probes the graph, not the engine).

    python tools/width_check.py engines/coder-q4 --prompts configs/workloads/code.jsonl --limit 3
"""

from __future__ import annotations

import argparse
import json

import numpy as np

import specrt


def _prefill(model, ids: list[int]) -> np.ndarray:
    w = model.max_prefill_t
    starts = list(range(0, len(ids), w))
    if len(ids) - starts[-1] == 1 and len(starts) > 1:  # no one-token last chunk
        starts[-1] -= 1
    for a, b in zip(starts, starts[1:] + [len(ids)], strict=True):
        row = model.run(0, np.array(ids[a:b], dtype=np.int64), a)[-1]
    return row.copy()


def _rows(model, ids: list[int], toks: list[int], width: int) -> np.ndarray:
    """Logits at positions len(ids) - 1 .. len(ids) + len(toks) - 1, the later ones from calls of
    `width` tokens (the last call may start earlier to stay that wide)."""
    out = [_prefill(model, ids)]
    j = 0
    while j < len(toks):
        start = min(j, max(0, len(toks) - width))
        chunk = toks[start : start + width]
        r = model.run(0, np.array(chunk, dtype=np.int64), len(ids) + start)
        out.extend(r[j - start :].copy())
        j = start + len(chunk)
    return np.array(out)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("bundle")
    ap.add_argument("--prompts", default="configs/workloads/code.jsonl")
    ap.add_argument("--limit", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--widths", default="2,3,6,17")
    a = ap.parse_args(argv)
    widths = [int(x) for x in a.widths.split(",")]
    pipe = specrt.load(a.bundle, draft="none", adaptive=False, cost_cache=False, max_batch=1, prefix_cache=False)
    m = pipe.parts.target
    prompts = [json.loads(line)["prompt"] for line in open(a.prompts) if line.strip()][: a.limit]
    report = {w: {"vs_one_token": 0.0, f"vs_T{widths[0]}": 0.0, "flips_vs_one_token": 0} for w in widths}
    for p in prompts:
        ids = pipe.tokenizer.encode(p)
        ones = [_prefill(m, ids)]
        toks = []
        for _ in range(a.tokens - 1):
            toks.append(int(ones[-1].argmax()))
            ones.append(m.run(0, np.array(toks[-1:], dtype=np.int64), len(ids) + len(toks) - 1)[-1].copy())
        ones = np.array(ones)
        first = None
        for w in widths:
            rows = _rows(m, ids, toks, w)
            first = rows if first is None else first
            rep = report[w]
            rep["vs_one_token"] = max(rep["vs_one_token"], float(np.abs(rows[1:] - ones[1:]).max()))
            rep[f"vs_T{widths[0]}"] = max(rep[f"vs_T{widths[0]}"], float(np.abs(rows - first).max()))
            rep["flips_vs_one_token"] += int((rows.argmax(-1) != ones.argmax(-1)).sum())
    pipe.close()
    out = {"bundle": a.bundle, "prompts": len(prompts), "positions": a.tokens, "max_abs_logit_diff": report}
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
